"""The records a step store keeps: runs, events, snapshots and tool effects, and the run query.

Plain keyword-only dataclasses rather than pydantic models: they are built on the hot path of
every hook. Their stored form is decided in one place, `store.codec`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

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

RunStatus = Literal['completed', 'failed', 'unfinished']
"""`completed` / `failed` from the run's closing event; `unfinished`: no closing event (still running, or
its process died)."""

EffectResolution = Literal['done', 'not_done']
"""What a person or a program found when checking a tool call left `started` by a crash."""

EVENT_KINDS: frozenset[str] = frozenset(get_args(EventKind))
TOOL_EFFECT_STATUSES: frozenset[str] = frozenset(get_args(ToolEffectStatus))
SNAPSHOT_STATES: frozenset[str] = frozenset(get_args(SnapshotState))
RUN_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))
EFFECT_RESOLUTIONS: frozenset[str] = frozenset(get_args(EffectResolution))
TOOL_ARGS_LIMIT = 8192
"""How much of a tool call's arguments an event keeps (the full call is in the run's snapshots)."""
CLOSING_EVENTS: Mapping[str, RunStatus] = {'run_completed': 'completed', 'run_failed': 'failed'}
"""The events that end a run, and the status each one gives it."""


def utc_now() -> datetime:
    """The one clock every record uses (aware UTC)."""
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True)
class SnapshotRef:
    """Where a history came from: a stored snapshot of a run."""

    run_id: str
    seq: int
    """The snapshot's number within its store (`ContinuableSnapshot.seq`)."""
    step_index: int


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
    tool_args: str | None = None
    """On `tool_call_started`: the call's arguments as JSON text (cut at `TOOL_ARGS_LIMIT` characters)."""


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
    seq: int | None = field(default=None, compare=False)
    """Set on snapshots read from a store: their number there, increasing in write order."""


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
    resolution: EffectResolution | None = None
    """For a call left `started` by a crash: whether its effect was found `done` or `not_done`."""
    resolved_by: str | None = None
    resolved_at: datetime | None = None
    resolution_note: str | None = None

    @property
    def unresolved(self) -> bool:
        """Started, never ended, and not checked since: its side effect may or may not have happened."""
        return self.status == 'started' and self.resolution is None


@dataclass(kw_only=True)
class RunRecord:
    """Lineage of one run: which conversation it belongs to and which run delegated it."""

    run_id: str
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    started_at: datetime = field(default_factory=utc_now)
    parent_tool_call_id: str | None = None
    """The tool call of the parent run that started this delegate."""
    registration_id: str | None = None
    """The registration that claimed this run id; lets a retried registration pass."""
    pydantic_ai_run_id: str | None = None
    """pydantic-ai's own id of the run (`AgentRunResult.run_id`, `RunContext.run_id`)."""
    run_metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    """`Agent.run(metadata=...)`: JSON values."""
    continued_from: SnapshotRef | None = None
    """The snapshot whose history `continue_run` gave this run."""
    forked_from: SnapshotRef | None = None
    """The snapshot whose history `fork_run` gave this run."""
    status: RunStatus | None = field(default=None, compare=False)
    """Read-only: set on records read from a store, from the run's closing event."""
    ended_at: datetime | None = field(default=None, compare=False)
    """Read-only: when the closing event was written."""


RUN_EQUALITY_FIELDS = ('conversation_id', 'parent_run_id', 'agent_name', 'pydantic_ai_run_id')
"""The string fields `list_runs` filters by equality: the ones every backend indexes."""


@dataclass(frozen=True, kw_only=True)
class RunQuery:
    """Which runs `list_runs` returns, in what order, how many. Every filter is an equality or a bound, AND-ed."""

    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    status: RunStatus | None = None
    started_after: datetime | None = None
    """Runs started at or after this instant."""
    started_before: datetime | None = None
    """Runs started strictly before this instant."""
    ended_before: datetime | None = None
    """Closed runs whose closing event is strictly before this instant."""
    metadata: Mapping[str, str] | None = None
    """Each key equals in `RunRecord.metadata`."""
    run_metadata: Mapping[str, str | int | float | bool | None] | None = None
    """Each key equals in `RunRecord.run_metadata` (scalar JSON values only)."""
    pydantic_ai_run_id: str | None = None
    newest_first: bool = False
    limit: int | None = None

    def equalities(self) -> dict[str, str]:
        """The given `RUN_EQUALITY_FIELDS` filters, by name."""
        return {name: value for name in RUN_EQUALITY_FIELDS if (value := getattr(self, name)) is not None}

    def matches(self, record: RunRecord) -> bool:
        """Whether `record` passes every filter (the order and the limit are not filters)."""
        if self.conversation_id is not None and record.conversation_id != self.conversation_id:
            return False
        if self.parent_run_id is not None and record.parent_run_id != self.parent_run_id:
            return False
        if self.agent_name is not None and record.agent_name != self.agent_name:
            return False
        if self.pydantic_ai_run_id is not None and record.pydantic_ai_run_id != self.pydantic_ai_run_id:
            return False
        if self.status is not None and (record.status or 'unfinished') != self.status:
            return False
        if self.started_after is not None and record.started_at < self.started_after:
            return False
        if self.started_before is not None and record.started_at >= self.started_before:
            return False
        if self.ended_before is not None and (record.ended_at is None or record.ended_at >= self.ended_before):
            return False
        if self.metadata and any(record.metadata.get(key, _MISSING) != value for key, value in self.metadata.items()):
            return False
        return not self.run_metadata or all(
            key in record.run_metadata and _same_json(record.run_metadata[key], value)
            for key, value in self.run_metadata.items()
        )

    def apply(self, records: Sequence[RunRecord]) -> list[RunRecord]:
        """Filter, order by start time (oldest first unless `newest_first`), and cut to `limit`.

        Runs that started at the same time keep the order of `records`, which a backend gives in
        registration order (reversed for `newest_first`): newest first is then exactly the reverse
        of oldest first, in every store, so a `limit` or `prune(keep_last=)` keeps the same runs.
        """
        matching = [record for record in records if self.matches(record)]
        matching.sort(key=lambda record: record.started_at, reverse=self.newest_first)
        return matching if self.limit is None else matching[: self.limit]


_MISSING = object()


def _same_json(stored: object, wanted: object) -> bool:
    """JSON equality of two scalars: `1 == 1.0`, but `true` is not `1`."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is type(wanted) and stored == wanted
    return stored == wanted
