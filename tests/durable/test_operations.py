"""The capability's engine path, in this process and without an engine: quick checks of what the
DBOS and Temporal tests prove with real workers.

`write_records` runs inline here (nothing dispatches it), so these tests see exactly the batches an
engine would journal: their number per tool cycle, that the records equal the plain path's, what a
stale message log does, and that an agent under a durability capability but outside its workflow
writes as a plain one does.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.usage import UsageLimits

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.capability import _internals, _persistence
from pydantic_ai_steps.capability._operations import StoreOperations
from pydantic_ai_steps.capability._writers import OperationSink
from pydantic_ai_steps.step_persistence import ContinuableSnapshot, InMemoryStepStore, RunRecord

from . import agents, support

pytestmark = pytest.mark.anyio


def take_engine_path(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Make every run from now on take the engine path (`write_records` operations); log each batch."""
    batches: list[dict[str, Any]] = []
    monkeypatch.setattr(_persistence, 'engine_free', lambda ctx, capability_id: False)
    monkeypatch.setattr(_persistence, 'journaling', lambda ctx: True)

    async def batched(ctx: Any, capability_id: str | None) -> bool:
        return True

    monkeypatch.setattr(_persistence, 'records_batched', batched)
    body = inspect.unwrap(StoreOperations._write_records)  # pyright: ignore[reportPrivateUsage]

    async def logged(self: Any, **batch: Any) -> Any:
        batches.append(batch)
        return await body(self, **batch)

    async def operation(self: Any, **batch: Any) -> Any:  # pragma: no cover - never called: unwrapped
        raise AssertionError('the capability calls the undecorated body when nothing dispatches')

    # Without an engine the capability calls the operation's undecorated body (`inspect.unwrap`).
    operation.__wrapped__ = logged  # pyright: ignore[reportFunctionMemberAccess]
    monkeypatch.setattr(StoreOperations, '_write_records', operation)
    return batches


async def test_the_engine_path_records_what_the_plain_path_records_in_two_operations_per_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'engine_agent')
    engine_path = take_engine_path(monkeypatch)
    (tmp_path / 'engine').mkdir()
    store = agents.open_store(tmp_path / 'engine')
    agent = agents.build('engine_agent', store, None)
    await agent.run(f'cycles={support.CYCLES}', usage_limits=UsageLimits(request_limit=None))
    await store.aclose()
    batches = list(engine_path)
    await support.check_one_clean_run(tmp_path / 'engine', expected, 'engine_agent')
    shapes = [
        ('registration' if batch.get('registration') else 'snapshot' if batch.get('snapshot') else 'ledger')
        for batch in batches
    ]
    # Registration, then per cycle: the `started` entry (the run's input snapshot with the first),
    # the boundary; the final boundary goes with `run_completed`.
    assert shapes == ['registration', 'snapshot', 'snapshot', 'ledger', 'snapshot', 'ledger', 'snapshot', 'snapshot']
    # Each boundary carries what is new: the tool's return and the next response in full, the
    # request pydantic-ai re-stamped as a patch; never the whole history.
    boundaries = [batch['snapshot'] for batch in batches if batch.get('snapshot')][1:]
    for snapshot in boundaries[1:-1]:
        assert len(snapshot.appends) == 3 < snapshot.message_count
        assert snapshot.appends[0][1].startswith('{"$patch":')


async def test_a_stale_message_log_makes_the_next_snapshot_go_whole() -> None:
    """Another writer extended the run's log: the store refuses the delta, the history goes whole."""
    store = InMemoryStepStore()
    persistence = StepPersistence[None](store=store, run_id='r')
    await store.register_run(RunRecord(run_id='r'))
    ctx: Any = SimpleNamespace(root_capability=None, conversation_id=None, _durable_operations=None)
    sink = OperationSink(persistence, ctx, store)
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]

    def fields(step: int) -> dict[str, Any]:
        return {
            'step_index': step,
            'messages': list(history),
            'state': 'complete',
            'snapshot_index': step,
            'timestamp': _internals.utc_now(),
        }

    await sink.write(ctx, fields(1), [], [])
    other = [ModelRequest(parts=[UserPromptPart('someone else')]), ModelResponse(parts=[TextPart('!')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=9, messages=other))
    history.append(ModelResponse(parts=[TextPart('hello')]))
    await sink.write(ctx, fields(2), [], [])
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 2
    assert support.history_shape(latest.messages) == support.history_shape(history)


async def test_a_run_in_workflow_code_that_nothing_journals_is_refused_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_persistence, 'workflow_engine', lambda: _internals.DBOS_ENGINE)
    store = InMemoryStepStore()
    agent = agents.build('refused', store, None)  # pyright: ignore[reportArgumentType]
    with pytest.raises(UserError, match='DBOSAgent') as refused:
        await agent.run('cycles=1')
    assert 'DBOSDurability' in str(refused.value) and 'second copy' in str(refused.value)
    assert await store.list_runs() == []


@pytest.mark.parametrize('engine', ['dbos', 'temporal'])
async def test_outside_its_workflow_an_agent_under_an_engine_writes_as_a_plain_one(tmp_path: Path, engine: str) -> None:
    """The engine runs dispatched operations inline there, so the capability batches straight to the store."""
    if engine == 'dbos':
        durability: Any = pytest.importorskip('pydantic_ai.durable_exec.dbos').DBOSDurability()
    else:
        durability = pytest.importorskip('pydantic_ai.durable_exec.temporal').TemporalDurability()
    writes: dict[str, list[str]] = {}
    for name, capability in (('plain', None), ('durable', durability)):
        (tmp_path / name).mkdir()
        store = agents.open_store(tmp_path / name)
        original = store.write_records
        log = writes.setdefault(name, [])

        async def counted(*, original: Any = original, log: list[str] = log, **records: Any) -> None:
            log.append(','.join(sorted(key for key, value in records.items() if value)))
            await original(**records)

        store.write_records = counted  # pyright: ignore[reportAttributeAccessIssue]
        agent = agents.build(f'outside_{engine}', store, capability)
        assert (await agent.run('cycles=2')).output == 'finished'
        await store.aclose()
    assert writes['durable'] == writes['plain']
