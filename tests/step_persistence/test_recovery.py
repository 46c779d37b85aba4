"""Recovery beyond the store contract: what `include_interrupted=True` gives back, the tool call a
delegate records, and what the capability refuses before anything is written. What recovery reads
back from a store (records, lineage, continuable points) is in the conformance suite
(`pydantic_ai_steps.testing._recovery`), run on every shipped store."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    InMemoryStepStore,
    InvalidRecordError,
    InvalidRunIdError,
    continue_run,
    fork_run,
    run_record_for,
)
from pydantic_ai_steps.step_persistence.recovery import inspect_recovery

from .agents import call, scripted

pytestmark = pytest.mark.anyio


def support(store: InMemoryStepStore, *turns: Any, fail_on: str | None = None) -> Agent[None, str]:
    agent = Agent(scripted(*turns), capabilities=[StepPersistence(store=store, agent_name='support')])

    @agent.tool_plain
    def lookup(order: str) -> str:
        if order == fail_on:
            raise RuntimeError(f'order system down for {order}')
        return f'order {order}: shipped'

    return agent


async def test_run_metadata_that_is_not_json_is_refused_before_anything_is_written() -> None:
    store = InMemoryStepStore()
    agent = support(store, 'hi')
    with pytest.raises(InvalidRecordError, match=r'metadata.*JSON value'):
        await agent.run('hi', metadata={'when': object()})
    assert await store.list_runs() == []


def test_capability_arguments_are_checked_at_construction() -> None:
    with pytest.raises(InvalidRecordError, match=r'attempt.*3'):
        StepPersistence(run_id='r1', metadata={'attempt': 3})  # pyright: ignore[reportArgumentType]
    with pytest.raises(InvalidRecordError, match='agent_name'):
        StepPersistence(agent_name=5)  # pyright: ignore[reportArgumentType]
    with pytest.raises(InvalidRecordError, match='parent_run_id'):
        StepPersistence(parent_run_id=7)  # pyright: ignore[reportArgumentType]
    with pytest.raises(InvalidRunIdError):
        StepPersistence(run_id='')
    with pytest.raises(InvalidRunIdError):
        StepPersistence(run_id='bad\x1bid')
    with pytest.raises(TypeError, match='StepStore'):
        StepPersistence(store='runs.db')  # pyright: ignore[reportArgumentType]


async def test_include_interrupted_gives_back_the_unanswered_call_and_pydantic_ai_answers_it() -> None:
    """Documented: the unanswered call is not re-run; pydantic-ai answers it as interrupted."""
    store = InMemoryStepStore()
    broken = support(store, [call('lookup', 'c9', order='9')], 'after', fail_on='9')
    with pytest.raises(RuntimeError):
        await broken.run('check 9', conversation_id='conv-9')
    failed = (await store.list_runs(conversation_id='conv-9'))[0]
    frontier = await continue_run(store, run_id=failed.run_id, include_interrupted=True)
    calls = [part for message in frontier for part in message.parts if type(part).__name__ == 'ToolCallPart']
    assert [part.tool_call_id for part in calls] == ['c9']
    resumed = support(store, 'after')
    result = await resumed.run(message_history=frontier)
    answers = [
        part
        for message in result.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_call_id == 'c9'
    ]
    assert answers and 'interrupted' in str(answers[0].content)


def delegating(store: InMemoryStepStore, delegate: Agent[None, str], call_id: str, agent_name: str) -> Agent[None, str]:
    """A persisted agent whose one tool, `ask`, runs `delegate` on its question (call `call_id`)."""
    parent = Agent(
        scripted([call('ask', call_id, question='refund?')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name=agent_name)],
    )

    @parent.tool_plain
    async def ask(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return (await delegate.run(question)).output

    return parent


async def test_a_delegate_records_the_tool_call_that_started_it() -> None:
    store = InMemoryStepStore()
    child = Agent(scripted('child answer'), capabilities=[StepPersistence(store=store, agent_name='billing')])
    result = await delegating(store, child, 'call-77', 'support').run('go')
    record = await run_record_for(store, result)
    assert record is not None
    (delegate,) = await store.list_runs(parent_run_id=record.run_id)
    assert delegate.parent_tool_call_id == 'call-77' and delegate.agent_name == 'billing'
    started = [e for e in await store.list_events(run_id=record.run_id) if e.kind == 'tool_call_started']
    assert started[0].tool_args == '{"question":"refund?"}'


async def test_a_run_started_outside_any_tool_of_its_parent_names_no_tool_call() -> None:
    """A delegate's model starts a run of its own: that run's parent is the delegate, and no call
    of the delegate started it (the call in progress two levels up is the grandparent's)."""
    store = InMemoryStepStore()
    summarizer = Agent(scripted('summary'), capabilities=[StepPersistence(store=store, agent_name='summarizer')])

    async def librarian_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await summarizer.run('summarise')
        return ModelResponse(parts=[TextPart('answer')])

    librarian = Agent(FunctionModel(librarian_model), capabilities=[StepPersistence(store=store, agent_name='lib')])
    await delegating(store, librarian, 'call-1', 'orchestrator').run('go')
    runs = {run.agent_name: run for run in await store.list_runs()}
    assert runs['lib'].parent_run_id == runs['orchestrator'].run_id
    assert runs['lib'].parent_tool_call_id == 'call-1'
    assert runs['summarizer'].parent_run_id == runs['lib'].run_id
    assert runs['summarizer'].parent_tool_call_id is None


async def test_only_the_run_given_the_returned_history_records_its_origin() -> None:
    """A later turn built on a continued run's messages is a new turn; a history through JSON has no origin."""
    store = InMemoryStepStore()
    agent = support(store, 'fine')
    prior = await run_record_for(store, await agent.run('turn one', conversation_id='conv'))
    assert prior is not None
    continued = await agent.run('turn two', message_history=await continue_run(store, run_id=prior.run_id))
    record = await run_record_for(store, continued)
    assert record is not None and record.continued_from is not None

    later = await run_record_for(store, await agent.run('turn three', message_history=continued.all_messages()))
    assert later is not None and (later.continued_from, later.forked_from) == (None, None)

    history = await continue_run(store, run_id=prior.run_id)
    appended = await agent.run(message_history=[*history, ModelRequest(parts=[UserPromptPart('and this')])])
    kept = await run_record_for(store, appended)
    assert kept is not None and kept.continued_from == record.continued_from  # what the caller added may follow

    through_json = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(history))
    unknown = await run_record_for(store, await agent.run('turn two again', message_history=through_json))
    assert unknown is not None and unknown.continued_from is None


async def test_a_delegate_given_another_parent_names_no_call_of_the_run_around_it() -> None:
    """A run inside a tool of run A that names its parent explicitly (a queued job's, say): the call
    in progress is A's, in no ledger of that parent, so none is recorded."""
    store = InMemoryStepStore()
    worker = Agent(scripted('queued work'), capabilities=[StepPersistence(store=store, parent_run_id='queued-parent')])
    await delegating(store, worker, 'c-of-a', 'caller').run('go')
    (queued,) = await store.list_runs(parent_run_id='queued-parent')
    assert queued.parent_tool_call_id is None


async def test_recovery_helpers_name_an_argument_of_the_wrong_type() -> None:
    store = InMemoryStepStore()
    bad: Any = None
    with pytest.raises(ValueError, match='run_id must be a non-empty string, got None'):
        await continue_run(store, run_id=bad)
    with pytest.raises(ValueError, match='run_id must be a non-empty string, got 5'):
        await inspect_recovery(store=store, run_id=cast(Any, 5))
    with pytest.raises(ValueError, match="new_conversation must be True or False, got 'no'"):
        await fork_run(store, run_id='r', new_conversation=cast(Any, 'no'))
    with pytest.raises(ValueError, match="include_interrupted must be True or False, got 'yes'"):
        await continue_run(store, run_id='r', include_interrupted=cast(Any, 'yes'))
    with pytest.raises(ValueError, match=r'got \[0, 0, .*\(list of 300000 characters\)$') as raised:
        await continue_run(store, run_id=cast(Any, [0] * 100_000))
    assert len(str(raised.value)) < 400  # the value's start, end and length, not all of it
