"""`StepStoreBase`: every public store method, once, on top of a `Backend`.

The base owns every rule a store has: argument and record checks, run-id rules, the record
encoding (through the backend's `Encoding`), the message-once encoder and its stale retry, media
offload, decoding with skip-and-warn, fallback reads, retention, deletion and pruning. A backend
(`store.backend`) only moves rows. This module holds the writes; the record checks are
`store.record_checks`, and the reads (`store.reads`) and the retention, deletion and
garbage-collection methods (`store.maintenance`) are mixins this class inherits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal, cast

from .._closing import AsyncClosing
from .._errors import (
    EffectAlreadyResolvedError,
    check_bool,
    check_max_snapshots,
    check_optional_text,
    check_threshold,
    shortened,
)
from .._records import (
    CLOSING_EVENTS,
    EFFECT_RESOLUTIONS,
    ContinuableSnapshot,
    EffectResolution,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    utc_now,
)
from ..media._protocol import MediaStore
from . import codec
from .backend import STALE, Backend, Closing, CommitOutcome, Probe, SnapshotWrite, WriteBatch
from .maintenance import Maintenance
from .message_log import DEFAULT_MEDIA_THRESHOLD, MessageLog, PreparedSnapshot
from .patch import is_patch
from .protocol import DeltaOutcome, SnapshotDelta
from .reads import Reads
from .record_checks import checked_delta, checked_effect, checked_event, checked_query, checked_run, checked_snapshot
from .retention import snapshots_to_keep

_RESOLVE_ATTEMPTS = 3
"""Reads of an entry `resolve_tool_effect` makes before it gives up on one that keeps changing."""

MediaChoice = MediaStore | Literal['auto'] | None
"""A store's `media_store=` argument: a media store, `'auto'` (the backend's default), or `None` (inline)."""


class StepStoreBase(Reads, Maintenance, AsyncClosing):
    """A `StepStore` (and `RecordBatchStore`) over any `Backend`.

    ```python
    store = StepStoreBase(MyBackend(), media_store=DiskMediaStore('media'))
    ```

    The shipped stores are subclasses that build their backend and default media store. Payloads
    of `media_threshold_bytes` or more go to `media_store` (`None` keeps them inline).
    `max_snapshots_per_run` keeps the N newest snapshots of a run plus its newest `complete` one;
    `max_run_age` is the age `prune()` removes runs at when called without `older_than=`. Every
    store is an async context manager; `aclose()` releases the backend (and a media store the
    store created itself) and may be called twice.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | None = None,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD,
        max_run_age: timedelta | None = None,
        owns_media_store: bool = False,
    ) -> None:
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        threshold = check_threshold(media_threshold_bytes)
        if max_run_age is not None and (not isinstance(max_run_age, timedelta) or max_run_age <= timedelta(0)):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'max_run_age must be a positive timedelta or None, got {max_run_age!r}')
        self.max_run_age = max_run_age
        if media_store is not None and not all(callable(getattr(media_store, name, None)) for name in ('put', 'get')):
            raise TypeError(  # the type only: a value given here by mistake may hold credentials
                'media_store must be a media store (an object with async put() and get()) or None '
                f"('auto' too, in a store with a default one), got {type(media_store).__name__}"
            )
        self.media_store = media_store
        self._backend = backend
        self._encoding = backend.encoding
        self._log = MessageLog(media_store, threshold, getattr(backend, 'max_text_bytes', None))
        self._owns_media = owns_media_store and media_store is not None

    @property
    def backend(self) -> Backend:
        """The backend this store writes through."""
        return self._backend

    @property
    def media_threshold_bytes(self) -> int:
        """Payloads at least this large go to `media_store`."""
        return self._log.threshold_bytes

    async def probe(self) -> Probe:
        """What is at the store's location, creating nothing (for tools that inspect stores)."""
        return await self._backend.probe()

    # --- lifecycle --------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release the backend and a media store this store created. Idempotent; a store whose
        backend reopens on demand (SQLite, files) may be used again afterwards."""
        await self._backend.aclose()
        if self._owns_media:
            close = getattr(self.media_store, 'aclose', None)
            if close is not None:
                await close()

    # --- writes -----------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        await self.write_records(run=record)

    async def append_event(self, event: StepEvent) -> None:
        await self.write_records(events=(event,))

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.write_records(snapshot=snapshot)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self.write_records(tool_effects=(record,))

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None:
        """The run, the snapshot, the tool effects, then the events, as one unit where the backend allows.

        Every record is checked before anything is written: a bad field raises `InvalidRecordError`
        (a `ValueError`) naming it. A registration whose run id is taken raises
        `RunAlreadyExistsError` and writes nothing; records of a run the store does not hold raise
        `RunNotFoundError`.
        """
        run_ids: set[str] = set()
        batch = self._batch(run, tool_effects, events, run_ids)
        if snapshot is None:
            if batch.run is None and not batch.tool_effects and not batch.events:
                return
            await self._backend.commit(batch)
        else:
            checked_snapshot(snapshot, run_ids)
            batch.run_ids = frozenset(run_ids)
            outcome = await self._commit_snapshot(snapshot, batch)
            if isinstance(outcome, int) and self.max_snapshots_per_run is not None:
                await self._apply_retention(snapshot.run_id, self.max_snapshots_per_run)
        await self._after_closings(batch.closings)

    async def write_snapshot_delta(
        self,
        delta: SnapshotDelta,
        *,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> DeltaOutcome:
        """Write a snapshot given as a delta of its run's message log, with records, as one unit.

        See `DeltaSnapshotStore`: full texts are stored as given unless a payload moves to the media
        store, patches as given; a stale delta writes nothing. Every record is checked first.
        """
        run_ids = {delta.run_id}
        checked_delta(delta)
        batch = self._batch(None, tool_effects, events, run_ids)
        appends: list[tuple[int, str]] = []
        verbatim: list[int] = []
        for offset, (position, text) in enumerate(delta.appends):
            if is_patch(text):
                appends.append((position, text))
                continue
            stored = await self._log.stored_text(text, delta, offset)
            if stored == text:
                verbatim.append(offset)
            appends.append((position, stored))
        meta = ContinuableSnapshot(
            run_id=delta.run_id,
            step_index=delta.step_index,
            messages=[],
            conversation_id=delta.conversation_id,
            parent_run_id=delta.parent_run_id,
            agent_name=delta.agent_name,
            timestamp=delta.timestamp,
            state=delta.state,
            idempotency_key=delta.idempotency_key,
        )
        batch.snapshot = SnapshotWrite(
            run_id=delta.run_id,
            row=self._encoding.snapshot(meta, delta.message_count, None),
            appends=appends,
            expected_log_size=delta.expected_log_size,
            key=delta.idempotency_key,
        )
        outcome = await self._backend.commit(batch)
        if outcome == STALE:
            return DeltaOutcome(None)
        self._log.forget(delta.run_id)  # the log grew without this process's encoder
        if isinstance(outcome, int):
            log_size = outcome
            if self.max_snapshots_per_run is not None:
                await self._apply_retention(delta.run_id, self.max_snapshots_per_run)
        elif delta.expected_log_size is not None:  # suppressed: the first write of this key appended these
            log_size = delta.expected_log_size + len(appends)
        else:
            log_size = await self._log_end(delta.run_id)
        await self._after_closings(batch.closings)
        return DeltaOutcome(log_size, tuple(verbatim))

    def _batch(
        self,
        run: RunRecord | None,
        tool_effects: Sequence[ToolEffectRecord],
        events: Sequence[StepEvent],
        run_ids: set[str],
    ) -> WriteBatch:
        """The records of a write, checked and encoded (`run_ids` collects the runs they belong to)."""
        encoding = self._encoding
        run_row = None
        if run is not None:
            run_row = encoding.run(checked_run(run))
            run_ids.add(run.run_id)
        effect_rows = [encoding.effect(checked_effect(record, run_ids)) for record in tool_effects]
        event_rows: list[codec.Row] = []
        closings: list[Closing] = []
        for event in events:
            event_rows.append(encoding.event(checked_event(event, run_ids)))
            status = CLOSING_EVENTS.get(event.kind)
            if status is not None:
                closings.append(Closing(event.run_id, status, encoding.time(event.timestamp)))
        return WriteBatch(
            run=run_row, tool_effects=effect_rows, events=event_rows, closings=closings, run_ids=frozenset(run_ids)
        )

    async def _after_closings(self, closings: Sequence[Closing]) -> None:
        for closing in closings:
            self._log.forget(closing.run_id)  # a closed run is never written again
            if self.max_snapshots_per_run is not None:
                await self.compact_run(closing.run_id)  # retention left superseded versions behind

    async def _log_end(self, run_id: str) -> int:
        """Where the run's message log ends (read in full: only a retried first write asks)."""
        log = await self._backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
        end = max((entry.index + 1 for entry in log.entries), default=0)
        return max(end, *(gap.stop for gap in log.missing), log.readable_end or 0)

    async def _commit_snapshot(self, snapshot: ContinuableSnapshot, batch: WriteBatch) -> CommitOutcome:
        """The message log prepares the snapshot (and redoes it when stale); the backend commits it."""

        async def write(prepared: PreparedSnapshot) -> CommitOutcome:
            batch.snapshot = self._snapshot_write(prepared)
            return await self._backend.commit(batch)

        outcome = await self._log.save(snapshot, write)
        return cast(CommitOutcome, outcome)

    def _snapshot_write(self, prepared: PreparedSnapshot) -> SnapshotWrite:
        snapshot = prepared.snapshot
        return SnapshotWrite(
            run_id=snapshot.run_id,
            row=self._encoding.snapshot(snapshot, prepared.message_count, None),
            appends=prepared.appends,
            expected_log_size=prepared.known_log_size,
            key=snapshot.idempotency_key,
        )

    async def _apply_retention(self, run_id: str, limit: int) -> None:
        """Delete what the keep rule drops; a snapshot whose state cannot be read is kept, outside the rule."""
        known: list[tuple[int, SnapshotState]] = []
        for seq, state in await self._backend.fetch_snapshot_states(run_id):
            with contextlib.suppress(ValueError):
                known.append((seq, codec.snapshot_state(state)))
        keep = snapshots_to_keep(known, limit)
        if keep is not None:
            await self._backend.delete_snapshots(run_id, [seq for seq, _ in known if seq not in keep])

    # --- tool effects: resolving what a crash left unknown --------------------------------

    async def resolve_tool_effect(
        self,
        *,
        run_id: str,
        tool_call_id: str,
        outcome: EffectResolution,
        by: str | None = None,
        note: str | None = None,
        replace: bool = False,
    ) -> ToolEffectRecord:
        """Record that a call left `started` was checked: its effect was `'done'` or `'not_done'`.

        The entry keeps its status and everything it said; the resolution is added to it, so the
        ledger still shows what the crash left, and `list_unresolved_tool_effects` stops listing it.
        A call is resolved once: resolving it again raises `EffectAlreadyResolvedError` naming the
        resolution that stands, unless `replace=True`, which overwrites it (an entry holds one
        resolution). Only the resolution is written, and only while the entry is as read, so a
        late `completed` write keeps its status and of two resolutions racing, the second is refused.
        """
        if outcome not in EFFECT_RESOLUTIONS:
            raise ValueError(f'outcome must be one of {sorted(EFFECT_RESOLUTIONS)}, got {shortened(outcome)}')
        check_optional_text(by, 'by')
        check_optional_text(note, 'note')
        check_bool(replace, 'replace')
        resolved_at = utc_now()
        for _ in range(_RESOLVE_ATTEMPTS):
            found = await self.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
            entry = _resolvable(found, run_id, tool_call_id, replace=replace)
            entry.resolution = outcome
            entry.resolved_by = by
            entry.resolved_at = resolved_at
            entry.resolution_note = note
            resolution = self._encoding.resolution(entry)
            if await self._backend.resolve_effect(run_id, tool_call_id, resolution, overwrite=replace):
                return entry
            # The entry changed since it was read: read it again, and say what it is now.
        raise RuntimeError(
            f'tool call {tool_call_id!r} of run {run_id!r} kept changing while it was being resolved; try again'
        )


def _resolvable(entry: ToolEffectRecord | None, run_id: str, tool_call_id: str, *, replace: bool) -> ToolEffectRecord:
    """The rule of `resolve_tool_effect`: only an entry left `started`, and only once unless `replace`."""
    if entry is None:
        raise LookupError(f'run {run_id!r} has no tool call {tool_call_id!r} in its ledger')
    if entry.status != 'started':
        raise ValueError(
            f'tool call {tool_call_id!r} of run {run_id!r} ended {entry.status!r}: only a call left '
            "'started' (unknown after a crash) needs resolving"
        )
    if entry.resolution is not None and not replace:
        raise EffectAlreadyResolvedError(
            run_id=run_id,
            tool_call_id=tool_call_id,
            resolution=entry.resolution,
            resolved_by=entry.resolved_by,
            resolved_at=entry.resolved_at,
            resolution_note=entry.resolution_note,
        )
    return entry


__all__ = ['MediaChoice', 'StepStoreBase', 'checked_query']
