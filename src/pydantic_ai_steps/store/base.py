"""`StepStoreBase`: every public store method, once, on top of a `Backend`.

The base owns every rule a store has: argument and record checks, run-id rules, the record
encoding (through the backend's `Encoding`), the message-once encoder and its stale retry, media
offload, decoding with skip-and-warn, fallback reads, retention, deletion and pruning. A backend
(`store.backend`) only moves rows. The retention, deletion and garbage-collection methods live in
`store.maintenance`, which this class mixes in.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, Self, cast

from .._errors import (
    InvalidRecordError,
    check_json_map,
    check_max_snapshots,
    check_optional_str,
    check_run_id,
    check_str_map,
    check_threshold,
)
from .._records import (
    CLOSING_EVENTS,
    EFFECT_RESOLUTIONS,
    EVENT_KINDS,
    SNAPSHOT_STATES,
    TOOL_EFFECT_STATUSES,
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
from ..media._protocol import MediaStore
from . import codec
from .backend import (
    STALE,
    Backend,
    Closing,
    CommitOutcome,
    Damaged,
    LogSlice,
    Probe,
    SnapshotRow,
    SnapshotWrite,
    WriteBatch,
)
from .history import is_patch, resolve_log
from .maintenance import Maintenance
from .message_log import DEFAULT_MEDIA_THRESHOLD, MessageLog, PreparedSnapshot
from .protocol import DeltaOutcome, SnapshotDelta
from .retention import snapshots_to_keep

logger = logging.getLogger('pydantic_ai_steps')

MediaChoice = MediaStore | Literal['auto'] | None
"""A store's `media_store=` argument: a media store, `'auto'` (the backend's default), or `None` (inline)."""


class StepStoreBase(Maintenance):
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

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
            _checked_snapshot(snapshot, run_ids)
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
        _checked_delta(delta)
        batch = self._batch(None, tool_effects, events, run_ids)
        appends: list[tuple[int, str]] = []
        verbatim: list[int] = []
        for offset, (position, text) in enumerate(delta.appends):
            if is_patch(text):
                appends.append((position, text))
                continue
            stored = await self._log.stored_text(text)
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
            run_row = encoding.run(_checked_run(run))
            run_ids.add(run.run_id)
        effect_rows = [encoding.effect(_checked_effect(record, run_ids)) for record in tool_effects]
        event_rows: list[codec.Row] = []
        closings: list[Closing] = []
        for event in events:
            event_rows.append(encoding.event(_checked_event(event, run_ids)))
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

    # --- runs -------------------------------------------------------------------------------

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        row = await self._backend.fetch_run(run_id)
        return None if row is None else _decoded(codec.decode_run, row, f'run record of {run_id!r}')

    async def list_runs(
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
    ) -> list[RunRecord]:
        """Runs matching every given filter, oldest first (newest first if asked), at most `limit`."""
        query = checked_query(
            RunQuery(
                conversation_id=conversation_id,
                parent_run_id=parent_run_id,
                agent_name=agent_name,
                status=status,
                started_after=started_after,
                started_before=started_before,
                metadata=metadata,
                run_metadata=run_metadata,
                pydantic_ai_run_id=pydantic_ai_run_id,
                newest_first=newest_first,
                limit=limit,
            )
        )
        return await self.query_runs(query)

    async def query_runs(self, query: RunQuery) -> list[RunRecord]:
        """`list_runs` with a prepared `RunQuery`."""
        rows = await self._backend.fetch_runs(query)
        records = [record for row in rows if (record := _decoded(codec.decode_run, row, 'run record')) is not None]
        return query.apply(records)

    # --- events -----------------------------------------------------------------------------

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        rows = await self._backend.fetch_events(run_id)
        where = f'event of run {run_id!r}'
        return [event for row in rows if (event := _decoded(codec.decode_event, row, where)) is not None]

    # --- tool effects -----------------------------------------------------------------------

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        rows = await self._backend.fetch_effects(run_id, tool_call_id=tool_call_id)
        found = self._effects(rows, run_id)
        return found[-1] if found else None

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        """Calls that started and never ended, and were not checked since (`resolve_tool_effect`)."""
        rows = await self._backend.fetch_effects(run_id, unresolved_only=True)
        return [record for record in self._effects(rows, run_id) if record.unresolved]

    async def list_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        """The run's whole ledger, in the order the calls were first recorded."""
        return self._effects(await self._backend.fetch_effects(run_id), run_id)

    async def resolve_tool_effect(
        self,
        *,
        run_id: str,
        tool_call_id: str,
        outcome: EffectResolution,
        by: str | None = None,
        note: str | None = None,
    ) -> ToolEffectRecord:
        """Record that a call left `started` was checked: its effect was `'done'` or `'not_done'`.

        The entry keeps its status and everything it said; the resolution is added to it, so the
        ledger still shows what the crash left, and `list_unresolved_tool_effects` stops listing it.
        """
        if outcome not in EFFECT_RESOLUTIONS:
            raise ValueError(f'outcome must be one of {sorted(EFFECT_RESOLUTIONS)}, got {outcome!r}')
        check_optional_str(by, 'by')
        check_optional_str(note, 'note')
        entry = await self.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
        if entry is None:
            raise LookupError(f'run {run_id!r} has no tool call {tool_call_id!r} in its ledger')
        if entry.status != 'started':
            raise ValueError(
                f'tool call {tool_call_id!r} of run {run_id!r} ended {entry.status!r}: only a call left '
                "'started' (unknown after a crash) needs resolving"
            )
        entry.resolution = outcome
        entry.resolved_by = by
        entry.resolved_at = utc_now()
        entry.resolution_note = note
        await self.write_records(tool_effects=(entry,))
        return entry

    def _effects(self, rows: Sequence[codec.Row | Damaged], run_id: str) -> list[ToolEffectRecord]:
        where = f'tool effect of run {run_id!r}'
        return [record for row in rows if (record := _decoded(codec.decode_effect, row, where)) is not None]

    # --- snapshots --------------------------------------------------------------------------

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest snapshot that reads (`complete` only unless asked), falling back past damaged ones."""
        below: int | None = None
        while True:
            rows = await self._backend.fetch_snapshots(
                run_id, include_interrupted=include_interrupted, below_seq=below, limit=1
            )
            if not rows:
                return None
            row = rows[0]
            loaded = await self._load_snapshot(run_id, row, None)
            if loaded is not None:
                return loaded
            below = row.seq

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Every retained snapshot of the run that reads, oldest first; `interrupted` ones only if asked."""
        rows = await self._backend.fetch_snapshots(run_id, include_interrupted=include_interrupted, oldest_first=True)
        log: LogSlice | None = None
        snapshots: list[ContinuableSnapshot] = []
        for row in rows:
            if log is None and row.texts is None and not isinstance(row.row, Damaged):
                log = await self._backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
            loaded = await self._load_snapshot(run_id, row, log)
            if loaded is not None:
                snapshots.append(loaded)
        return snapshots

    async def _load_snapshot(self, run_id: str, found: SnapshotRow, log: LogSlice | None) -> ContinuableSnapshot | None:
        """The snapshot `found` names, or `None` (with a one-line warning) if any part of it is unreadable."""
        where = f'snapshot {found.seq} of run {run_id!r}'
        meta = _decoded(codec.decode_snapshot_meta, found.row, where)
        if meta is None:
            return None
        if isinstance(found.texts, Damaged):
            _skip(where, found.texts.reason)
            return None
        texts: Sequence[str] | None = found.texts
        if texts is None:
            count, size = meta.message_count, meta.log_size
            if count is None or size is None:
                _skip(where, 'it names no history')
                return None
            if log is None:
                log = await self._backend.fetch_log(run_id, below_index=size, positions_below=count)
            if count > len(log.entries):
                # Checked before anything is allocated for `count` positions: a damaged count
                # (say 10**12) is a damaged snapshot, not a reason to run out of memory.
                _skip(where, f'it has {count} messages but the log holds {len(log.entries)} entries')
                return None
            texts = resolve_log(log.entries, log.missing, log.readable_end, count, size)
            if texts is None:
                _skip(where, f'its {count} messages (log size {size}) are not all in the message log')
                return None
        try:
            messages = await self._log.load(texts)
        except Exception as error:
            _skip(where, f'{type(error).__name__}: {error}')
            return None
        return ContinuableSnapshot(
            run_id=run_id,
            step_index=meta.step_index,
            messages=messages,
            conversation_id=meta.conversation_id,
            parent_run_id=meta.parent_run_id,
            agent_name=meta.agent_name,
            timestamp=meta.timestamp,
            state=meta.state,
            idempotency_key=meta.idempotency_key,
            seq=found.seq,
        )


def _skip(where: str, reason: str) -> None:
    logger.warning('skipping unreadable %s: %s', where, reason)


def _decoded(decode: Callable[[codec.Row], Any], row: codec.Row | Damaged, where: str) -> Any:
    """`decode(row)`, or `None` with a one-line warning for a damaged or undecodable row."""
    if isinstance(row, Damaged):
        _skip(row.where, row.reason)
        return None
    try:
        return decode(row)
    except ValueError as error:
        _skip(where, str(error))
        return None


# --- record checks: before anything is written ---------------------------------------------------


def _checked_run(record: RunRecord) -> RunRecord:
    check_run_id(record.run_id)
    for name in ('conversation_id', 'parent_run_id', 'agent_name', 'registration_id', 'pydantic_ai_run_id'):
        check_optional_str(getattr(record, name), f'RunRecord.{name}')
    check_optional_str(record.parent_tool_call_id, 'RunRecord.parent_tool_call_id')
    check_str_map(record.metadata, 'RunRecord.metadata')
    check_json_map(record.run_metadata, 'RunRecord.run_metadata')
    _check_time(record.started_at, 'RunRecord.started_at')
    return record


def _checked_event(event: StepEvent, run_ids: set[str]) -> StepEvent:
    if event.run_id not in run_ids:
        check_run_id(event.run_id)
        run_ids.add(event.run_id)
    if event.kind not in EVENT_KINDS:
        raise InvalidRecordError(f'StepEvent.kind must be one of {sorted(EVENT_KINDS)}, got {event.kind!r}')
    if isinstance(event.step_index, bool) or not isinstance(event.step_index, int):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(f'StepEvent.step_index must be an int, got {event.step_index!r}')
    if event.metadata:
        check_str_map(event.metadata, 'StepEvent.metadata')
    _check_time(event.timestamp, 'StepEvent.timestamp')
    return event


def _checked_effect(record: ToolEffectRecord, run_ids: set[str]) -> ToolEffectRecord:
    if record.run_id not in run_ids:
        check_run_id(record.run_id)
        run_ids.add(record.run_id)
    if record.status not in TOOL_EFFECT_STATUSES:
        raise InvalidRecordError(
            f'ToolEffectRecord.status must be one of {sorted(TOOL_EFFECT_STATUSES)}, got {record.status!r}'
        )
    if not isinstance(record.tool_call_id, str) or not isinstance(record.tool_name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(
            f'ToolEffectRecord.tool_call_id and tool_name must be strings, got {record.tool_call_id!r}, '
            f'{record.tool_name!r}'
        )
    _check_time(record.started_at, 'ToolEffectRecord.started_at')
    return record


def _checked_snapshot(snapshot: ContinuableSnapshot, run_ids: set[str]) -> None:
    if snapshot.run_id not in run_ids:
        check_run_id(snapshot.run_id)
        run_ids.add(snapshot.run_id)
    if snapshot.state not in SNAPSHOT_STATES:
        raise InvalidRecordError(
            f'ContinuableSnapshot.state must be one of {sorted(SNAPSHOT_STATES)}, got {snapshot.state!r}'
        )
    if not isinstance(snapshot.messages, list):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(f'ContinuableSnapshot.messages must be a list, got {type(snapshot.messages).__name__}')
    _check_time(snapshot.timestamp, 'ContinuableSnapshot.timestamp')


def _checked_delta(delta: SnapshotDelta) -> None:
    check_run_id(delta.run_id)
    if delta.state not in SNAPSHOT_STATES:
        raise InvalidRecordError(f'SnapshotDelta.state must be one of {sorted(SNAPSHOT_STATES)}, got {delta.state!r}')
    for name in ('step_index', 'message_count'):
        value = getattr(delta, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRecordError(f'SnapshotDelta.{name} must be an int >= 0, got {value!r}')
    expected: object = delta.expected_log_size
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int) or expected < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(f'SnapshotDelta.expected_log_size must be an int >= 0 or None, got {expected!r}')
    for append in delta.appends:
        position, text = append
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < delta.message_count:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidRecordError(
                f'SnapshotDelta.appends positions must be ints in [0, message_count={delta.message_count}), '
                f'got {position!r}'
            )
        if not isinstance(text, str) or not text.startswith('{'):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidRecordError(f'SnapshotDelta.appends texts must be JSON object texts, got {str(text)[:80]!r}')
    check_optional_str(delta.idempotency_key, 'SnapshotDelta.idempotency_key')
    _check_time(delta.timestamp, 'SnapshotDelta.timestamp')


def _check_time(value: object, what: str) -> None:
    if not isinstance(value, datetime):
        raise InvalidRecordError(f'{what} must be a datetime, got {value!r}')


def checked_query(query: RunQuery) -> RunQuery:
    """Reject a query whose filters have the wrong types, naming the filter."""
    for name in ('conversation_id', 'parent_run_id', 'agent_name', 'pydantic_ai_run_id'):
        check_optional_str(getattr(query, name), name)
    if query.status is not None and query.status not in ('completed', 'failed', 'unfinished'):
        raise ValueError(f"status must be 'completed', 'failed' or 'unfinished', got {query.status!r}")
    for name in ('started_after', 'started_before', 'ended_before'):
        value = getattr(query, name)
        if value is not None and not isinstance(value, datetime):
            raise ValueError(f'{name} must be a datetime, got {value!r}')
    limit: object = query.limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'limit must be an int >= 0 or None, got {query.limit!r}')
    if query.metadata is not None:
        check_str_map(query.metadata, 'metadata')
    for key, value in (query.run_metadata or {}).items():
        if not isinstance(key, str) or not (value is None or isinstance(value, str | int | float | bool)):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f'run_metadata filters compare JSON scalars (str, int, float, bool, None), got {key!r}: {value!r}'
            )
    return query


__all__ = ['MediaChoice', 'StepStoreBase', 'checked_query']
