"""The records a step store keeps: runs, events, snapshots and tool effects.

Plain keyword-only dataclasses rather than pydantic models: they are built on the hot path of
every hook, and stores own their own encodings (see `_codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, get_args

from pydantic_ai.messages import ModelMessage

EventKind = Literal[
    'run_started',
    'run_completed',
    'run_failed',
    'model_request_started',
    'model_request_completed',
    'model_request_failed',
    'tool_call_started',
    'tool_call_completed',
    'tool_call_failed',
]
"""Every boundary the capability records."""

ToolEffectStatus = Literal['started', 'completed', 'failed']
"""A ledger entry whose latest status is `started` was in flight when its process last wrote."""

SnapshotState = Literal['complete', 'interrupted']
"""`complete`: every tool call in the history has its return. `interrupted`: tool work is unsettled."""

EVENT_KINDS: frozenset[str] = frozenset(get_args(EventKind))
TOOL_EFFECT_STATUSES: frozenset[str] = frozenset(get_args(ToolEffectStatus))
SNAPSHOT_STATES: frozenset[str] = frozenset(get_args(SnapshotState))


def utc_now() -> datetime:
    """The one clock every record uses (aware UTC)."""
    return datetime.now(UTC)


@dataclass(kw_only=True)
class StepEvent:
    """One append-only entry of a run's event log."""

    run_id: str
    kind: EventKind
    step_index: int
    timestamp: datetime = field(default_factory=utc_now)
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    error: str | None = None
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    idempotency_key: str | None = None
    """Names the boundary, so a store can drop a replayed append."""


@dataclass(kw_only=True)
class ContinuableSnapshot:
    """A message history that `Agent.run(message_history=...)` can continue from."""

    run_id: str
    step_index: int
    messages: list[ModelMessage]
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    timestamp: datetime = field(default_factory=utc_now)
    state: SnapshotState = 'complete'
    idempotency_key: str | None = None


@dataclass(kw_only=True)
class ToolEffectRecord:
    """The latest known state of one tool call, keyed by `(run_id, tool_call_id)`."""

    tool_call_id: str
    tool_name: str
    run_id: str
    status: ToolEffectStatus
    started_at: datetime = field(default_factory=utc_now)
    ended_at: datetime | None = None
    idempotency_key: str | None = None
    effect_summary: str | None = None


@dataclass(kw_only=True)
class RunRecord:
    """Lineage of one run: which conversation it belongs to and which run delegated it."""

    run_id: str
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    started_at: datetime = field(default_factory=utc_now)
    registration_id: str | None = None
    """The registration that claimed this run id; lets a retried registration pass."""
