"""What the capability needs from a store (`StepStore`), and what the library offers on top of it.

- `StepStore`: the ten methods of the published protocol. Any object with them works with the
  capability and the helpers.
- `RecordBatchStore`: a `StepStore` that writes several records as one unit (`write_records`);
  the capability then writes a tool cycle in two writes instead of eight.
- `DeltaSnapshotStore`: a `RecordBatchStore` that also takes a snapshot as what it adds to the
  run's message log (`write_snapshot_delta`), computed by the writer. Under a durability engine
  the capability decides the delta in workflow code, so what each durable operation carries is
  what is new, not the whole history.
- `ManagedStepStore`: everything a store built on `StepStoreBase` offers (every shipped store):
  queries, the whole ledger and its resolutions, deletion, pruning, garbage collection and its
  lifecycle. The CLI works with these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from .._records import (
    ContinuableSnapshot,
    EffectResolution,
    RunQuery,
    RunRecord,
    RunStatus,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    utc_now,
)

if TYPE_CHECKING:
    from ..media._protocol import MediaStore
    from .backend import Probe
    from .maintenance import GarbageResult, PruneResult


@runtime_checkable
class StepStore(Protocol):
    """An async store of runs, events, snapshots and tool effects.

    The contract every shipped store meets, and `pydantic_ai_steps.testing.step_store` checks:

    - `register_run` raises `RunAlreadyExistsError` (a `ValueError`) for a run id already stored.
    - `list_runs` filters by equality (both filters AND-ed) and sorts by `started_at`, oldest first.
    - `append_event` and `save_snapshot` apply a non-null `idempotency_key` at most once per run,
      even after the snapshot it named was pruned.
    - `latest_snapshot` returns the newest `complete` snapshot, or the newest of any state with
      `include_interrupted=True`; `None` when there is none.
    - `record_tool_effect` upserts by `(run_id, tool_call_id)`; the last write wins.
    - Readers skip a damaged record with a logged warning instead of raising.
    """

    async def register_run(self, record: RunRecord) -> None: ...

    async def get_run(self, *, run_id: str) -> RunRecord | None: ...

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]: ...

    async def append_event(self, event: StepEvent) -> None: ...

    async def list_events(self, *, run_id: str) -> list[StepEvent]: ...

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None: ...

    async def latest_snapshot(
        self, *, run_id: str, include_interrupted: bool = False
    ) -> ContinuableSnapshot | None: ...

    async def record_tool_effect(self, record: ToolEffectRecord) -> None: ...

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None: ...

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]: ...


@runtime_checkable
class RecordBatchStore(StepStore, Protocol):
    """A `StepStore` that can also write several records as one unit (optional).

    `write_records` must be equivalent to `register_run(run)` (raising `RunAlreadyExistsError`
    before anything else is written), then `save_snapshot(snapshot)`, then `record_tool_effect`
    for each tool effect, then `append_event` for each event, in that order, with the same
    idempotency rules; a store with transactions makes it one. The capability uses it to write a
    step's informational events and closed ledger entries together with the next write that must
    happen anyway (a ledger `started` entry or a boundary snapshot), so a tool cycle costs two
    writes instead of eight; under a durability engine each such write is one durable operation.
    """

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SnapshotDelta:
    """A snapshot given as what it adds to its run's message log (see `store.history`).

    The snapshot's history has `message_count` messages. `appends` are `(position, text)` entries
    for the positions that are new or changed since the run's previous snapshot, in the order they
    are to be appended; every other position keeps its newest entry in the log. A text is a full
    message JSON (`store.history.message_to_json`) or a patch (`store.patch.make_patch`) of a
    full text of the same position that this store reported stored verbatim
    (`DeltaOutcome.verbatim`). `expected_log_size` is where the writer last saw the log end (the
    `log_size` of its previous delta), `None` for a first or a complete write.
    """

    run_id: str
    step_index: int
    message_count: int
    appends: Sequence[tuple[int, str]]
    expected_log_size: int | None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    state: SnapshotState = 'complete'
    timestamp: datetime = field(default_factory=utc_now)
    idempotency_key: str | None = None


@dataclass(frozen=True)
class DeltaOutcome:
    """What `write_snapshot_delta` did."""

    log_size: int | None
    """The run's log size after the delta's appends; `None` when the delta was stale: the log did not
    end at `expected_log_size`, and nothing at all was written."""
    verbatim: tuple[int, ...] = ()
    """Offsets in `appends` of the full texts stored exactly as given (no media moved out of them):
    the texts a later delta may patch."""


@runtime_checkable
class DeltaSnapshotStore(RecordBatchStore, Protocol):
    """A `RecordBatchStore` that also writes a snapshot given as a delta of its run's message log (optional).

    `write_snapshot_delta(delta, tool_effects=, events=)` is `write_records(snapshot=..., ...)` for
    the snapshot the delta describes, as one unit, with these differences:

    - the store serializes nothing: full texts are stored as given, except as a media walk
      leaves them (payloads at or above its media threshold move to its media store, and a
      caller's value spelled like a media marker is wrapped as a literal, so it reads back as
      written); patches are stored as given (their writer wraps such values itself);
    - a stale delta (the log does not end at `expected_log_size`) writes nothing and answers
      `log_size=None`: the writer then sends the whole history (every position, no expectation);
    - a delta whose snapshot idempotency key was claimed before (a retried write that committed)
      writes its other records and answers the log size that first write left.

    Used by the capability under a durability engine; the shipped stores offer it.
    """

    async def write_snapshot_delta(
        self,
        delta: SnapshotDelta,
        *,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> DeltaOutcome: ...


@runtime_checkable
class ManagedStepStore(RecordBatchStore, Protocol):
    """Every method of a store built on `StepStoreBase`: what the CLI and the recovery helpers use."""

    async def list_runs(  # pyright: ignore[reportIncompatibleMethodOverride]
        self,
        *,
        parent_run_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        status: RunStatus | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        metadata: Mapping[str, str] | None = None,
        run_metadata: Mapping[str, str | int | float | bool | None] | None = None,
        pydantic_ai_run_id: str | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[RunRecord]: ...

    async def query_runs(self, query: RunQuery) -> list[RunRecord]: ...

    async def list_unreadable_runs(self) -> list[str]: ...

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]: ...

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]: ...

    async def resolve_tool_effect(
        self,
        *,
        run_id: str,
        tool_call_id: str,
        outcome: EffectResolution,
        by: str | None = None,
        note: str | None = None,
        replace: bool = False,
    ) -> ToolEffectRecord: ...

    async def delete_run(self, run_id: str, *, include_delegates: bool = False) -> list[str]: ...

    async def delete_conversation(self, conversation_id: str, *, include_delegates: bool = False) -> list[str]: ...

    async def prune(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        dry_run: bool = False,
    ) -> PruneResult: ...

    async def collect_garbage(
        self, *, grace: timedelta = ..., dry_run: bool = False, writers_stopped: bool = False
    ) -> GarbageResult: ...

    async def probe(self) -> Probe: ...

    @property
    def media_store(self) -> MediaStore | None: ...

    @property
    def media_threshold_bytes(self) -> int: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
