"""Reading a store for the inspector: run status, run trees, the effect ledger, store totals.

Everything here goes through the store's public methods (`ManagedStepStore`), so the inspector
works on every backend, including ones written outside this package. Nothing here formats output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..step_persistence import RunRecord, StepEvent, ToolEffectRecord
from ..store.protocol import ManagedStepStore
from ._errors import CliError

RunStatus = Literal['completed', 'failed', 'unfinished']

STATUS_HELP = """\
run status, derived from the run's event log:
  completed   the last event is run_completed
  failed      the last event is run_failed (its error says why)
  unfinished  no closing event: the run is still going, or its process died (a crash or a kill)
              before it could write one; `effects RUN --unresolved` lists tool calls it left in flight
steps: the number of model requests the run made"""

Progress = Callable[[int, int], None]
"""Called with `(done, total)` while a long read goes on (the CLI draws it on a terminal)."""


def _no_progress(done: int, total: int) -> None:
    del done, total


def run_status(events: Sequence[StepEvent]) -> RunStatus:
    """`completed`/`failed` from the closing event; anything else is `unfinished`.

    The store cannot tell a live run from a dead one (no heartbeat is recorded), so the word
    says only what the log shows: it did not finish.
    """
    if events and events[-1].kind == 'run_completed':
        return 'completed'
    if events and events[-1].kind == 'run_failed':
        return 'failed'
    return 'unfinished'


@dataclass(kw_only=True)
class RunSummary:
    """One run with what its events say about it."""

    record: RunRecord
    status: RunStatus
    steps: int
    events: int
    unresolved_effects: int
    error: str | None
    """The error of the closing `run_failed` event, if that is how the run ended."""
    children: list[RunSummary] = field(default_factory=list['RunSummary'])


async def summarize(store: ManagedStepStore, record: RunRecord) -> RunSummary:
    events = await store.list_events(run_id=record.run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=record.run_id)
    status = run_status(events)  # the log itself, so a damaged or foreign run record cannot mislead
    return RunSummary(
        record=record,
        status=status,
        steps=sum(1 for event in events if event.kind == 'model_request_started'),
        events=len(events),
        unresolved_effects=len(unresolved),
        error=events[-1].error if status == 'failed' else None,
    )


async def list_summaries(
    store: ManagedStepStore,
    *,
    conversation_id: str | None = None,
    parent_run_id: str | None = None,
    agent_name: str | None = None,
    status: RunStatus | None = None,
    limit: int | None = None,
    progress: Progress = _no_progress,
) -> list[RunSummary]:
    """Runs matching every given filter, oldest first; with `limit`, the newest `limit` of them."""
    records = await store.list_runs(
        conversation_id=conversation_id,
        parent_run_id=parent_run_id,
        agent_name=agent_name,
        status=status,
        newest_first=limit is not None,
        limit=limit,
    )
    if limit is not None:
        records.reverse()
    summaries: list[RunSummary] = []
    for record in records:
        summaries.append(await summarize(store, record))
        progress(len(summaries), len(records))
    return summaries


async def require_run(store: ManagedStepStore, run_id: str, store_url: str) -> RunRecord | None:
    """The run's record; `CliError` when the store knows nothing of `run_id`.

    A run with events but no record (a record lost to damage) is still inspectable, so only a
    run with neither is unknown.
    """
    record = await store.get_run(run_id=run_id)
    if record is None and not await store.list_events(run_id=run_id):
        raise CliError(f'no run {run_id!r} in {store_url} (`pydantic-ai-steps runs --store {store_url}` lists them)')
    return record


async def resolve_run(store: ManagedStepStore, text: str, store_url: str) -> tuple[str, RunRecord | None]:
    """The run `text` names: its id, or a prefix of exactly one id (an ambiguous one lists its matches).

    A blank `text` names no run: as a prefix it would match every id (an unset shell variable
    would then pick a store's only run, for `delete` too).
    """
    if not text.strip():
        raise CliError(f'{text!r} names no run: give a run id or the start of one')
    record = await store.get_run(run_id=text)
    if record is not None or await store.list_events(run_id=text):
        return text, record
    matches = [run for run in await store.list_runs() if run.run_id.startswith(text)]
    if len(matches) == 1:
        return matches[0].run_id, matches[0]
    if len(matches) > 1:
        shown = ', '.join(run.run_id for run in matches[:8]) + (', ...' if len(matches) > 8 else '')
        raise CliError(f'{text!r} is the start of {len(matches)} run ids: {shown}; give more of it')
    raise CliError(f'no run {text!r} in {store_url} (`pydantic-ai-steps runs --store {store_url}` lists them)')


async def run_tree(
    store: ManagedStepStore, *, root_run_id: str | None = None, progress: Progress = _no_progress
) -> list[RunSummary]:
    """Runs nested under their `parent_run_id`; roots are runs whose parent is not in the store.

    With `root_run_id`, only that run and its descendants.
    """
    summaries = await list_summaries(store, progress=progress)
    by_id = {summary.record.run_id: summary for summary in summaries}
    roots: list[RunSummary] = []
    for summary in summaries:
        parent = by_id.get(summary.record.parent_run_id or '')
        if parent is not None and not _is_ancestor(summary, parent, by_id):
            parent.children.append(summary)
        else:
            roots.append(summary)
    if root_run_id is None:
        return roots
    return [by_id[root_run_id]] if root_run_id in by_id else []


def _is_ancestor(candidate: RunSummary, node: RunSummary, by_id: dict[str, RunSummary]) -> bool:
    """Whether `candidate` is `node` or above it: a damaged store with a parent cycle must not hang."""
    seen: set[str] = set()
    current: RunSummary | None = node
    while current is not None and current.record.run_id not in seen:
        if current is candidate:
            return True
        seen.add(current.record.run_id)
        current = by_id.get(current.record.parent_run_id or '')
    return False


async def tool_effects(store: ManagedStepStore, run_id: str, *, unresolved_only: bool) -> list[ToolEffectRecord]:
    """The ledger of one run, in the order its tool calls started."""
    if unresolved_only:
        return await store.list_unresolved_tool_effects(run_id=run_id)
    return await store.list_tool_effects(run_id=run_id)


@dataclass(kw_only=True)
class StoreStats:
    runs: int
    events: int
    snapshots: int
    interrupted_snapshots: int
    unresolved_effects: int
    bytes_on_disk: int | None
    media_blobs: int | None


async def store_stats(
    store: ManagedStepStore, *, bytes_on_disk: int | None, media_blobs: int | None, progress: Progress = _no_progress
) -> StoreStats:
    """Totals over every run; reads each run's log and snapshots, hence the progress callback."""
    records = await store.list_runs()
    events = snapshots = interrupted = unresolved = 0
    for done, record in enumerate(records, start=1):
        events += len(await store.list_events(run_id=record.run_id))
        stored = await store.list_snapshots(run_id=record.run_id, include_interrupted=True)
        snapshots += len(stored)
        interrupted += sum(1 for snapshot in stored if snapshot.state == 'interrupted')
        unresolved += len(await store.list_unresolved_tool_effects(run_id=record.run_id))
        progress(done, len(records))
    return StoreStats(
        runs=len(records),
        events=events,
        snapshots=snapshots,
        interrupted_snapshots=interrupted,
        unresolved_effects=unresolved,
        bytes_on_disk=bytes_on_disk,
        media_blobs=media_blobs,
    )
