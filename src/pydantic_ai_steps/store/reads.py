"""Reading records back: decode each row, skip a damaged one with one warning, resolve snapshots.

Mixed into `StepStoreBase`, so every backend has it. A read never fails on a damaged record: a
row the backend reports `Damaged`, or that does not decode, is skipped with a one-line warning
on the `pydantic_ai_steps` logger, and `latest_snapshot` falls back past a snapshot whose history
cannot be resolved from the message log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._records import ContinuableSnapshot, RunQuery, RunRecord, RunStatus, StepEvent, ToolEffectRecord
from . import codec
from .backend import Backend, Damaged, LogSlice, SnapshotRow
from .log_entries import resolve_log
from .record_checks import checked_query

if TYPE_CHECKING:
    from .message_log import MessageLog

logger = logging.getLogger('pydantic_ai_steps')
_REREADS = 3
"""How often `latest_snapshot` reads the newest snapshot again after one was removed as it was read:
removals come with new snapshots, and compaction only once a run has closed, so the next read holds."""
_DAMAGE = (ValueError, FileNotFoundError, PermissionError, RecursionError)
"""What loading a history raises when the stored record is at fault: text or markers that do not parse
(`ValueError`), a blob missing or damaged (`FileNotFoundError`, `MediaIntegrityError` among them), a
link planted in the media folder (`PermissionError`), nesting too deep to walk. Anything else (a media
store that cannot be reached, say) is the read failing, not the record: skipping past it would hand
back an older snapshot as the newest, so it propagates."""


class Reads:
    """Every read of `StepStoreBase`: runs, events, tool effects and snapshots, as records."""

    if TYPE_CHECKING:
        _backend: Backend
        _log: MessageLog

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
        query = RunQuery(
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
        return await self.query_runs(query)

    async def query_runs(self, query: RunQuery) -> list[RunRecord]:
        """`list_runs` with a prepared `RunQuery`, checked by `record_checks.checked_query` first."""
        query = checked_query(query)
        rows = await self._backend.fetch_runs(query)
        records = [record for row in rows if (record := _decoded(codec.decode_run, row, 'run record')) is not None]
        return query.apply(records)

    async def list_unreadable_runs(self) -> list[str]:
        """The run records `list_runs` skips as damaged, each named with why it does not read.

        Reads skip damage so that one bad record cannot break them; whatever acts on every run
        (deleting all of them, say) checks here that the listing left none out.
        """
        found: list[str] = []
        for row in await self._backend.fetch_runs(RunQuery()):
            if isinstance(row, Damaged):
                found.append(f'{row.where}: {row.reason}')
                continue
            try:
                codec.decode_run(row)
            except ValueError as error:
                run_id = row.get('run_id')
                found.append(f'run {run_id!r}: {error}' if isinstance(run_id, str) else f'a run record: {error}')
        return found

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

    def _effects(self, rows: Sequence[codec.Row | Damaged], run_id: str) -> list[ToolEffectRecord]:
        where = f'tool effect of run {run_id!r}'
        return [record for row in rows if (record := _decoded(codec.decode_effect, row, where)) is not None]

    # --- snapshots --------------------------------------------------------------------------

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest snapshot that reads (`complete` only unless asked), falling back past damaged ones.

        One removed while its history was read (retention, then compaction when the run closed,
        may have taken log entries it needed) is not returned: the newest is read again.
        """
        below: int | None = None
        rereads = 0
        while True:
            rows = await self._backend.fetch_snapshots(
                run_id, include_interrupted=include_interrupted, below_seq=below, limit=1
            )
            if not rows:
                return None
            row = rows[0]
            loaded = await self._load_snapshot(run_id, row, None)
            if loaded is not None and rereads < _REREADS and not await self._still_stored(run_id, row):
                rereads += 1
                below = None
                continue
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
        if log is not None:  # one removed while the log was read may have lost entries to compaction
            again = await self._backend.fetch_snapshots(run_id, include_interrupted=include_interrupted)
            stored = {row.seq for row in again}
            from_log = {row.seq for row in rows if row.texts is None}
            snapshots = [item for item in snapshots if item.seq in stored or item.seq not in from_log]
        return snapshots

    async def _still_stored(self, run_id: str, row: SnapshotRow) -> bool:
        """Whether a snapshot read from the message log is still stored: once it is removed, compaction
        may remove entries it needed, and a read of the log after that rebuilds it from older versions."""
        if row.texts is not None:
            return True  # an older layout's history is its own, not the log's
        newest = await self._backend.fetch_snapshots(run_id, include_interrupted=True, below_seq=row.seq + 1, limit=1)
        return bool(newest) and newest[0].seq == row.seq

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
        except _DAMAGE as error:
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
