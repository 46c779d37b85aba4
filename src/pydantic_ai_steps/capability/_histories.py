"""Small facts about histories the hooks rely on, and where a history handed to a run came from."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence

import anyio
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

from .._records import SnapshotRef

FINAL_RESULT_PROCESSED = 'Final result processed.'
"""The return pydantic-ai gives an output tool call (see `with_output_tool_returns`)."""


def same_messages(saved: Sequence[ModelMessage] | None, messages: Sequence[ModelMessage]) -> bool:
    """Message-for-message identity. Enough to tell a final history from the one saved at the last
    boundary: nothing stamps messages once it has passed, and a capability that rewrites the final
    history builds new message objects."""
    return saved is not None and len(saved) == len(messages) and all(map(operator.is_, saved, messages))


def with_output_tool_returns(messages: list[ModelMessage], output_tools: frozenset[str]) -> list[ModelMessage]:
    """Add the output-tool return `run_stream` appends only after `after_run` has run.

    Under `Agent.run` the final history ends with the output tool's return; `run_stream` hands
    `after_run` the history without it (the stream result gains it later). Folding in the same
    return keeps the snapshots of both ways of running identical. Any other unanswered call
    leaves the history as it is.
    """
    if not messages or not isinstance(last := messages[-1], ModelResponse):
        return messages
    calls = [part for part in last.parts if isinstance(part, ToolCallPart)]
    if len(calls) != 1 or calls[0].tool_name not in output_tools:
        return messages
    call = calls[0]
    answer = ToolReturnPart(tool_name=call.tool_name, content=FINAL_RESULT_PROCESSED, tool_call_id=call.tool_call_id)
    return [*messages, ModelRequest(parts=[answer])]


def describe_exit(error: BaseException) -> str:
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return f'cancelled: the run was abandoned before it finished ({error!r})'
    return repr(error)


def describe_tool_error(error: BaseException) -> str:
    from pydantic_ai.exceptions import ToolRetryError

    if isinstance(error, ToolRetryError):
        return f'ModelRetry: the tool asked the model for a retry ({error!r})'
    return describe_exit(error)


# --- where a history came from: continue_run / fork_run ------------------------------------------

_origins: dict[int, tuple[weakref.ref[ModelMessage], str, SnapshotRef]] = {}


def remember_origin(history: Sequence[ModelMessage], kind: str, ref: SnapshotRef) -> None:
    """Note that `history` (by its last message object) came from snapshot `ref`, by `kind`.

    pydantic-ai copies `message_history=` into a new list but keeps the message objects, so the
    run given this history finds its origin by identity, without the caller passing anything.
    """
    if not history:
        return
    last = history[-1]
    key = id(last)

    def forget(_: object, key: int = key) -> None:
        _origins.pop(key, None)

    _origins[key] = (weakref.ref(last, forget), kind, ref)


def origin_of(messages: Sequence[ModelMessage]) -> tuple[str, SnapshotRef] | None:
    """`('continued' | 'forked', ref)` for a history that ends with what `continue_run` or `fork_run`
    returned, followed at most by messages the caller added.

    A message a run made after it (pydantic-ai stamps its `run_id`) means the history went on in a
    later run: given `result.all_messages()` of a continued run, a run is a new turn, not a continue.
    """
    for message in reversed(messages):
        found = _origins.get(id(message))
        if found is not None and found[0]() is message:
            return found[1], found[2]
        if getattr(message, 'run_id', None) is not None:
            return None
    return None
