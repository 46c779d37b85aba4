"""What every conformance test builds on: ids, a clock, small histories, and registration."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from .._records import ContinuableSnapshot, RunRecord
from ..store.protocol import StepStore

StoreFactory = Callable[..., StepStore]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_ids = itertools.count()


def new_run_id(prefix: str = 'run') -> str:
    return f'{prefix}-{next(_ids)}'


async def new_run(store: StepStore, prefix: str = 'run', **fields: Any) -> str:
    """Register a fresh run (records are only written for a registered run) and return its id."""
    run_id = new_run_id(prefix)
    fields.setdefault('started_at', T0)
    await store.register_run(RunRecord(run_id=run_id, **fields))
    return run_id


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def tool_cycle(call_id: str = 'c1', prompt: str = 'hi') -> list[ModelMessage]:
    """A settled history: prompt, tool call, tool return."""
    return [
        ModelRequest(parts=[UserPromptPart(prompt, timestamp=T0)], timestamp=T0),
        ModelResponse(parts=[ToolCallPart('lookup', {'q': prompt}, tool_call_id=call_id)], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart('lookup', 'found', tool_call_id=call_id, timestamp=T0)], timestamp=T0),
    ]


def snapshot(run_id: str, messages: list[ModelMessage], **fields: Any) -> ContinuableSnapshot:
    fields.setdefault('step_index', 1)
    return ContinuableSnapshot(run_id=run_id, messages=messages, **fields)


async def all_snapshots(
    store: StepStore, run_id: str, *, include_interrupted: bool = False
) -> list[ContinuableSnapshot]:
    """Every retained snapshot, oldest first: `list_snapshots`, which every shipped store has."""
    lister: Any = getattr(store, 'list_snapshots')  # noqa: B009 - outside the published protocol
    return await lister(run_id=run_id, include_interrupted=include_interrupted)
