"""`run_stream` where pydantic-ai finishes the run out of the usual hooks' sight: the response that
ends the stream gets no node hook, and the calls beside it run in the stream's own history.

Each test runs against the in-memory and the SQLite store and compares what they keep with what
pydantic-ai had (`capture_run_messages`, `all_messages()`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, capture_run_messages
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import InMemoryStepStore, SqliteStepStore, StepStore

from .agents import call, scripted

pytestmark = pytest.mark.anyio

STORES: dict[str, Callable[[Path], Any]] = {
    'memory': lambda root: InMemoryStepStore(),
    'sqlite': lambda root: SqliteStepStore(database=root / 'steps.db'),
}


class Out(BaseModel):
    value: int


def dump(messages: list[ModelMessage]) -> list[Any]:
    return ModelMessagesTypeAdapter.dump_python(messages, mode='json')


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StepStore]:
    async with STORES[request.param](tmp_path) as opened:
        yield opened


@pytest.mark.parametrize('output_type', [str, Out], ids=['text', 'output-tool'])
@pytest.mark.parametrize('cycles', [0, 1], ids=['first-response', 'after-a-tool-cycle'])
async def test_a_streamed_output_the_validator_refuses_is_saved_with_its_response(
    store: StepStore, output_type: type[Any], cycles: int
) -> None:
    """`run_stream` cannot retry, so a refused output fails the run; the failure snapshot holds the
    refused response, at the step of the request it answers, as under `Agent.run`."""
    turns: list[Any] = [[call('read', f'c{index}')] for index in range(cycles)]
    agent = Agent(
        scripted(*turns, '<output>'),
        output_type=output_type,
        capabilities=[StepPersistence(store=store, run_id='refused')],
    )

    @agent.tool_plain
    def read() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'text'

    @agent.output_validator
    def refuse(value: Any) -> Any:  # pyright: ignore[reportUnusedFunction]
        raise ModelRetry('not that')

    with capture_run_messages() as captured, pytest.raises(UnexpectedModelBehavior, match='retries are not supported'):
        async with agent.run_stream('go') as stream:
            await stream.get_output()
    assert isinstance(captured[-1], ModelResponse)
    failure = (await store.list_snapshots(run_id='refused', include_interrupted=True))[-1]  # pyright: ignore[reportAttributeAccessIssue]
    assert dump(failure.messages) == dump(captured)
    assert failure.step_index == cycles + 1
    events = [event.kind for event in await store.list_events(run_id='refused')]
    assert events[-1] == 'run_failed'
