"""A backend that limits one log text (`max_text_bytes`): the kernel moves payloads out, or says what is too big."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart

from pydantic_ai_steps._errors import RecordTooLargeError
from pydantic_ai_steps.media import DiskMediaStore
from pydantic_ai_steps.step_persistence import InMemoryStepStore, RunRecord
from pydantic_ai_steps.store.history import message_to_json
from pydantic_ai_steps.store.protocol import SnapshotDelta
from pydantic_ai_steps.testing.step_store import T0, dump, snapshot

pytestmark = pytest.mark.anyio
LIMIT = 20_000


def limited(media: DiskMediaStore | None) -> InMemoryStepStore:
    store = InMemoryStepStore(media_store=media)
    store._log.max_text_bytes = LIMIT  # pyright: ignore[reportPrivateUsage]  # as a backend declaring it would
    return store


def many_small_parts(count: int, size: int) -> list[ModelMessage]:
    """One request whose parts are each far below the media threshold, together far above the limit."""
    parts = [UserPromptPart(f'{index:04d}' + 'x' * size, timestamp=T0) for index in range(count)]
    return [ModelRequest(parts=parts, timestamp=T0), ModelResponse(parts=[TextPart('ok')], timestamp=T0)]


async def test_a_long_message_moves_payloads_below_the_threshold_to_the_media_store(tmp_path: Path) -> None:
    store = limited(DiskMediaStore(tmp_path / 'media'))
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    history = many_small_parts(count=20, size=3000)  # 60 KB of 3 KB parts: all below the 64 KiB threshold
    await store.save_snapshot(snapshot('r', history))
    log = await store.backend.fetch_log('r', below_index=99, positions_below=99)
    assert all(len(entry.text.encode()) <= LIMIT for entry in log.entries)
    assert any('media+sha256://' in entry.text for entry in log.entries)
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)


async def test_a_message_that_cannot_fit_names_itself_its_size_and_the_limit(tmp_path: Path) -> None:
    store = limited(DiskMediaStore(tmp_path / 'media'))
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    call = ToolCallPart('lookup', {'q': 'y' * 30_000}, tool_call_id='c1')  # arguments are not a payload
    with pytest.raises(
        RecordTooLargeError, match=rf"message 0 of the snapshot of run 'r' at step 1 is \d+ bytes.*{LIMIT}"
    ):
        await store.save_snapshot(snapshot('r', [ModelResponse(parts=[call], timestamp=T0)]))
    assert await store.latest_snapshot(run_id='r') is None


async def test_without_a_media_store_the_error_says_so() -> None:
    store = limited(None)
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    with pytest.raises(RecordTooLargeError, match='no media store'):
        await store.save_snapshot(snapshot('r', many_small_parts(count=20, size=3000)))
    assert await store.latest_snapshot(run_id='r') is None


async def test_a_long_message_in_a_snapshot_delta_moves_payloads_out_as_a_whole_snapshot_does(tmp_path: Path) -> None:
    """Under a durability engine snapshots arrive as deltas of full texts: one longer than the
    backend holds is fitted the same way, or refused naming itself."""
    store = limited(DiskMediaStore(tmp_path / 'media'))
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    history = many_small_parts(count=20, size=3000)
    texts = [message_to_json(message) for message in history]
    delta = SnapshotDelta(
        run_id='r', step_index=1, message_count=2, appends=list(enumerate(texts)), expected_log_size=None, timestamp=T0
    )
    outcome = await store.write_snapshot_delta(delta)
    assert outcome.log_size == 2 and outcome.verbatim == (1,)
    log = await store.backend.fetch_log('r', below_index=99, positions_below=99)
    assert all(len(entry.text.encode()) <= LIMIT for entry in log.entries)
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)
    call = ModelResponse(parts=[ToolCallPart('lookup', {'q': 'y' * 30_000}, tool_call_id='c1')], timestamp=T0)
    too_long = SnapshotDelta(
        run_id='r', step_index=2, message_count=3, appends=[(2, message_to_json(call))], expected_log_size=2
    )
    with pytest.raises(RecordTooLargeError, match=r"message appended at offset 0 .* of run 'r' at step 2 is \d+ bytes"):
        await store.write_snapshot_delta(too_long)
