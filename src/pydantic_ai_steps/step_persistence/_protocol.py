"""The `StepStore` protocol: what the capability needs from a backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord


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
    idempotency rules; a store with transactions makes it one. The capability uses it, when a
    store offers it and no durability engine journals its calls one by one, to write a step's
    informational events and closed ledger entries together with the next write that must
    happen anyway (a ledger `started` entry or a boundary snapshot), so a tool cycle costs two
    writes instead of eight.
    """

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None: ...
