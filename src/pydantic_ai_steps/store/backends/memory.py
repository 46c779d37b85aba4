"""`InMemoryStepStore`: process-local, for tests and short-lived agents."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

from ..._errors import RunAlreadyExistsError, RunNotFoundError
from ..._records import RUN_EQUALITY_FIELDS, RunQuery
from ...media._protocol import MediaStore
from ..backend import (
    STALE,
    SUPPRESSED,
    CommitOutcome,
    LogEntry,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    WriteBatch,
    resolved_effect,
    upserted_effect,
)
from ..base import StepStoreBase
from ..codec import Encoding

__all__ = ['InMemoryStepStore']


class InMemoryStepStore(StepStoreBase):
    """Keeps everything in dictionaries of this process.

    Messages are stored as JSON text like every other store, each version once (see
    `store.history`), so reads return fresh objects and a long run costs memory in proportion to
    its history, not to its history times its steps. `media_store=` (default `None`: payloads stay
    inline) moves large payloads elsewhere, as in the persistent stores.
    """

    def __init__(
        self,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | None = None,
        media_threshold_bytes: int = 65536,
        max_run_age: timedelta | None = None,
    ) -> None:
        super().__init__(
            _MemoryBackend(),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            max_run_age=max_run_age,
        )

    def __repr__(self) -> str:
        return f'InMemoryStepStore(max_snapshots_per_run={self.max_snapshots_per_run})'


class _Run:
    """Everything stored for one run."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.events: list[Row] = []
        self.event_keys: set[str] = set()
        self.effects: dict[str, Row] = {}
        self.snapshots: dict[int, Row] = {}
        self.snapshot_keys: set[str] = set()
        self.log: dict[int, tuple[int, str]] = {}
        self.log_end = 0


class _MemoryBackend:
    encoding = Encoding(native_times=True, native_maps=True)

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._by_field: dict[tuple[str, object], dict[str, None]] = {}
        """(field, value) -> the ids of the runs registered with it, in registration order: the
        lineage fields never change once a run is registered, and `list_runs` asks by them."""
        self._seq = itertools.count(1)

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        registering = batch.run
        if registering is not None and registering['run_id'] in self._runs:
            raise RunAlreadyExistsError(registering['run_id'])
        for run_id in batch.run_ids:
            if run_id not in self._runs and (registering is None or registering['run_id'] != run_id):
                raise RunNotFoundError(run_id)
        write = batch.snapshot
        if write is not None and write.expected_log_size is not None:
            run = self._runs.get(write.run_id)
            claimed = run is not None and write.key is not None and write.key in run.snapshot_keys
            if not claimed and (run.log_end if run is not None else 0) != write.expected_log_size:
                return STALE  # a claimed key is suppressed whatever the log end, as the contract orders
        if registering is not None:
            self._runs[registering['run_id']] = _Run({**registering, 'status': None, 'ended_at': None})
            for name in RUN_EQUALITY_FIELDS:
                if (value := registering[name]) is not None:
                    self._by_field.setdefault((name, value), {})[registering['run_id']] = None
        outcome: CommitOutcome = None
        if write is not None:
            run = self._runs[write.run_id]
            if write.key is not None and write.key in run.snapshot_keys:
                outcome = SUPPRESSED
            else:
                if write.key is not None:
                    run.snapshot_keys.add(write.key)
                for position, text in write.appends:
                    run.log[run.log_end] = (position, text)
                    run.log_end += 1
                run.snapshots[next(self._seq)] = {**write.row, 'log_size': run.log_end}
                outcome = run.log_end
        for row in batch.tool_effects:
            effects = self._runs[row['run_id']].effects
            effects[row['tool_call_id']] = upserted_effect(row, effects.get(row['tool_call_id']))
        for row in batch.events:
            run = self._runs[row['run_id']]
            key = row['idempotency_key']
            if key is not None:
                if key in run.event_keys:
                    continue
                run.event_keys.add(key)
            run.events.append(row)
        for closing in batch.closings:
            self._runs[closing.run_id].row.update(status=closing.status, ended_at=closing.ended_at)
        return outcome

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        run = self._runs.get(run_id)
        entry = run.effects.get(tool_call_id) if run is not None else None
        if run is None or entry is None or entry['status'] != 'started':
            return False
        if entry['resolution'] is not None and not overwrite:
            return False
        run.effects[tool_call_id] = resolved_effect(entry, resolution)
        return True

    async def fetch_run(self, run_id: str) -> Row | None:
        run = self._runs.get(run_id)
        return run.row if run is not None else None

    async def fetch_runs(self, query: RunQuery) -> list[Row]:
        # Equality on the indexed fields here; the kernel applies every filter, the order and the limit.
        # Registration order, reversed for newest first (`RunQuery.apply` keeps it among equal start times).
        wanted = query.equalities()
        if not wanted:
            rows = [run.row for run in self._runs.values()]
        else:
            candidates = min((self._by_field.get(item, {}) for item in wanted.items()), key=len)
            found = (self._runs[run_id].row for run_id in candidates)
            rows = [row for row in found if all(row[name] == value for name, value in wanted.items())]
        return rows[::-1] if query.newest_first else rows

    async def fetch_events(self, run_id: str) -> list[Row]:
        run = self._runs.get(run_id)
        return list(run.events) if run is not None else []

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        run = self._runs.get(run_id)
        if run is None:
            return []
        if tool_call_id is not None:
            found = run.effects.get(tool_call_id)
            return [found] if found is not None else []
        rows = list(run.effects.values())
        if unresolved_only:
            rows = [row for row in rows if row['status'] == 'started' and row['resolution'] is None]
        return rows

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        run = self._runs.get(run_id)
        if run is None:
            return []
        seqs = sorted(run.snapshots, reverse=not oldest_first)
        found = [
            SnapshotRow(seq, run.snapshots[seq])
            for seq in seqs
            if (below_seq is None or seq < below_seq)
            and (include_interrupted or run.snapshots[seq]['state'] == 'complete')
        ]
        return found if limit is None else found[:limit]

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        run = self._runs.get(run_id)
        return [(seq, row['state']) for seq, row in run.snapshots.items()] if run is not None else []

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        run = self._runs.get(run_id)
        if run is None:
            return LogSlice(())
        return LogSlice(
            [
                LogEntry(index, position, text)
                for index, (position, text) in run.log.items()
                if index < below_index and position < positions_below
            ]
        )

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            for seq in seqs:
                run.snapshots.pop(seq, None)

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        deleted: list[str] = []
        for run_id in run_ids:
            run = self._runs.pop(run_id, None)
            if run is not None:
                deleted.append(run_id)
                for name in RUN_EQUALITY_FIELDS:
                    if (value := run.row[name]) is not None:
                        self._by_field[name, value].pop(run_id, None)
        return deleted

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            for index in indices:
                run.log.pop(index, None)

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        for run in list(self._runs.values()):
            for _, text in list(run.log.values()):
                if needle in text:
                    yield text

    async def reclaim_space(self) -> None:
        return None

    async def probe(self) -> Probe:
        return Probe(exists=True, step_store=True)

    async def aclose(self) -> None:
        return None
