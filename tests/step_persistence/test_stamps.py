"""Where pydantic-ai changes messages in place: the fact the history tracker's `TAIL` stands on.

The tracker compares the newest `TAIL` positions of the last save value by value and the rest by
object identity, so an attribute pydantic-ai assigns on an older message would never be stored.
These runs look at every message wherever the capability may save (before each model request, after
each node with a tool cycle's pending request, and at the end) and measure, for each change made in
place, how far from the end of the previous look it was. A pydantic-ai that stamps older messages
fails here first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelRequest
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import InMemoryStepStore
from pydantic_ai_steps.store.history import TAIL, message_to_json
from pydantic_ai_steps.testing.step_store import dump

from .agents import call, scripted

pytestmark = pytest.mark.anyio

REACH = 2
"""How far back from the newest message of one save pydantic-ai changes a message before the next:
the newest (a tool cycle's pending request, stamped when it is sent) or the one next to it."""


@dataclass
class Look:
    messages: list[ModelMessage]
    texts: list[str]


@dataclass
class StampWatcher(AbstractCapability[Any]):
    """Looks at the history wherever `StepPersistence` may save it; `reaches` are the distances
    (from the end of the previous look) of the messages changed in place since."""

    looks: list[Look] = field(default_factory=list[Look])
    reaches: list[int] = field(default_factory=list[int])

    def look(self, messages: list[ModelMessage]) -> None:
        texts = [message_to_json(message) for message in messages]
        if self.looks:
            previous = self.looks[-1]
            for position, (before, text) in enumerate(zip(previous.messages, previous.texts, strict=False)):
                if position < len(messages) and messages[position] is before and texts[position] != text:
                    self.reaches.append(len(previous.messages) - position)
        self.looks.append(Look(list(messages), texts))

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        self.look(list(ctx.messages))
        return request_context

    async def after_node_run(self, ctx: RunContext[Any], *, node: Any, result: Any) -> Any:
        messages = list(ctx.messages)
        request = getattr(result, 'request', None)
        if isinstance(request, ModelRequest) and (not messages or messages[-1] is not request):
            messages.append(request)  # a tool cycle's returns, as the boundary saves them
        self.look(messages)
        return result

    async def after_run(self, ctx: RunContext[Any], *, result: Any) -> Any:
        self.look(result.all_messages())
        return result


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize('capture_frontier', [False, True])
async def test_pydantic_ai_changes_in_place_only_the_newest_messages_of_a_save(capture_frontier: bool) -> None:
    store = InMemoryStepStore()
    watcher = StampWatcher()
    steps = iter(range(1000))

    def agent(**kwargs: Any) -> Agent[None, Any]:
        persistence = StepPersistence(store=store, capture_frontier=capture_frontier)
        built: Agent[None, Any] = Agent(capabilities=[watcher, persistence], **kwargs)

        @built.instructions
        def changing(ctx: RunContext[None]) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'step {next(steps)}'  # new instructions on every request, stamped on it

        @built.tool_plain
        def fetch(page: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return 'x' * page

        @built.tool_plain
        def flaky(page: int) -> str:  # pyright: ignore[reportUnusedFunction]
            if page == 0:
                raise ModelRetry('try page 1')
            return 'ok'

        return built

    cycles = [
        [call('fetch', 'a', page=1)],
        [call('fetch', 'b', page=2), call('fetch', 'c', page=3)],  # parallel calls
        [call('flaky', 'd', page=0)],  # a retry prompt
        [call('flaky', 'e', page=1)],
    ]
    first = await agent(model=scripted(*cycles, 'done', per_turn=True)).run('go')
    second = await agent(model=scripted(*cycles, '<output>', per_turn=True), output_type=Answer).run(
        'again', message_history=first.all_messages()
    )
    async with agent(model=scripted(*cycles, 'streamed', per_turn=True)).run_stream(
        'third', message_history=second.all_messages()
    ) as streamed:
        await streamed.get_output()
    async with agent(model=scripted(*cycles, 'iterated', per_turn=True)).iter('fourth') as run:
        async for _ in run:
            pass

    tool_cycles = [look for look in watcher.looks if look.messages and isinstance(look.messages[-1], ModelRequest)]
    assert len(tool_cycles) >= 4 * len(cycles), 'every run went through its tool cycles'
    assert len(watcher.reaches) >= 4 * len(cycles), 'the runs no longer show the stamps they test'
    assert max(watcher.reaches) <= REACH, sorted(set(watcher.reaches))
    assert TAIL >= REACH + 2, 'the tracker re-checks one tool cycle beyond what pydantic-ai changes'
    assert run.result is not None
    for result in (first, second, streamed, run.result):  # and every run stored what it ended with
        (record,) = await store.list_runs(pydantic_ai_run_id=result.run_id)
        stored = await store.latest_snapshot(run_id=record.run_id)
        assert stored is not None and dump(stored.messages) == dump(result.all_messages())


class CountingModel(FunctionModel):
    """Counts tokens before each request the way a provider's binding may: by adding keys to the
    `metadata` dict of the request it counted, in place."""

    async def count_tokens(self, messages: list[ModelMessage], model_settings: Any, parameters: Any) -> RequestUsage:
        request = messages[-1]
        assert isinstance(request, ModelRequest) and request.metadata is not None
        request.metadata.setdefault('__pydantic_ai__', {})['counted'] = len(messages)
        return RequestUsage(input_tokens=len(messages))


@dataclass
class RequestMetadata(AbstractCapability[Any]):
    """Gives each new request a `metadata` dict before `StepPersistence` saves it."""

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        request = request_context.messages[-1]
        if isinstance(request, ModelRequest) and request.metadata is None:
            request.metadata = {'app': 'tagged'}
        return request_context


async def test_metadata_pydantic_ai_writes_into_a_saved_request_is_stored() -> None:
    """pydantic-ai counts tokens after the boundary saved the request; what the count adds to the
    request's `metadata` dict in place is in the history the store holds at the next boundary."""
    store = InMemoryStepStore()
    model = scripted([call('fetch', 'a', page=1)], [call('fetch', 'b', page=2)], 'done')
    agent = Agent(CountingModel(model.function), capabilities=[RequestMetadata(), StepPersistence(store=store)])

    @agent.tool_plain
    def fetch(page: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return 'x' * page

    result = await agent.run('go', usage_limits=UsageLimits(count_tokens_before_request=True))
    requests = [message for message in result.all_messages() if isinstance(message, ModelRequest)]
    assert [request.metadata for request in requests] == [
        {'app': 'tagged', '__pydantic_ai__': {'counted': count}} for count in (1, 3, 5)
    ]
    (record,) = await store.list_runs(pydantic_ai_run_id=result.run_id)
    for snapshot in await store.list_snapshots(run_id=record.run_id):
        stored = [message for message in snapshot.messages if isinstance(message, ModelRequest)]
        assert all(request.metadata is not None and '__pydantic_ai__' in request.metadata for request in stored[:-1])
    stored = await store.latest_snapshot(run_id=record.run_id)
    assert stored is not None and dump(stored.messages) == dump(result.all_messages())
