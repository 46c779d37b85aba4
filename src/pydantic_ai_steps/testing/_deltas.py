"""Conformance: snapshots written as deltas of the run's message log (`DeltaSnapshotStore`).

The writer (the capability, in workflow code under a durability engine) decides which positions
are new or changed and sends their texts; the store stores them, moving media out, and reports
which full texts it stored as given. These tests drive that API the way the capability does.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)

from .._errors import InvalidRecordError
from .._records import StepEvent
from ..store.history import message_to_json
from ..store.patch import make_patch
from ..store.protocol import DeltaSnapshotStore, SnapshotDelta, StepStore
from ._support import T0, all_snapshots, dump, new_run, tool_cycle


def delta_store(store: StepStore) -> DeltaSnapshotStore:
    if not isinstance(store, DeltaSnapshotStore):
        pytest.skip('this store does not offer write_snapshot_delta')
    return store


def full(messages: list[ModelMessage], positions: range | list[int] | None = None) -> list[tuple[int, str]]:
    chosen = range(len(messages)) if positions is None else positions
    return [(position, message_to_json(messages[position])) for position in chosen]


def delta(run_id: str, messages: list[ModelMessage], appends: list[tuple[int, str]], **fields: object) -> SnapshotDelta:
    fields.setdefault('step_index', 1)
    fields.setdefault('timestamp', T0)
    fields.setdefault('expected_log_size', None)
    return SnapshotDelta(run_id=run_id, message_count=len(messages), appends=appends, **fields)  # pyright: ignore[reportArgumentType]


class DeltaConformance:
    @pytest.mark.anyio
    async def test_deltas_with_a_patch_read_back_as_the_whole_histories(self, store: StepStore) -> None:
        """New positions in full, a re-stamped one as a patch of its verbatim text: both snapshots read whole."""
        writer = delta_store(store)
        run_id = await new_run(store)
        history = tool_cycle()
        first = full(history)
        outcome = await writer.write_snapshot_delta(delta(run_id, history, first, idempotency_key='0:1:complete'))
        assert outcome.log_size == 3
        assert outcome.verbatim == (0, 1, 2)
        before = dump(history)
        pending = history[-1]
        assert isinstance(pending, ModelRequest)
        pending.timestamp = T0 + timedelta(minutes=5)
        pending.instructions = 'answer in one line ' * 8
        history.append(ModelResponse(parts=[TextPart('done')], timestamp=T0))
        patch = make_patch(2, first[2][1], message_to_json(pending))
        assert patch is not None
        second = [(2, patch), *full(history, [3])]
        event = StepEvent(run_id=run_id, kind='run_completed', step_index=2, timestamp=T0, idempotency_key='e')
        outcome = await writer.write_snapshot_delta(
            delta(run_id, history, second, step_index=2, expected_log_size=3, idempotency_key='1:2:complete'),
            events=[event],
        )
        assert outcome.log_size == 5
        assert outcome.verbatim == (1,)  # the patch is not a full text
        saved = await all_snapshots(store, run_id)
        assert [dump(item.messages) for item in saved] == [before, dump(history)]
        assert [item.kind for item in await store.list_events(run_id=run_id)] == ['run_completed']

    @pytest.mark.anyio
    async def test_a_value_spelled_like_a_media_marker_reads_back_as_written(self, store: StepStore) -> None:
        """A full text holds messages as they serialize: a caller's value that looks like a media
        marker is the caller's, and is stored so that it reads back as such."""
        writer = delta_store(store)
        run_id = await new_run(store)
        marker_like = {'__harness_external_media__': True, 'uri': 'media+sha256://' + '0' * 64, 'n': 1}
        history: list[ModelMessage] = [ModelRequest(parts=[ToolReturnPart('t', marker_like, tool_call_id='c')])]
        outcome = await writer.write_snapshot_delta(delta(run_id, history, full(history), idempotency_key='m'))
        assert outcome.log_size == 1
        (saved,) = await all_snapshots(store, run_id)
        assert dump(saved.messages) == dump(history)

    @pytest.mark.anyio
    async def test_a_stale_delta_writes_nothing(self, store: StepStore) -> None:
        writer = delta_store(store)
        run_id = await new_run(store)
        history = tool_cycle()
        await writer.write_snapshot_delta(delta(run_id, history, full(history), idempotency_key='a'))
        history.append(ModelResponse(parts=[TextPart('done')], timestamp=T0))
        event = StepEvent(run_id=run_id, kind='model_request_started', step_index=2, timestamp=T0)
        stale = delta(run_id, history, full(history, [3]), step_index=2, expected_log_size=2, idempotency_key='b')
        outcome = await writer.write_snapshot_delta(stale, events=[event])
        assert outcome.log_size is None
        assert [item.step_index for item in await all_snapshots(store, run_id)] == [1]
        assert await store.list_events(run_id=run_id) == []
        # The writer then sends the whole history, expecting nothing of the log.
        outcome = await writer.write_snapshot_delta(delta(run_id, history, full(history), idempotency_key='b'))
        assert outcome.log_size == 7
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history)

    @pytest.mark.anyio
    async def test_a_retried_delta_is_written_once_and_answers_the_same_log_size(self, store: StepStore) -> None:
        """A durable operation that committed but was not journaled runs again with the same arguments."""
        writer = delta_store(store)
        run_id = await new_run(store)
        history = tool_cycle()
        first = delta(run_id, history, full(history), idempotency_key='0:1:complete')
        event = StepEvent(run_id=run_id, kind='tool_call_completed', step_index=1, timestamp=T0, idempotency_key='k')
        answers = [await writer.write_snapshot_delta(first, events=[event]) for _ in range(2)]
        assert answers[0] == answers[1], answers
        history.append(ModelResponse(parts=[TextPart('done')], timestamp=T0))
        second = delta(run_id, history, full(history, [3]), step_index=2, expected_log_size=3, idempotency_key='1')
        answers = [await writer.write_snapshot_delta(second) for _ in range(2)]
        assert answers[0] == answers[1], answers
        assert answers[0].log_size == 4
        assert len(await all_snapshots(store, run_id)) == 2
        assert len(await store.list_events(run_id=run_id)) == 1

    @pytest.mark.anyio
    async def test_media_in_a_delta_goes_to_the_media_store_and_reads_back(self, store: StepStore) -> None:
        writer = delta_store(store)
        if getattr(writer, 'media_store', None) is None:
            pytest.skip('this store keeps media inline')
        run_id = await new_run(store)
        image = BinaryContent(bytes(range(256)) * 400, media_type='image/png')
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(['look', image], timestamp=T0)], timestamp=T0)
        ]
        text = message_to_json(history[0])
        outcome = await writer.write_snapshot_delta(delta(run_id, history, [(0, text)], idempotency_key='m'))
        assert outcome.verbatim == ()  # stored with a reference instead of its payload: no patch base
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history)

    @pytest.mark.anyio
    async def test_a_bad_delta_is_refused_before_anything_is_written(self, store: StepStore) -> None:
        writer = delta_store(store)
        run_id = await new_run(store)
        history = tool_cycle()
        bad_position = delta(run_id, history, [(3, message_to_json(history[0]))])
        with pytest.raises(InvalidRecordError, match='positions'):
            await writer.write_snapshot_delta(bad_position)
        not_json = delta(run_id, history, [(0, 'plain words')])
        with pytest.raises(InvalidRecordError, match='JSON object'):
            await writer.write_snapshot_delta(not_json)
        with pytest.raises(InvalidRecordError, match='expected_log_size'):
            await writer.write_snapshot_delta(delta(run_id, history, full(history), expected_log_size=-1))
        assert await all_snapshots(store, run_id) == []
