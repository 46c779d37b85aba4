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
from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.capability import _internals, _persistence
from pydantic_ai_steps.capability._operations import StoreOperations
from pydantic_ai_steps.capability._writers import OperationSink
from pydantic_ai_steps.media import DiskMediaStore
from pydantic_ai_steps.step_persistence import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepStore

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


class _WholeHistoriesOnly:
    """A step store without `write_snapshot_delta`: the engine path sends it every history whole."""

    def __init__(self, store: InMemoryStepStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == 'write_snapshot_delta':
            raise AttributeError(name)
        return getattr(self._store, name)


@pytest.mark.parametrize('kind', ['delta store', 'delta store with media', 'whole histories'])
async def test_a_caller_value_spelled_like_a_media_marker_reads_back_as_it_was_on_the_engine_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The engine path's encoder runs in workflow code, with no media store; a tool result holding
    a reserved key reaches the store as the tool returned it, and reads back so."""
    take_engine_path(monkeypatch)
    inner = InMemoryStepStore(media_store=DiskMediaStore(tmp_path / 'media') if kind.endswith('media') else None)
    store: StepStore = inner if kind.startswith('delta') else _WholeHistoriesOnly(inner)  # type: ignore[assignment]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('lookup', {}, tool_call_id='call-0')])
        return ModelResponse(parts=[TextPart('done')])

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        return {'__harness_external_media__': True, 'uri': 'media+sha256://' + '0' * 64, 'n': 1}

    result = await agent.run('go')
    runs = await inner.list_runs()
    snapshot = await inner.latest_snapshot(run_id=runs[0].run_id)
    assert snapshot is not None
    assert ModelMessagesTypeAdapter.dump_json(snapshot.messages) == ModelMessagesTypeAdapter.dump_json(
        result.all_messages()
    )


@pytest.mark.parametrize('with_media', [False, True])
async def test_deltas_from_an_encoder_without_media_read_back_with_marker_like_values_anywhere(
    tmp_path: Path, with_media: bool
) -> None:
    """The engine path's encoder sends full texts as serialized (the store wraps what it must) and
    patches with such values already wrapped (the store keeps a patch as given)."""
    from pydantic_ai_steps.store.message_log import DEFAULT_MEDIA_THRESHOLD, MessageLog
    from pydantic_ai_steps.store.patch import is_patch
    from pydantic_ai_steps.store.protocol import SnapshotDelta

    store = InMemoryStepStore(media_store=DiskMediaStore(tmp_path / 'media') if with_media else None)
    await store.register_run(RunRecord(run_id='r'))
    encoder = MessageLog(None, DEFAULT_MEDIA_THRESHOLD, serialized_full_texts=True)
    marker_like = {'__harness_external_media__': True, 'n': 1}
    plain = ModelRequest(parts=[UserPromptPart('go ' * 200)])
    holding = ModelRequest(parts=[ToolReturnPart('t', marker_like, tool_call_id='c')])
    messages: list[ModelMessage] = [plain]
    for step, change in enumerate(['first', 'stamp', 'holding', 'stamp again']):
        if change == 'stamp':
            plain.metadata = {'caller': marker_like}  # new fields after the parts: a patch of a verbatim base
        elif change == 'holding':
            messages.append(holding)
        elif change == 'stamp again':
            holding.metadata = {'k': 'v'}
        prepared = await encoder.prepare(ContinuableSnapshot(run_id='r', step_index=step, messages=list(messages)))
        if change == 'stamp':
            ((_, patch),) = prepared.appends
            assert is_patch(patch) and '__harness_external_literal__' in patch
        outcome = await store.write_snapshot_delta(
            SnapshotDelta(
                run_id='r',
                step_index=step,
                message_count=prepared.message_count,
                appends=prepared.appends,
                expected_log_size=prepared.known_log_size,
            )
        )
        assert outcome.log_size is not None
        encoder.committed(prepared, outcome.log_size, frozenset(outcome.verbatim))
        loaded = await store.latest_snapshot(run_id='r')
        assert loaded is not None
        assert ModelMessagesTypeAdapter.dump_json(loaded.messages) == ModelMessagesTypeAdapter.dump_json(messages)


class _SingleCallsOnly(_WholeHistoriesOnly):
    """A step store with only the single-record calls (no `write_records`)."""

    def __getattr__(self, name: str) -> Any:
        if name == 'write_records':
            raise AttributeError(name)
        return super().__getattr__(name)


@pytest.mark.parametrize('kind', ['file store', 'single calls'])
async def test_a_registration_retried_after_its_run_was_stored_but_not_its_events_writes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A worker killed between the run record and `run_started` (the File store writes them one after
    the other; a store of single calls in two calls): the engine runs the operation again, which
    finds the run registered under its own registration id and must still write the event."""
    from pydantic_ai_steps.capability._operations import EventNote, RegistrationNote
    from pydantic_ai_steps.step_persistence import FileStepStore
    from pydantic_ai_steps.store.backends.file._backend import FileBackend

    killed: list[str] = []
    store: Any
    if kind == 'file store':
        store = FileStepStore(tmp_path / 'steps')
        original = FileBackend._append_events  # pyright: ignore[reportPrivateUsage]

        def append_events(self: Any, state: Any, rows: Any) -> None:
            if not killed:
                killed.append('events')
                raise ConnectionError('the worker died here')
            original(self, state, rows)

        monkeypatch.setattr(FileBackend, '_append_events', append_events)
    else:
        store = _SingleCallsOnly(InMemoryStepStore())
        original_append = store.append_event

        async def append_event(event: Any) -> None:
            if not killed:
                killed.append('events')
                raise ConnectionError('the worker died here')
            await original_append(event)

        store.append_event = append_event
    persistence = StepPersistence[None](store=store, run_id='r')
    body = inspect.unwrap(StoreOperations._write_records)  # pyright: ignore[reportPrivateUsage]
    started = _internals.utc_now()
    batch: dict[str, Any] = {
        'run_id': 'r',
        'conversation_id': None,
        'parent_run_id': None,
        'agent_name': None,
        'metadata': {},
        'registration': RegistrationNote(registration_id='registration-1', started_at=started),
        'events': [EventNote(kind='run_started', step_index=0, event_index=0, timestamp=started)],
    }
    with pytest.raises(ConnectionError):
        await body(persistence, **batch)
    assert (await store.get_run(run_id='r')) is not None and await store.list_events(run_id='r') == []
    assert (await body(persistence, **batch)).run_id == 'r'
    assert [event.kind for event in await store.list_events(run_id='r')] == ['run_started']
    assert (await body(persistence, **batch)).run_id == 'r'  # and once only
    assert [event.kind for event in await store.list_events(run_id='r')] == ['run_started']


async def test_parallel_tool_calls_key_their_events_alike_whichever_ends_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DBOS the calls run in workflow code, and a recovery (their steps answered from the
    journal) may end them in another order than the first execution did. A boundary write the
    recovery runs again (it committed, but DBOS never recorded it) must carry the same event keys,
    or the store gets every closing event twice."""
    import anyio

    from pydantic_ai_steps.capability._operations import event_record

    batches = take_engine_path(monkeypatch)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart('work', {'who': 'a'}, tool_call_id='a'),
                    ToolCallPart('work', {'who': 'b'}, tool_call_id='b'),
                ]
            )
        return ModelResponse(parts=[TextPart('done')])

    def build(slow: str) -> Agent[None, str]:
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=InMemoryStepStore(), run_id='r')])

        @agent.tool_plain
        async def work(who: str) -> str:  # pyright: ignore[reportUnusedFunction]
            await anyio.sleep(0.05 if who == slow else 0)
            return who

        return agent

    keys: list[list[str]] = []
    for slow in ('a', 'b'):
        agent = build(slow)
        batches.clear()
        assert (await agent.run('go')).output == 'done'
        notes = [note for batch in batches for note in batch.get('events') or ()]
        keys.append(sorted(event_record(note, 'r', None, None, None, {}).idempotency_key or '' for note in notes))
    assert keys[0] == keys[1]
