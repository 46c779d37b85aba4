"""A snapshot write answered `STALE`: redone once in full; a backend that says so again is an error, never a loss."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from pydantic_ai_steps.step_persistence import InMemoryStepStore, RunRecord, StepEvent
from pydantic_ai_steps.store.backend import STALE, SnapshotWrite, WriteBatch
from pydantic_ai_steps.testing.step_store import T0, snapshot

pytestmark = pytest.mark.anyio
ANSWER = ModelResponse(parts=[TextPart('ok')], timestamp=T0)


def stale_answers(store: InMemoryStepStore, count: int) -> list[SnapshotWrite]:
    """Make the store's backend answer the next `count` snapshot commits `STALE` without writing them."""
    backend: Any = store.backend
    commit = backend.commit
    seen: list[SnapshotWrite] = []

    async def answering(batch: WriteBatch) -> Any:
        if batch.snapshot is not None and len(seen) < count:
            seen.append(batch.snapshot)
            return STALE
        return await commit(batch)

    backend.commit = answering
    return seen


async def test_a_stale_write_is_prepared_again_in_full_and_lands() -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi', timestamp=T0)], timestamp=T0)]
    await store.save_snapshot(snapshot('r', history))
    seen = stale_answers(store, 1)
    event = StepEvent(run_id='r', kind='tool_call_started', step_index=1, idempotency_key='e1')
    await store.write_records(
        snapshot=snapshot('r', [*history, ANSWER], step_index=2),
        events=[event],
    )
    assert seen[0].expected_log_size == 1  # the first try expected the log where this process left it
    assert [e.idempotency_key for e in await store.list_events(run_id='r')] == ['e1']
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 2


async def test_a_second_stale_answer_raises_and_stores_nothing_of_the_batch() -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi', timestamp=T0)], timestamp=T0)]
    await store.save_snapshot(snapshot('r', history))
    stale_answers(store, 2)
    event = StepEvent(run_id='r', kind='tool_call_started', step_index=1, idempotency_key='e1')
    with pytest.raises(RuntimeError, match="answered stale to a snapshot of run 'r'"):
        await store.write_records(
            snapshot=snapshot('r', [*history, ANSWER], step_index=2),
            events=[event],
        )
    assert await store.list_events(run_id='r') == []
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1
