"""Scripted agents for capability tests: no network, no API keys."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

Turn = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def responses_so_far(messages: Sequence[ModelMessage]) -> int:
    return sum(isinstance(message, ModelResponse) for message in messages)


def this_turn(messages: Sequence[ModelMessage]) -> Sequence[ModelMessage]:
    """The messages from the newest user prompt on: what a run continuing a history added."""
    for start in range(len(messages) - 1, -1, -1):
        message = messages[start]
        if isinstance(message, ModelRequest) and any(isinstance(part, UserPromptPart) for part in message.parts):
            return messages[start:]
    return messages


def scripted(*turns: list[ToolCallPart] | str, per_turn: bool = False) -> FunctionModel:
    """A model that plays `turns` in order: a list of tool calls, or a final text.

    A final text `'<output>'` becomes a call to the output tool when the agent has one. With
    `per_turn`, each new user prompt plays `turns` from the start (else a continued history goes on
    from where it stopped).
    """

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        index = min(responses_so_far(this_turn(messages) if per_turn else messages), len(turns) - 1)
        turn = turns[index]
        if isinstance(turn, str):
            if turn == '<output>' and info.output_tools:
                return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'value': 3})])
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(parts=[ToolCallPart(c.tool_name, c.args, tool_call_id=c.tool_call_id) for c in turn])

    return streaming(respond)


def streaming(respond: Turn) -> FunctionModel:
    """A model answering with `respond`, for `run` and `run_stream` alike: streamed, a response's
    text comes first, then all its tool calls at once."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        calls: dict[int, DeltaToolCall] = {}
        for index, part in enumerate(respond(messages, info).parts):
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                calls[index] = DeltaToolCall(
                    name=part.tool_name, json_args=part.args_as_json_str(), tool_call_id=part.tool_call_id
                )
        if calls:
            yield calls

    return FunctionModel(respond, stream_function=stream)


def call(tool: str, call_id: str, **args: Any) -> ToolCallPart:
    return ToolCallPart(tool, args, tool_call_id=call_id)
