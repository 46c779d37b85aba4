"""StepPersistence driven by real agents (FunctionModel): every seed example and decided difference."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.capability import _internals as capability_module
from pydantic_ai_steps.capability._writers import ImmediateWriter
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    InMemoryStepStore,
    InvalidRecordError,
    RunAlreadyExistsError,
    RunRecord,
    SnapshotSaved,
    StepEvent,
    ToolEffectRecord,
    annotate_tool_effect,
    continue_run,
    fork_run,
    is_provider_valid,
)
from pydantic_ai_steps.step_persistence.recovery import inspect_recovery

from .agents import call, scripted

pytestmark = pytest.mark.anyio


def kinds(events: list[StepEvent]) -> list[tuple[str, int]]:
    return [(event.kind, event.step_index) for event in events]


def shape(snapshots: list[ContinuableSnapshot]) -> list[tuple[int, str, list[str]]]:
    return [
        (s.step_index, s.state, [type(part).__name__ for message in s.messages for part in message.parts])
        for s in snapshots
    ]


def librarian(store: InMemoryStepStore, *turns: Any, **options: Any) -> Agent[None, str]:
    agent = Agent(scripted(*turns), capabilities=[StepPersistence(store=store, agent_name='code_librarian', **options)])

    @agent.tool_plain
    def read_file(path: str) -> str:
        return f'contents of {path}'

    return agent


async def only_run(store: InMemoryStepStore) -> RunRecord:
    (record,) = await store.list_runs()
    return record


async def test_quick_start_records_events_and_snapshots() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'found it')
    result = await agent.run('Find ThinkingPartDelta')
    record = await only_run(store)
    assert re.fullmatch(r'code_librarian-[0-9a-f]{8}', record.run_id)
    assert record.agent_name == 'code_librarian' and record.registration_id
    assert record.conversation_id == result.conversation_id
    assert kinds(await store.list_events(run_id=record.run_id)) == [
        ('run_started', 0),
        ('model_request_started', 1),
        ('model_request_completed', 1),
        ('tool_call_started', 1),
        ('tool_call_completed', 1),
        ('model_request_started', 2),
        ('model_request_completed', 2),
        ('run_completed', 0),
    ]
    snapshots = await store.list_snapshots(run_id=record.run_id)
    assert shape(snapshots) == [
        (1, 'complete', ['UserPromptPart']),  # the run's input: saved before its first tool ran
        (1, 'complete', ['UserPromptPart', 'ToolCallPart', 'ToolReturnPart']),
        (2, 'complete', ['UserPromptPart', 'ToolCallPart', 'ToolReturnPart', 'TextPart']),
    ]
    latest = snapshots[-1]
    assert latest.conversation_id == result.conversation_id
    assert [m.parts for m in latest.messages] == [m.parts for m in result.all_messages()]


async def test_reused_capability_gets_a_fresh_derived_id_per_run() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, 'hello')
    for _ in range(3):
        await agent.run('hi')
    ids = [record.run_id for record in await store.list_runs()]
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r'code_librarian-[0-9a-f]{8}', run_id) for run_id in ids)


async def test_without_agent_name_the_run_id_is_pydantic_ais() -> None:
    store = InMemoryStepStore()
    agent = Agent(scripted('hello'), capabilities=[StepPersistence(store=store)])
    result = await agent.run('hi')
    record = await only_run(store)
    assert record.run_id == result.run_id
    assert record.agent_name == agent.name


async def test_derived_id_clash_draws_again_and_children_see_the_new_id(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='orchestrator-00000000'))
    from pydantic_ai_steps.capability import _persistence

    original = _persistence.derive_run_id

    def clashing(agent_name: str | None, source: str | None, *, attempt: int) -> str:
        if agent_name == 'orchestrator' and attempt == 0:
            return 'orchestrator-00000000'
        return original(agent_name, source, attempt=attempt)

    monkeypatch.setattr(_persistence, 'derive_run_id', clashing)
    child = librarian(store, 'child answer')
    orchestrator = Agent(
        scripted([call('ask', 'c1', question='q')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def ask(question: str) -> str:
        return (await child.run(question)).output

    await orchestrator.run('go', conversation_id='orch-conv')
    (orch,) = await store.list_runs(conversation_id='orch-conv')
    assert orch.run_id != 'orchestrator-00000000' and orch.run_id.startswith('orchestrator-')
    (delegate,) = await store.list_runs(parent_run_id=orch.run_id)
    assert delegate.agent_name == 'code_librarian'


async def test_explicit_run_id_is_single_shot() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, 'hello', run_id='libr-1')
    await agent.run('first')
    events_before = await store.list_events(run_id='libr-1')
    snapshots_before = await store.list_snapshots(run_id='libr-1')
    with pytest.raises(ValueError, match="'libr-1' is already in the store") as raised:
        await agent.run('second')
    assert isinstance(raised.value, RunAlreadyExistsError)
    assert await store.list_events(run_id='libr-1') == events_before
    assert await store.list_snapshots(run_id='libr-1') == snapshots_before  # the input and the final history
    assert len(snapshots_before) == 2


async def test_orchestrator_turns_group_by_conversation() -> None:
    store = InMemoryStepStore()
    orchestrator = Agent(scripted('ok'), capabilities=[StepPersistence(store=store, agent_name='orchestrator')])
    for turn in ('one', 'two', 'three'):
        await orchestrator.run(turn, conversation_id='orch-conv')
    turns = await store.list_runs(conversation_id='orch-conv')
    assert len({r.run_id for r in turns}) == 3
    assert [r.started_at for r in turns] == sorted(r.started_at for r in turns)
    first = await store.latest_snapshot(run_id=turns[0].run_id)
    assert first is not None and first.conversation_id == 'orch-conv'


async def test_delegate_parent_is_filled_automatically_and_overridable() -> None:
    store = InMemoryStepStore()
    auto = librarian(store, 'auto answer')
    pinned = Agent(
        scripted('pinned answer'),
        capabilities=[StepPersistence(store=store, agent_name='pinned', parent_run_id='elsewhere-1')],
    )
    orchestrator = Agent(
        scripted([call('ask_librarian', 'c1', question='where?'), call('ask_pinned', 'c2', question='x')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def ask_librarian(question: str) -> str:
        return (await auto.run(question)).output

    @orchestrator.tool_plain
    async def ask_pinned(question: str) -> str:
        return (await pinned.run(question)).output

    await orchestrator.run('Where is ThinkingPartDelta defined?', conversation_id='orch-conv')
    orch_run_id = (await store.list_runs(conversation_id='orch-conv'))[-1].run_id
    delegates = await store.list_runs(parent_run_id=orch_run_id)
    assert [d.agent_name for d in delegates] == ['code_librarian']
    assert all(e.parent_run_id == orch_run_id for e in await store.list_events(run_id=delegates[0].run_id))
    assert [d.agent_name for d in await store.list_runs(parent_run_id='elsewhere-1')] == ['pinned']
    orchestrator_record = await store.get_run(run_id=orch_run_id)
    assert orchestrator_record is not None and orchestrator_record.parent_run_id is None


async def test_continue_run_then_agent_run_with_history() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'first answer')
    await agent.run('Find ThinkingPartDelta', conversation_id='libr-conv')
    prior = (await store.list_runs(conversation_id='libr-conv'))[-1].run_id
    history = await continue_run(store, run_id=prior)
    assert is_provider_valid(history)
    seen: list[int] = []

    def follow_up(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(len(messages))
        return ModelResponse(parts=[TextPart('follow-up answer')])

    follow = Agent(FunctionModel(follow_up), capabilities=[StepPersistence(store=store, agent_name='code_librarian')])
    result = await follow.run(
        'Read _apply_provider_details_delta', message_history=history, conversation_id='libr-conv'
    )
    assert result.output == 'follow-up answer'
    assert seen == [len(history) + 1]
    turns = await store.list_runs(conversation_id='libr-conv')
    assert len(turns) == 2
    second = await store.latest_snapshot(run_id=turns[-1].run_id)
    assert second is not None and len(second.messages) == len(history) + 2


async def test_fork_run_returns_the_same_history_for_a_new_branch() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'answer')
    await agent.run('question')
    run_id = (await only_run(store)).run_id
    assert [m.parts for m in await fork_run(store, run_id=run_id)] == [
        m.parts for m in await continue_run(store, run_id=run_id)
    ]


async def test_no_snapshot_raises_lookup_error() -> None:
    store = InMemoryStepStore()
    with pytest.raises(LookupError, match="no continuable complete snapshot for run_id 'nope'"):
        await continue_run(store, run_id='nope')
    with pytest.raises(LookupError):
        await fork_run(store, run_id='nope', include_interrupted=True)


async def test_failing_tool_in_a_batch_leaves_an_interrupted_snapshot_on_top() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        scripted(
            [call('read_file', 'c1', path='a.py')],
            [call('read_file', 'c2', path='b.py'), call('explode', 'c3')],
            'never',
        ),
        capabilities=[StepPersistence(store=store, agent_name='code_librarian')],
    )

    @agent.tool_plain
    async def read_file(path: str) -> str:
        return f'contents of {path}'

    @agent.tool_plain
    async def explode() -> str:
        raise RuntimeError('disk on fire')

    with pytest.raises(RuntimeError, match='disk on fire'):
        await agent.run('investigate')
    run_id = (await only_run(store)).run_id
    events = await store.list_events(run_id=run_id)
    assert ('tool_call_failed', 2) in kinds(events)
    assert events[-1].kind == 'run_failed' and 'disk on fire' in (events[-1].error or '')
    settled = await store.latest_snapshot(run_id=run_id)
    frontier = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    assert settled is not None and settled.state == 'complete' and settled.step_index == 1
    assert frontier is not None and frontier.state == 'interrupted'
    assert not is_provider_valid(frontier.messages)
    assert len(frontier.messages) > len(settled.messages)
    history = await continue_run(store, run_id=run_id, include_interrupted=True)
    assert [m.parts for m in history] == [m.parts for m in frontier.messages]
    failed = await store.get_tool_effect(run_id=run_id, tool_call_id='c3')
    assert failed is not None and failed.status == 'failed' and 'disk on fire' in (failed.effect_summary or '')
    inspection = await inspect_recovery(store=store, run_id=run_id)
    assert inspection.failed_tools == ('explode',)
    assert inspection.settled is not None and inspection.settled.step_index == 1


@pytest.mark.parametrize('capture_frontier', [False, True], ids=['boundaries', 'frontier'])
async def test_a_snapshot_holding_a_response_is_at_the_step_of_its_request(capture_frontier: bool) -> None:
    """The history after a model response (the frontier, or the history at a failure) is saved at
    the step of the request that response answers, so a run's snapshots go up step by step."""
    store = InMemoryStepStore()
    agent = Agent(
        scripted([call('read_file', 'c1', path='a.py')], [call('explode', 'c2')], 'never'),
        capabilities=[StepPersistence(store=store, capture_frontier=capture_frontier)],
    )

    @agent.tool_plain
    def read_file(path: str) -> str:
        return f'contents of {path}'

    @agent.tool_plain
    def explode() -> str:
        raise RuntimeError('disk on fire')

    with pytest.raises(RuntimeError, match='disk on fire'):
        await agent.run('investigate')
    snapshots = await store.list_snapshots(run_id=(await only_run(store)).run_id, include_interrupted=True)
    failure = snapshots[-1]
    assert (failure.step_index, failure.state, len(failure.messages)) == (2, 'interrupted', 5)
    frontier = [s.step_index for s in snapshots if isinstance(s.messages[-1], ModelResponse)]
    assert frontier == ([1, 2] if capture_frontier else [])
    steps = [s.step_index for s in snapshots]
    assert steps == sorted(steps)


@dataclass
class DyingStore(InMemoryStepStore):
    """Stops writing at a chosen moment, as a killed process would: nothing after it lands."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = False

    async def append_event(self, event: StepEvent) -> None:
        if not self.dead:
            await super().append_event(event)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        if not self.dead:
            await super().save_snapshot(snapshot)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        if not self.dead:
            await super().record_tool_effect(record)

    async def write_records(self, **records: Any) -> None:
        if not self.dead:
            await super().write_records(**records)


async def test_crash_in_a_tool_leaves_the_call_unknown_after_crash() -> None:
    store = DyingStore()
    agent = Agent(
        scripted([call('read_file', 'c1', path='a.py')], [call('set_label', 'c2', issue=7, label='bug')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='code_librarian')],
    )

    @agent.tool_plain
    def read_file(path: str) -> str:
        return 'text'

    @agent.tool
    async def set_label(ctx: RunContext[None], issue: int, label: str) -> str:
        await annotate_tool_effect(
            store,
            ctx,
            idempotency_key=f'issue-{issue}::label::{label}',
            effect_summary=f'set label {label!r} on #{issue}',
        )
        store.dead = True  # the process dies while the side effect is in flight
        return 'ok'

    await agent.run('label it')
    run_id = (await only_run(store)).run_id
    (unknown,) = await store.list_unresolved_tool_effects(run_id=run_id)
    assert (unknown.tool_call_id, unknown.tool_name, unknown.status) == ('c2', 'set_label', 'started')
    assert unknown.idempotency_key == 'issue-7::label::bug'
    assert unknown.effect_summary == "set label 'bug' on #7"
    assert [e.kind for e in await store.list_events(run_id=run_id)][-1] == 'tool_call_started'
    settled = await continue_run(store, run_id=run_id)
    assert is_provider_valid(settled) and len(settled) == 3


async def test_annotations_survive_completion() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        scripted([call('set_label', 'c1', issue=3, label='docs')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
    )

    @agent.tool
    async def set_label(ctx: RunContext[None], issue: int, label: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'issue-{issue}::label::{label}')
        await annotate_tool_effect(store, ctx, effect_summary=f'set label {label!r} on issue #{issue}')
        return 'ok'

    await agent.run('label')
    record = await store.get_tool_effect(run_id=(await only_run(store)).run_id, tool_call_id='c1')
    assert record is not None and record.status == 'completed' and record.ended_at is not None
    assert record.idempotency_key == 'issue-3::label::docs'
    assert record.effect_summary == "set label 'docs' on issue #3"


@pytest.mark.parametrize(
    ('annotation', 'message'),
    [
        ({'idempotency_key': 7}, r'annotate_tool_effect\(idempotency_key=...\) must be a string or None, got int 7'),
        (  # what `surrogateescape` decoding of a file name leaves: no UTF-8 store could hold it
            {'effect_summary': 'wrote report-\udcff.txt'},
            r"annotate_tool_effect\(effect_summary=...\) is not valid Unicode text: a lone surrogate '\\udcff'",
        ),
    ],
    ids=['wrong type', 'lone surrogate'],
)
async def test_an_annotation_no_store_could_read_back_is_refused_and_the_entry_kept(
    annotation: dict[str, Any], message: str
) -> None:
    """The entry a tool annotates is the one record a recovery needs: a key or summary that no store
    could read back fails the tool, by name, and the entry stays as it was."""
    store = InMemoryStepStore()
    agent = Agent(scripted([call('post', 'c1', issue=7)], 'done'), capabilities=[StepPersistence(store=store)])

    @agent.tool
    async def post(ctx: RunContext[None], issue: int) -> str:
        await annotate_tool_effect(store, ctx, **annotation)
        return 'posted'

    with pytest.raises(InvalidRecordError, match=message):
        await agent.run('go')
    record = await store.get_tool_effect(run_id=(await only_run(store)).run_id, tool_call_id='c1')
    assert record is not None and record.status == 'failed' and record.idempotency_key is None
    assert record.effect_summary is not None and record.effect_summary.startswith('InvalidRecordError(')


async def test_annotate_outside_a_persisted_tool_call_is_a_no_op() -> None:
    store = InMemoryStepStore()
    agent = Agent(scripted([call('plain', 'c1')], 'done'))

    @agent.tool
    async def plain(ctx: RunContext[None]) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key='k')
        return 'ok'

    await agent.run('go')
    assert await store.list_runs() == []


async def test_model_retry_resolves_the_ledger_as_failed() -> None:
    store = InMemoryStepStore()
    attempts: list[int] = []
    agent = Agent(
        scripted([call('flaky', 'c1')], [call('flaky', 'c2')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='lib')],
    )

    @agent.tool_plain
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ModelRetry('not yet, try again')
        return 'ok'

    await agent.run('go')
    run_id = (await only_run(store)).run_id
    assert await store.list_unresolved_tool_effects(run_id=run_id) == []
    retried = await store.get_tool_effect(run_id=run_id, tool_call_id='c1')
    assert retried is not None and retried.status == 'failed'
    assert 'asked the model for a retry' in (retried.effect_summary or '')
    done = await store.get_tool_effect(run_id=run_id, tool_call_id='c2')
    assert done is not None and done.status == 'completed'
    assert ('tool_call_failed', 1) in kinds(await store.list_events(run_id=run_id))


class Out(BaseModel):
    value: int


@pytest.mark.parametrize('output_type', [str, Out], ids=['text', 'output-tool'])
async def test_run_stream_and_iter_match_run(output_type: type[Any]) -> None:
    async def drive(mode: str) -> tuple[list[tuple[str, int]], list[tuple[int, str, list[str]]]]:
        store = InMemoryStepStore()
        agent = Agent(
            scripted([call('read_file', 'c1', path='a.py')], '<output>'),
            output_type=output_type,
            capabilities=[StepPersistence(store=store, agent_name='lib')],
        )

        @agent.tool_plain
        def read_file(path: str) -> str:
            return 'text'

        if mode == 'run':
            await agent.run('go')
        elif mode == 'stream':
            async with agent.run_stream('go') as stream:
                await stream.get_output()
        else:
            async with agent.iter('go') as run:
                async for _ in run:
                    pass
        run_id = (await only_run(store)).run_id
        return kinds(await store.list_events(run_id=run_id)), shape(await store.list_snapshots(run_id=run_id))

    expected = await drive('run')
    assert expected[1][-1][1] == 'complete' and len(expected[1]) == 3  # the input, the boundary, the end
    assert await drive('stream') == expected
    assert await drive('iter') == expected


async def test_abandoned_iter_records_a_closing_event() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'done')
    async with agent.iter('go') as run:
        async for _ in run:
            break
    events = await store.list_events(run_id=(await only_run(store)).run_id)
    assert events[-1].kind == 'run_failed'
    assert 'cancelled' in (events[-1].error or '')


async def test_a_call_cut_off_by_cancellation_stays_started_in_run_and_run_stream_alike() -> None:
    """A run cancelled while a tool awaits: the call may or may not have had its effect."""

    async def cancelled(mode: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
        store = InMemoryStepStore()
        agent = librarian(store, [call('wait', 'c1')], 'done')
        entered = anyio.Event()

        @agent.tool_plain
        async def wait() -> str:  # pyright: ignore[reportUnusedFunction]
            entered.set()
            await anyio.sleep(10)
            return 'late'

        async def drive() -> None:
            if mode == 'run':
                await agent.run('go')
            else:
                async with agent.run_stream('go') as stream:
                    await stream.get_output()

        async with anyio.create_task_group() as group:
            group.start_soon(drive)
            await entered.wait()
            group.cancel_scope.cancel()
        run_id = (await only_run(store)).run_id
        events = [event.kind for event in await store.list_events(run_id=run_id)]
        effects = [(entry.tool_call_id, entry.status) for entry in await store.list_tool_effects(run_id=run_id)]
        unresolved = [entry.tool_call_id for entry in await store.list_unresolved_tool_effects(run_id=run_id)]
        return events[events.index('tool_call_started') :], effects, unresolved

    expected = (['tool_call_started', 'run_failed'], [('c1', 'started')], ['c1'])
    assert await cancelled('run') == expected
    assert await cancelled('stream') == expected


async def test_snapshot_saved_events_reach_the_stream() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'done')
    seen: list[SnapshotSaved] = []

    async def handler(ctx: RunContext[None], events: Any) -> None:
        async for event in events:
            if isinstance(event, SnapshotSaved):
                seen.append(event)

    await agent.run('go', event_stream_handler=handler)
    # The tool-cycle boundary's event arrives in stream order. The final boundary's event is
    # emitted after pydantic-ai has closed the node's event stream, so a handler may not see it.
    assert [(e.step_index, e.state) for e in seen][:1] == [(1, 'complete')]
    assert seen[0].kind == 'pydantic_ai_steps.snapshot_saved'
    assert seen[0].persistence_run_id == (await only_run(store)).run_id


async def test_model_error_after_a_clean_cycle() -> None:
    store = InMemoryStepStore()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if sum(isinstance(m, ModelResponse) for m in messages) == 0:
            return ModelResponse(parts=[call('read_file', 'c1', path='a.py')])
        raise ConnectionError('provider down')

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, agent_name='lib')])

    @agent.tool_plain
    def read_file(path: str) -> str:
        return 'text'

    with pytest.raises(ConnectionError):
        await agent.run('go')
    run_id = (await only_run(store)).run_id
    assert [k for k, _ in kinds(await store.list_events(run_id=run_id))][-2:] == ['model_request_failed', 'run_failed']
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    assert latest is not None and latest.state == 'complete'


async def test_store_errors_fail_the_run() -> None:
    class BrokenStore(InMemoryStepStore):
        async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
            raise OSError('disk full')

        async def write_records(self, **records: Any) -> None:
            if records.get('snapshot') is not None:
                raise OSError('disk full')
            await super().write_records(**records)

    store = BrokenStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'done')
    with pytest.raises(OSError, match='disk full'):
        await agent.run('go')


async def test_metadata_goes_on_run_and_events() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, 'hello', metadata={'tenant': 'acme'})
    await agent.run('hi')
    record = await only_run(store)
    assert record.metadata == {'tenant': 'acme'}
    assert all(e.metadata == {'tenant': 'acme'} for e in await store.list_events(run_id=record.run_id))


async def test_capture_frontier_snapshots_before_requests() -> None:
    store = InMemoryStepStore()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ConnectionError('first request fails')

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, capture_frontier=True)])
    with pytest.raises(ConnectionError):
        await agent.run('go')
    latest = await store.latest_snapshot(run_id=(await only_run(store)).run_id)
    assert latest is not None and shape([latest]) == [(1, 'complete', ['UserPromptPart'])]


async def test_from_spec_and_transcript_handle() -> None:
    capability = StepPersistence.from_spec(backend='memory', max_snapshots_per_run=2, agent_name='lib')
    assert isinstance(capability.store, InMemoryStepStore)
    assert capability.store.max_snapshots_per_run == 2
    assert capability.compaction_transcript_handle() is None
    assert StepPersistence(run_id='x').compaction_transcript_handle() == 'x'
    with pytest.raises(ValueError, match="unknown backend 'redis'"):
        StepPersistence.from_spec(backend='redis')
    with pytest.raises(TypeError, match='keyword arguments only'):
        StepPersistence.from_spec('memory')


async def test_concurrent_runs_on_one_capability_stay_apart() -> None:
    store = InMemoryStepStore()
    agent = librarian(store, [call('read_file', 'c1', path='a.py')], 'done')
    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(agent.run, f'question {index}')
    records = await store.list_runs()
    assert len({r.run_id for r in records}) == 10
    for record in records:
        assert [k for k, _ in kinds(await store.list_events(run_id=record.run_id))].count('run_started') == 1


async def test_durable_operations_dispatch_through_a_registered_engine_and_run_inline_otherwise() -> None:
    """Calls skip pydantic-ai's per-call binding only when no engine dispatches the operation, and reach
    the engine's dispatcher with the hook's context even where no ambient run context is set (`wrap_run`
    writing a run's closing event after the run's own scope ended)."""
    from types import SimpleNamespace

    from pydantic_ai._run_context import set_current_run_context  # pyright: ignore[reportPrivateUsage]
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    store = InMemoryStepStore()
    persistence = StepPersistence[None](store=store, run_id='r')
    await store.register_run(RunRecord(run_id='r'))
    dispatched: list[dict[str, object]] = []

    async def engine(ctx: RunContext[None], args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        del ctx, args
        dispatched.append(kwargs)

    ctx = RunContext[None](deps=None, model=TestModel(), usage=RunUsage())
    persistence._writer = ImmediateWriter(persistence, ctx)  # pyright: ignore[reportPrivateUsage]
    ctx._durable_operations = {('step_persistence', 'append_event'): engine}  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    with set_current_run_context(ctx):
        await persistence._record(ctx, 'run_started')  # pyright: ignore[reportPrivateUsage]
    await persistence._record(ctx, 'model_request_started')  # pyright: ignore[reportPrivateUsage]
    assert [call['kind'] for call in dispatched] == ['run_started', 'model_request_started']
    assert await store.list_events(run_id='r') == []  # the engine, not the inline body, ran it

    ctx._durable_operations = {('other_capability', 'append_event'): engine}  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]
    with set_current_run_context(ctx):
        await persistence._record(ctx, 'run_completed')  # pyright: ignore[reportPrivateUsage]
    assert len(dispatched) == 2
    assert [event.kind for event in await store.list_events(run_id='r')] == ['run_completed']

    inline = capability_module.runs_inline
    assert inline(SimpleNamespace(_durable_operations=None), 'step_persistence', 'append_event')  # pyright: ignore[reportArgumentType]
    assert inline(SimpleNamespace(_durable_operations={}), 'step_persistence', 'append_event')  # pyright: ignore[reportArgumentType]
    # A pydantic-ai without the attribute: leave the decision to its own wrapper.
    assert not inline(SimpleNamespace(), 'step_persistence', 'append_event')  # pyright: ignore[reportArgumentType]


# --- batched writes ----------------------------------------------------------------------------


class CallLog:
    """Wraps a store and logs every call, optionally without `write_records` (one write per record)."""

    def __init__(self, store: InMemoryStepStore, *, batches: bool) -> None:
        self.store = store
        self.calls: list[str] = []
        if batches:
            self.write_records = self._write_records

    def __getattr__(self, name: str) -> Any:
        if name == 'write_records':  # only reached without `batches`
            raise AttributeError(name)
        method = getattr(self.store, name)

        async def logged(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return logged

    async def _write_records(self, **records: Any) -> None:
        self.calls.append('write_records')
        await self.store.write_records(**records)


def two_cycle_agent(store: Any, observed: list[str | None] | None = None) -> Agent[None, str]:
    agent = Agent(
        scripted([call('read_file', 'c1', path='a')], [call('read_file', 'c2', path='b')], 'done'),
        capabilities=[StepPersistence(store=store, run_id='batched')],
    )

    @agent.tool
    async def read_file(ctx: RunContext[None], path: str) -> str:  # pyright: ignore[reportUnusedFunction]
        if observed is not None:
            inner = store.store if isinstance(store, CallLog) else store
            entry = await inner.get_tool_effect(run_id='batched', tool_call_id=ctx.tool_call_id or '')
            observed.append(entry.status if entry is not None else None)
        return f'contents of {path}'

    return agent


async def test_batched_writes_record_exactly_what_single_writes_record() -> None:
    """With `write_records` a tool cycle is two writes, and the stored records are the same."""
    batched, single = CallLog(InMemoryStepStore(), batches=True), CallLog(InMemoryStepStore(), batches=False)
    await two_cycle_agent(batched).run('go')
    await two_cycle_agent(single).run('go')

    def stored(log: CallLog) -> Any:
        return log.store

    events = [await stored(log).list_events(run_id='batched') for log in (batched, single)]
    assert [(e.kind, e.step_index, e.idempotency_key) for e in events[0]] == [
        (e.kind, e.step_index, e.idempotency_key) for e in events[1]
    ]
    snapshots = [await stored(log).list_snapshots(run_id='batched') for log in (batched, single)]
    assert shape(snapshots[0]) == shape(snapshots[1]) and len(snapshots[0]) == 4  # the input, 2 boundaries, the end
    for log in (batched, single):
        effects = [await stored(log).get_tool_effect(run_id='batched', tool_call_id=c) for c in ('c1', 'c2')]
        assert [e.status if e is not None else None for e in effects] == ['completed', 'completed']

    assert single.calls.count('append_event') == len(events[1])
    # Batched: the registration with run_started, then per tool cycle one write before the tool
    # (its `started` entry with the events so far) and one at the boundary, with no read; and the
    # final boundary's snapshot together with run_completed.
    assert batched.calls == [
        'write_records',
        *(['write_records', 'write_records'] * 2),
        'write_records',
    ]


async def test_batched_ledger_entry_closes_with_the_snapshot_holding_the_result() -> None:
    """Between a tool's return and the boundary snapshot its entry still says `started`."""
    store = InMemoryStepStore()
    closed_with: list[tuple[list[str], list[str]]] = []
    original = store.write_records

    async def spying(*, snapshot: Any = None, tool_effects: Any = (), events: Any = (), **rest: Any) -> None:
        if tool_effects and tool_effects[0].status != 'started':
            returns = [
                part.tool_call_id
                for message in (snapshot.messages if snapshot is not None else [])
                for part in message.parts
                if part.part_kind == 'tool-return'
            ]
            closed_with.append(([e.tool_call_id for e in tool_effects], returns))
        await original(snapshot=snapshot, tool_effects=tool_effects, events=events, **rest)

    store.write_records = spying  # type: ignore[method-assign]
    observed: list[str | None] = []
    await two_cycle_agent(store, observed).run('go')
    assert observed == ['started', 'started']
    assert closed_with == [(['c1'], ['c1']), (['c2'], ['c1', 'c2'])]


async def test_a_parallel_call_closes_with_the_snapshot_not_with_its_siblings_start() -> None:
    """Two calls of one response run side by side: the first may end before the second starts.
    Its `completed` entry must not ride on the second's `started` write, where no snapshot holds
    its return (a crash then would lose the return and leave the call looking done)."""
    store = InMemoryStepStore()
    writes: list[tuple[bool, list[tuple[str, str]]]] = []
    original = store.write_records

    async def spying(*, snapshot: Any = None, tool_effects: Any = (), **rest: Any) -> None:
        writes.append((snapshot is not None, [(e.tool_call_id, e.status) for e in tool_effects]))
        await original(snapshot=snapshot, tool_effects=tool_effects, **rest)

    store.write_records = spying  # type: ignore[method-assign]
    agent = Agent(
        scripted([call('fast', 'a'), call('fast', 'b')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='parallel')],
    )

    @agent.tool_plain
    async def fast() -> str:  # ends before the sibling's task starts: nothing here awaits
        return 'ok'

    await agent.run('go')
    closes = [(with_snapshot, entry) for with_snapshot, entries in writes for entry in entries if entry[1] != 'started']
    assert sorted(entry for _, entry in closes) == [('a', 'completed'), ('b', 'completed')]
    assert all(with_snapshot for with_snapshot, _ in closes), writes
    starts = [entries for _, entries in writes if ('b', 'started') in entries]
    assert starts == [[('b', 'started')]]


async def test_an_engine_dispatching_the_capability_is_told_from_none() -> None:
    """Under an engine that dispatches its operations the capability writes through them (one
    `write_records` operation per write); without one, straight to the store."""
    from types import SimpleNamespace

    free = capability_module.engine_free
    assert free(SimpleNamespace(_durable_operations=None), 'step_persistence')  # pyright: ignore[reportArgumentType]
    assert free(SimpleNamespace(_durable_operations={('other', 'x'): 1}), 'step_persistence')  # pyright: ignore[reportArgumentType]
    assert not free(
        SimpleNamespace(_durable_operations={('step_persistence', 'append_event'): 1}),  # pyright: ignore[reportArgumentType]
        'step_persistence',
    )
    assert not free(SimpleNamespace(), 'step_persistence')  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize('exploding_first', [True, False])
async def test_final_boundary_is_written_even_if_the_run_fails_after_it(exploding_first: bool) -> None:
    """Batched runs hold the last boundary for `after_run`; a failure after the boundary still writes it."""
    from pydantic_ai.capabilities import AbstractCapability

    @dataclass
    class Exploding(AbstractCapability[None]):
        async def after_run(self, ctx: RunContext[None], *, result: Any) -> Any:
            raise RuntimeError('after_run exploded')

    store = InMemoryStepStore()
    persistence = StepPersistence[None](store=store, run_id='late-failure')
    capabilities: list[Any] = [Exploding(), persistence] if exploding_first else [persistence, Exploding()]
    agent = Agent(scripted([call('read_file', 'c1', path='a')], 'done'), capabilities=capabilities)

    @agent.tool_plain
    def read_file(path: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'contents of {path}'

    with pytest.raises(RuntimeError, match='after_run exploded'):
        await agent.run('go')
    snapshots = await store.list_snapshots(run_id='late-failure', include_interrupted=True)
    assert [s.messages[-1].parts[0].part_kind for s in snapshots][-1] == 'text'  # the final answer is saved
    events = [e.kind for e in await store.list_events(run_id='late-failure')]
    assert events[-1] in ('run_completed', 'run_failed')


async def test_a_failed_batched_write_fails_the_run_and_its_records_are_written_with_the_close() -> None:
    """Store errors are never swallowed; what the failed write carried goes out with `run_failed`."""
    store = InMemoryStepStore()
    original = store.write_records
    failures = iter([True])

    async def flaky(**records: Any) -> None:
        closing = any(effect.status != 'started' for effect in records.get('tool_effects', ()))
        if records.get('snapshot') is not None and closing and next(failures, False):  # the first boundary
            raise OSError('disk full')
        await original(**records)

    store.write_records = flaky  # type: ignore[method-assign]
    with pytest.raises(OSError, match='disk full'):
        await two_cycle_agent(store).run('go')
    events = await store.list_events(run_id='batched')
    assert [e.kind for e in events][-2:] == ['tool_call_completed', 'run_failed']
    assert len({e.idempotency_key for e in events}) == len(events)
    effect = await store.get_tool_effect(run_id='batched', tool_call_id='c1')
    assert effect is not None and effect.status == 'completed'


async def test_a_failed_final_write_closes_the_run_as_failed_not_completed() -> None:
    store = InMemoryStepStore()
    original = store.write_records

    async def failing_at_the_end(**records: Any) -> None:
        if any(event.kind == 'run_completed' for event in records.get('events', ())):
            raise OSError('disk full')
        await original(**records)

    store.write_records = failing_at_the_end  # type: ignore[method-assign]
    with pytest.raises(OSError, match='disk full'):
        await two_cycle_agent(store).run('go')
    kinds = [event.kind for event in await store.list_events(run_id='batched')]
    assert 'run_completed' not in kinds and kinds[-1] == 'run_failed'
