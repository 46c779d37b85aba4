"""The agents `bench/durable_payload.py` runs under Temporal, in a module of their own.

Temporal's workflow sandbox re-imports a workflow's module for every run, so an agent (and its
store, which creates a directory) defined there fails worker start-up with
`RestrictedWorkflowAccessError`. The workflow imports this module with
`workflow.unsafe.imports_passed_through()` instead, and finds the agents built by the harness in
`AGENTS`.

The agent's model is a `FunctionModel` that reads how many tool cycles to make from the prompt
(`'cycles=N'`), calls the `fetch` tool once per cycle (each result is 2 KB) and then answers.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import StepStore

PAYLOAD = 2048
AGENTS: dict[str, Agent[None, str]] = {}


def cycles_asked(messages: list[ModelMessage]) -> int:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return int(part.content.removeprefix('cycles='))
    raise ValueError('the prompt names no cycle count')


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    done = sum(1 for message in messages if isinstance(message, ModelResponse))
    if done < cycles_asked(messages):
        return ModelResponse(parts=[ToolCallPart('fetch', {'page': done}, tool_call_id=f'call-{done}')])
    return ModelResponse(parts=[TextPart('done')])


def build(name: str, store: StepStore | None) -> Agent[None, str]:
    """A durable agent named `name`, persisted to `store` (or not persisted), registered in `AGENTS`."""
    capabilities: list[Any] = [TemporalDurability()]
    if store is not None:
        capabilities.append(StepPersistence(store=store, agent_name=name))
    agent = Agent(FunctionModel(model), name=name, capabilities=capabilities)

    @agent.tool_plain
    async def fetch(page: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return (f'page {page}: ' + 'x' * PAYLOAD)[:PAYLOAD]

    AGENTS[name] = agent
    return agent
