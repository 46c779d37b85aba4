"""Recovery as applications need it: from a result to its record, lineage of continues and forks,
conversation-level recovery, and what the capability refuses before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    InMemoryStepStore,
    InvalidRecordError,
    InvalidRunIdError,
    SnapshotRef,
    continue_conversation,
    continue_run,
    fork_run,
    run_record_for,
)

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


async def test_from_a_result_to_its_record() -> None:
    store = InMemoryStepStore()
    agent = support(store, [call('lookup', 'c1', order='42')], 'it shipped')
    result = await agent.run('where is 42?', metadata={'tenant': 'acme', 'attempt': 2, 'tags': ['vip']})
    record = await run_record_for(store, result)
    assert record is not None and record.run_id.startswith('support-') and record.run_id != result.run_id
    assert record.pydantic_ai_run_id == result.run_id
    assert record.run_metadata == {'tenant': 'acme', 'attempt': 2, 'tags': ['vip']}
    assert record.status == 'completed' and record.ended_at is not None
    assert await run_record_for(store, result.run_id) == record
    assert await run_record_for(store, 'no-such-run') is None
    assert [r.run_id for r in await store.list_runs(run_metadata={'tenant': 'acme'})] == [record.run_id]


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


async def test_continued_and_forked_runs_record_where_they_came_from() -> None:
    store = InMemoryStepStore()
    agent = support(store, [call('lookup', 'c1', order='7')], 'done')
    first = await agent.run('check 7', conversation_id='support-conv')
    prior = await run_record_for(store, first)
    assert prior is not None
    history = await continue_run(store, run_id=prior.run_id)
    settled = await store.latest_snapshot(run_id=prior.run_id)
    assert settled is not None and settled.seq is not None
    second = await agent.run('and now?', message_history=history)
    continued = await run_record_for(store, second)
    assert continued is not None and continued.conversation_id == 'support-conv'
    assert continued.continued_from == SnapshotRef(run_id=prior.run_id, seq=settled.seq, step_index=settled.step_index)
    assert continued.forked_from is None

    branch = await fork_run(store, run_id=prior.run_id, new_conversation=True)
    third = await agent.run('what if?', message_history=branch)
    forked = await run_record_for(store, third)
    assert forked is not None and forked.forked_from is not None and forked.continued_from is None
    assert forked.forked_from.run_id == prior.run_id
    assert forked.conversation_id not in (None, 'support-conv')  # a conversation of its own
    same_conversation = await fork_run(store, run_id=prior.run_id)
    kept = await run_record_for(store, await agent.run('again', message_history=same_conversation))
    assert kept is not None and kept.conversation_id == 'support-conv' and kept.forked_from is not None


async def test_a_run_that_fails_in_its_first_tool_can_be_continued_from_its_input() -> None:
    store = InMemoryStepStore()
    ok = support(store, [call('lookup', 'c1', order='1')], 'fine')
    await ok.run('turn one', conversation_id='conv')
    so_far = await continue_conversation(store, conversation_id='conv')
    # The scripted model counts the responses in the history: turn one's two come first.
    broken = support(store, 'x', 'x', [call('lookup', 'c2', order='2')], 'unreachable', fail_on='2')
    with pytest.raises(RuntimeError, match='order system down'):
        await broken.run('turn two', message_history=so_far, conversation_id='conv')
    failed = (await store.list_runs(conversation_id='conv', newest_first=True, limit=1))[0]
    assert failed.status == 'failed'
    history = await continue_run(store, run_id=failed.run_id)
    prompts = [part.content for message in history for part in message.parts if isinstance(part, UserPromptPart)]
    assert prompts == ['turn one', 'turn two']  # the conversation so far and the failed turn's prompt
    assert await continue_conversation(store, conversation_id='conv') == history
    with pytest.raises(LookupError, match='nobody'):
        await continue_conversation(store, conversation_id='nobody')


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


async def test_a_delegate_records_the_tool_call_that_started_it() -> None:
    store = InMemoryStepStore()
    child = Agent(scripted('child answer'), capabilities=[StepPersistence(store=store, agent_name='billing')])
    parent = Agent(
        scripted([call('ask_billing', 'call-77', question='refund?')], 'done'),
        capabilities=[StepPersistence(store=store, agent_name='support')],
    )

    @parent.tool_plain
    async def ask_billing(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return (await child.run(question)).output

    result = await parent.run('go')
    record = await run_record_for(store, result)
    assert record is not None
    (delegate,) = await store.list_runs(parent_run_id=record.run_id)
    assert delegate.parent_tool_call_id == 'call-77' and delegate.agent_name == 'billing'
    started = [e for e in await store.list_events(run_id=record.run_id) if e.kind == 'tool_call_started']
    assert started[0].tool_args == '{"question":"refund?"}'
