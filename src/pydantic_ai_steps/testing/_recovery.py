"""Conformance: what the recovery helpers read back from a store, through real agent runs.

From a result to its record, the lineage of continues and forks, and the continuable point a
failed run leaves, found per run and across a conversation. The agents run on a scripted
`FunctionModel`, so no test needs a network or a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from .._records import SnapshotRef
from ..capability._persistence import StepPersistence
from ..step_persistence.recovery import continue_conversation, continue_run, fork_run, run_record_for
from ..store.protocol import RecordBatchStore, StepStore
from ._kernel import managed
from ._support import StoreFactory, new_run_id

Turn = list[ToolCallPart] | str
"""What the scripted model answers: tool calls, or a final text."""


def _scripted(turns: Sequence[Turn]) -> FunctionModel:
    """Answers with `turns[n]` when the history holds `n` responses (the last turn repeats)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        turn = turns[min(sum(isinstance(message, ModelResponse) for message in messages), len(turns) - 1)]
        return ModelResponse(parts=[TextPart(turn)] if isinstance(turn, str) else list(turn))

    return FunctionModel(respond)


def _lookup(call_id: str, order: str) -> list[ToolCallPart]:
    return [ToolCallPart('lookup', {'order': order}, tool_call_id=call_id)]


def support_agent(store: StepStore, *turns: Turn, fail_on: str | None = None) -> Agent[None, str]:
    """A persisted agent with one tool, `lookup`, which raises for the order `fail_on`."""
    agent = Agent(_scripted(turns), capabilities=[StepPersistence(store=store, agent_name='support')])

    @agent.tool_plain
    def lookup(order: str) -> str:  # pyright: ignore[reportUnusedFunction]
        if order == fail_on:
            raise RuntimeError(f'order system down for {order}')
        return f'order {order}: shipped'

    return agent


def prompts(history: Sequence[ModelMessage]) -> list[Any]:
    return [part.content for message in history for part in message.parts if isinstance(part, UserPromptPart)]


class RecoveryConformance:
    persistent: ClassVar[bool] = False

    @pytest.mark.anyio
    async def test_from_a_result_to_its_record(self, make_store: StoreFactory) -> None:
        store = managed(make_store())
        agent = support_agent(store, _lookup('c1', '42'), 'it shipped')
        tenant = new_run_id('tenant')
        result = await agent.run('where is 42?', metadata={'tenant': tenant, 'attempt': 2, 'tags': ['vip']})
        record = await run_record_for(store, result)
        assert record is not None and record.run_id.startswith('support-') and record.run_id != result.run_id
        assert record.pydantic_ai_run_id == result.run_id
        assert record.run_metadata == {'tenant': tenant, 'attempt': 2, 'tags': ['vip']}
        assert record.status == 'completed' and record.ended_at is not None
        again = managed(make_store()) if self.persistent else store
        assert await run_record_for(again, result.run_id) == record
        assert await run_record_for(again, new_run_id('no-such-run')) is None
        assert [r.run_id for r in await again.list_runs(run_metadata={'tenant': tenant})] == [record.run_id]

    @pytest.mark.anyio
    async def test_continued_and_forked_runs_record_where_they_came_from(self, store: StepStore) -> None:
        store = managed(store)
        conversation = new_run_id('conv')
        agent = support_agent(store, _lookup('c1', '7'), 'done')
        first = await agent.run('check 7', conversation_id=conversation)
        prior = await run_record_for(store, first)
        assert prior is not None
        history = await continue_run(store, run_id=prior.run_id)
        settled = await store.latest_snapshot(run_id=prior.run_id)
        assert settled is not None and settled.seq is not None
        second = await agent.run('and now?', message_history=history)
        continued = await run_record_for(store, second)
        assert continued is not None and continued.conversation_id == conversation
        assert continued.continued_from == SnapshotRef(
            run_id=prior.run_id, seq=settled.seq, step_index=settled.step_index
        )
        assert continued.forked_from is None

        branch = await fork_run(store, run_id=prior.run_id, new_conversation=True)
        third = await agent.run('what if?', message_history=branch)
        forked = await run_record_for(store, third)
        assert forked is not None and forked.continued_from is None
        assert forked.forked_from == continued.continued_from
        assert forked.conversation_id not in (None, conversation)  # a conversation of its own
        same_conversation = await fork_run(store, run_id=prior.run_id)
        kept = await run_record_for(store, await agent.run('again', message_history=same_conversation))
        assert kept is not None and kept.conversation_id == conversation and kept.forked_from is not None

    @pytest.mark.anyio
    async def test_a_conversation_continues_from_its_turns_not_from_their_delegates(self, store: StepStore) -> None:
        """A delegate given the conversation's id starts after the turn that called it and may end
        after it too; continuing the conversation still gives the turn's history, not the delegate's."""
        conversation = new_run_id('conv')
        librarian = Agent(
            _scripted(['from the shelves']),
            system_prompt='You are the librarian',
            capabilities=[StepPersistence(store=store, agent_name='librarian')],
        )
        orchestrator = Agent(
            _scripted([[ToolCallPart('ask_librarian', {'question': 'q'}, tool_call_id='c1')], 'answered']),
            capabilities=[StepPersistence(store=store, agent_name='orchestrator')],
        )

        @orchestrator.tool_plain
        async def ask_librarian(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return (await librarian.run(f'librarian task: {question}', conversation_id=conversation)).output

        await orchestrator.run('orchestrator question', conversation_id=conversation)
        assert len(await store.list_runs(conversation_id=conversation)) == 2
        history = await continue_conversation(store, conversation_id=conversation)
        assert prompts(history) == ['orchestrator question']

    @pytest.mark.anyio
    async def test_a_run_that_ends_waiting_for_an_approval_resumes_from_the_store(self, store: StepStore) -> None:
        """Its final history ends on a call with no return yet, so it is kept `interrupted`: the
        settled read does not give it, `include_interrupted=True` does, and the approval resumes it."""
        agent = Agent(
            _scripted([[ToolCallPart('delete_file', {'path': 'a'}, tool_call_id='c-del')], 'deleted it']),
            output_type=[str, DeferredToolRequests],
            capabilities=[StepPersistence(store=store, agent_name='files')],
        )

        @agent.tool_plain(requires_approval=True)
        def delete_file(path: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'{path} deleted'

        waiting = await agent.run('delete a')
        assert isinstance(waiting.output, DeferredToolRequests)
        record = await run_record_for(store, waiting)
        assert record is not None and record.status == 'completed'
        assert prompts(await continue_run(store, run_id=record.run_id)) == ['delete a']
        history = await continue_run(store, run_id=record.run_id, include_interrupted=True)
        assert len(history) == len(waiting.all_messages())
        approved = await agent.run(
            message_history=history, deferred_tool_results=DeferredToolResults(approvals={'c-del': True})
        )
        assert approved.output == 'deleted it'
        returns = [
            part.content
            for message in approved.new_messages()
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        assert returns == ['a deleted']

    @pytest.mark.anyio
    async def test_continue_conversation_refuses_a_missing_conversation_id(self, store: StepStore) -> None:
        """`None` would select every conversation's runs: another user's history, say."""
        await support_agent(store, 'hello').run('someone else', conversation_id=new_run_id('conv'))
        for missing in (None, ''):
            with pytest.raises(ValueError, match='conversation_id must be a non-empty string'):
                await continue_conversation(store, conversation_id=missing)  # pyright: ignore[reportArgumentType]

    @pytest.mark.anyio
    async def test_a_run_that_fails_in_its_first_tool_continues_from_its_input(self, store: StepStore) -> None:
        """The run's input (the history it was given and its prompt) is its continuable point."""
        conversation = new_run_id('conv')
        ok = support_agent(store, _lookup('c1', '1'), 'fine')
        await ok.run('turn one', conversation_id=conversation)
        (earlier,) = await store.list_runs(conversation_id=conversation)
        so_far = await continue_conversation(store, conversation_id=conversation)
        # The scripted model counts the responses in the history: turn one's two come first.
        broken = support_agent(store, 'x', 'x', _lookup('c2', '2'), 'unreachable', fail_on='2')
        with pytest.raises(RuntimeError, match='order system down'):
            await broken.run('turn two', message_history=so_far, conversation_id=conversation)
        history = await continue_conversation(store, conversation_id=conversation)
        assert prompts(history) == ['turn one', 'turn two']
        (failed,) = [r for r in await store.list_runs(conversation_id=conversation) if r.run_id != earlier.run_id]
        assert prompts(await continue_run(store, run_id=failed.run_id)) == prompts(history)
        with pytest.raises(LookupError, match='nobody'):
            await continue_conversation(store, conversation_id=new_run_id('nobody'))

    @pytest.mark.anyio
    async def test_a_run_whose_first_model_request_fails_continues_from_its_input(self, store: StepStore) -> None:
        """Nothing the run had before its first request outranks its input, so continuing asks turn two again."""
        conversation = new_run_id('conv')
        earlier = await support_agent(store, 'fine').run('turn one', conversation_id=conversation)

        def unavailable(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            raise RuntimeError('model unavailable')

        broken = Agent(FunctionModel(unavailable), capabilities=[StepPersistence(store=store, agent_name='support')])
        with pytest.raises(RuntimeError, match='model unavailable'):
            await broken.run('turn two', message_history=earlier.all_messages(), conversation_id=conversation)
        history = await continue_conversation(store, conversation_id=conversation)
        assert prompts(history) == ['turn one', 'turn two']
        answered = await support_agent(store, 'fine', 'answered').run(message_history=history)
        assert answered.output == 'answered' and prompts(answered.all_messages()) == ['turn one', 'turn two']

    @pytest.mark.anyio
    async def test_while_the_model_is_first_asked_the_store_holds_the_runs_input(
        self, make_store: StoreFactory
    ) -> None:
        """What a process killed during its first model request leaves: the run, and its input to continue from."""
        store = make_store()
        if not isinstance(store, RecordBatchStore):
            pytest.skip('without write_records the input is written with the first tool call')
        reader = make_store() if self.persistent else store
        conversation = new_run_id('conv')
        earlier = await support_agent(store, 'fine').run('turn one', conversation_id=conversation)
        seen: list[list[Any]] = []

        async def asked(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(prompts(await continue_conversation(reader, conversation_id=conversation)))
            return ModelResponse(parts=[TextPart('answered')])

        agent = Agent(FunctionModel(asked), capabilities=[StepPersistence(store=store, agent_name='support')])
        await agent.run('turn two', message_history=earlier.all_messages(), conversation_id=conversation)
        assert seen == [['turn one', 'turn two']]
