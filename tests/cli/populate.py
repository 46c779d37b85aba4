"""A store with one of everything the inspector shows, written through the public API.

Real agents (scripted `FunctionModel`s) produce the completed and failed runs and the
delegation; the crashed run is written record by record, exactly as a process killed mid-tool
leaves it (there is no way to kill a coroutine that leaves the same trace in-process).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
BIG_IMAGE = bytes(range(256)) * 300  # 76,800 bytes: above the 64 KiB externalization threshold
SMALL_IMAGE = b'\x89PNG tiny'
BIG_TEXT = 'line of a long log\n' * 4000  # 76,000 bytes of text


@dataclass(frozen=True)
class Population:
    orchestrator: str
    librarian: str
    failed: str
    crashed: str
    media: str


def _tool_returns(messages: list[ModelMessage]) -> int:
    return sum(
        isinstance(part, ToolReturnPart)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def _script(tool: str, args: dict[str, object], answer: str) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        if _tool_returns(messages) == 0:
            return ModelResponse(parts=[ToolCallPart(tool, args)])
        return ModelResponse(parts=[TextPart(answer)])

    return FunctionModel(respond)


async def populate(store: StepStore) -> Population:
    librarian = Agent(
        _script('lookup', {'symbol': 'ThinkingPartDelta'}, 'found it in messages.py'),
        capabilities=[StepPersistence(store=store, agent_name='code_librarian')],
    )

    @librarian.tool_plain
    def lookup(symbol: str) -> str:
        return f'{symbol}: pydantic_ai/messages.py'

    orchestrator = Agent(
        _script('delegate', {'question': 'where is ThinkingPartDelta?'}, 'the librarian found it'),
        capabilities=[StepPersistence(store=store, agent_name='orchestrator', run_id='orch-1')],
    )

    @orchestrator.tool_plain
    async def delegate(question: str) -> str:
        return (await librarian.run(question, conversation_id='conv-libr')).output

    await orchestrator.run('where is ThinkingPartDelta?', conversation_id='conv-orch')
    (librarian_record,) = await store.list_runs(parent_run_id='orch-1')

    flaky = Agent(
        _script('explode', {}, 'unreachable'),
        capabilities=[StepPersistence(store=store, agent_name='flaky', run_id='failed-1')],
    )

    @flaky.tool_plain
    def explode() -> str:
        raise RuntimeError('disk full')

    with pytest.raises(RuntimeError, match='disk full'):
        await flaky.run('try it')

    await _crashed_run(store)
    await _media_run(store)
    return Population(
        orchestrator='orch-1',
        librarian=librarian_record.run_id,
        failed='failed-1',
        crashed='crashed-1',
        media='media-1',
    )


async def _crashed_run(store: StepStore) -> None:
    """What a deployer killed inside its `deploy` tool leaves: no closing event, a `started` effect."""
    run_id = 'crashed-1'
    await store.register_run(RunRecord(run_id=run_id, agent_name='deployer', conversation_id='conv-ops', started_at=T0))
    kinds: list[EventKind] = ['run_started', 'model_request_started', 'model_request_completed', 'tool_call_started']
    for index, kind in enumerate(kinds):
        await store.append_event(
            StepEvent(
                run_id=run_id,
                kind=kind,
                step_index=0 if index == 0 else 1,
                timestamp=T0 + timedelta(seconds=index),
                agent_name='deployer',
                tool_call_id='call-deploy' if kind == 'tool_call_started' else None,
                tool_name='deploy' if kind == 'tool_call_started' else None,
                idempotency_key=f'{index}:{kind}',
            )
        )
    await store.record_tool_effect(
        ToolEffectRecord(
            tool_call_id='call-deploy',
            tool_name='deploy',
            run_id=run_id,
            status='started',
            started_at=T0 + timedelta(seconds=3),
            idempotency_key='deploy::service-a::v2',
            effect_summary='deploy service-a v2 to production',
        )
    )
    prompt = ModelRequest(parts=[UserPromptPart('ship v2', timestamp=T0)], timestamp=T0)
    await store.save_snapshot(
        ContinuableSnapshot(run_id=run_id, step_index=0, messages=[prompt], timestamp=T0, agent_name='deployer')
    )
    call = ModelResponse(parts=[ToolCallPart('deploy', {'version': 'v2'}, tool_call_id='call-deploy')], timestamp=T0)
    await store.save_snapshot(
        ContinuableSnapshot(
            run_id=run_id,
            step_index=1,
            messages=[prompt, call],
            timestamp=T0 + timedelta(seconds=3),
            agent_name='deployer',
            state='interrupted',
        )
    )


async def _media_run(store: StepStore) -> None:
    """A complete run whose history carries a big and a small image and a big text."""
    run_id = 'media-1'
    await store.register_run(RunRecord(run_id=run_id, agent_name='viewer', started_at=T0 + timedelta(minutes=1)))
    closing: list[EventKind] = ['run_started', 'run_completed']
    for index, kind in enumerate(closing):
        await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=0, idempotency_key=f'{index}'))
    messages: list[ModelMessage] = [
        ModelRequest(
            parts=[
                UserPromptPart(
                    [
                        'describe these',
                        BinaryContent(BIG_IMAGE, media_type='image/png'),
                        BinaryContent(SMALL_IMAGE, media_type='image/png'),
                    ],
                    timestamp=T0,
                )
            ],
            timestamp=T0,
        ),
        ModelResponse(parts=[ToolCallPart('read_log', {}, tool_call_id='call-log')], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart('read_log', BIG_TEXT, tool_call_id='call-log', timestamp=T0)]),
        ModelResponse(parts=[TextPart('two images and a long log')], timestamp=T0),
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=2, messages=messages, timestamp=T0))
