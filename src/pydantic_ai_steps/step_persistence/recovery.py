"""`inspect_recovery`: everything needed to decide how to resume a run, read in one call."""

from __future__ import annotations

from dataclasses import dataclass

from ._protocol import StepStore
from ._records import ContinuableSnapshot, ToolEffectRecord


@dataclass(frozen=True, kw_only=True)
class RecoveryInspection:
    """What a crashed or failed run left behind. Reading it executes nothing."""

    latest: ContinuableSnapshot | None
    """The newest snapshot of any state (the interrupted frontier, if the run died mid-cycle)."""
    settled: ContinuableSnapshot | None
    """The newest `complete` snapshot: the safe point to continue from."""
    unresolved: tuple[ToolEffectRecord, ...]
    """Tool calls that started and never finished: their side effects may or may not have happened."""
    completed_tools: tuple[str, ...]
    failed_tools: tuple[str, ...]


async def inspect_recovery(*, store: StepStore, run_id: str) -> RecoveryInspection:
    events = await store.list_events(run_id=run_id)
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    settled = await store.latest_snapshot(run_id=run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)

    def tools(kind: str) -> tuple[str, ...]:
        names = [event.tool_name for event in events if event.kind == kind and event.tool_name]
        return tuple(dict.fromkeys(names))

    return RecoveryInspection(
        latest=latest,
        settled=settled,
        unresolved=tuple(unresolved),
        completed_tools=tools('tool_call_completed'),
        failed_tools=tools('tool_call_failed'),
    )
