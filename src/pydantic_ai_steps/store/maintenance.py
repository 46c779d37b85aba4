"""Removing what a store holds: runs, conversations, old runs, superseded log entries, unreferenced media.

Mixed into `StepStoreBase`, so every backend has it. The rules:

- Deleting a run removes its record, events, snapshots, tool effects and message log, at once
  where the backend allows. A writer still writing that run gets `RunNotFoundError` afterwards
  (records are only written for a registered run), so a run never reads half-deleted. Delegates
  stay unless `include_delegates=True`.
- `prune` removes whole runs by the age of their last activity: a closed run by its closing event,
  an unfinished one by its newest event. Events inside a kept run are never trimmed.
- `prune` and `collect_garbage` (never a dry run) also tidy what writes killed midway left, where a
  backend can (`TidiesLeftovers`: the File store's stale temporary files).
- Media garbage collection removes a blob only when no stored text references it and nothing has
  put it for `grace` (an hour by default), checked again just before the blob is deleted. Writers
  put a blob before they reference it and re-put (refresh) anything they last put more than five
  minutes ago (`_media_puts.BLOB_MEMO_SECONDS`), and the grace is at least twice that while
  writers run, so a blob a writer has just put, or is about to reference, is never collected.
  What a collection deletes, this process's writers put again. See `docs/design.md`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._records import RunQuery, RunRecord, RunStatus, StepEvent, utc_now
from ..media._protocol import MediaStore
from ..media._uri import MEDIA_URI_PREFIX
from . import codec
from ._media_puts import BLOB_MEMO_SECONDS, forget_collected
from .backend import Backend, Damaged, TidiesLeftovers
from .log_entries import LogEntry
from .message_log import MessageLog
from .patch import is_patch, patch_base_index

_URI = re.compile(re.escape(MEDIA_URI_PREFIX) + '[0-9a-f]{64}')
_DELETE_CHUNK = 500
DEFAULT_GRACE = timedelta(hours=1)
MIN_LIVE_GRACE = timedelta(seconds=2 * BLOB_MEMO_SECONDS)
"""The shortest grace collection takes while writers may run: a writer trusts a blob it put for
`_media_puts.BLOB_MEMO_SECONDS` before it puts it again; the other half is the margin for the time
between that check and the writer's commit, and for a media server's clock (it dates the puts)."""
EARLIEST = datetime.min.replace(tzinfo=UTC)
"""The earliest instant a `datetime` holds: the cutoff of an age reaching back further (`cutoff_for`)."""


def cutoff_for(age: timedelta) -> datetime:
    """The instant `age` ago, for `prune(older_than=)` and `collect_garbage(grace=)` in every store.

    An age reaching back before `EARLIEST` (year 1) gives `EARLIEST` instead of overflowing:
    nothing is older than that, so such a prune removes no run and such a collection no blob.
    """
    now = utc_now()
    return now - age if age < now - EARLIEST else EARLIEST


@dataclass(frozen=True, kw_only=True)
class BlobInfo:
    """One blob of a media store, as listed for garbage collection."""

    uri: str
    size: int
    stored_at: datetime
    """When the blob was last put (a put of bytes already stored refreshes it)."""


@runtime_checkable
class CollectableMediaStore(MediaStore, Protocol):
    """A media store that can list and delete its blobs (every shipped one)."""

    def list_blobs(self) -> AsyncIterator[BlobInfo]: ...

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """Remove the blob; with `stored_before`, only if it was not put since. `True` if it went."""
        ...


@runtime_checkable
class PreparesCollection(Protocol):
    """A media store with work to do before a collection lists its blobs, which `list_blobs` (a dry
    run's only call) never does: blobs that carry no put time (the upstream package's MongoDB
    manifests and SQLite rows), which it lists as just put, are dated now, so a blob becomes
    collectable one grace period after the first collection that dated it; what killed puts and
    deletes left is tidied an hour later (`DiskMediaStore`'s temporary files, `MongoMediaStore`'s
    chunks no manifest names)."""

    async def prepare_collection(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """What `prune` removed (or, with `dry_run=True`, would remove)."""

    run_ids: list[str]
    dry_run: bool
    cutoff: datetime


@dataclass(frozen=True, kw_only=True)
class GarbageResult:
    """What `collect_garbage` removed (or would remove)."""

    blobs: list[str] = field(default_factory=list[str])
    bytes: int = 0
    kept_referenced: int = 0
    kept_recent: int = 0
    dry_run: bool = False


class Maintenance:
    """Deletion, pruning and garbage collection for `StepStoreBase`."""

    if TYPE_CHECKING:
        _backend: Backend
        _log: MessageLog
        media_store: MediaStore | None
        max_run_age: timedelta | None

        async def query_runs(self, query: RunQuery) -> list[RunRecord]: ...

    async def delete_run(self, run_id: str, *, include_delegates: bool = False) -> list[str]:
        """Remove a run and everything recorded for it; its delegates too if asked. Returns the ids removed."""
        return await self._delete(await self._with_delegates([run_id], include_delegates))

    async def delete_conversation(self, conversation_id: str, *, include_delegates: bool = False) -> list[str]:
        """Remove every run of a conversation (and, if asked, the runs they delegated to)."""
        runs = await self.query_runs(RunQuery(conversation_id=conversation_id))
        return await self._delete(await self._with_delegates([run.run_id for run in runs], include_delegates))

    async def prune(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        dry_run: bool = False,
    ) -> PruneResult:
        """Remove whole runs whose last activity is older than `older_than` (default: `max_run_age`).

        `keep_last=N` always keeps the N newest runs; `status` limits pruning to runs of that
        status (or statuses). With `dry_run=True` nothing is removed and the result lists what
        would be. An `older_than` reaching back before year 1 removes nothing (`cutoff_for`), and a
        `keep_last` above `record_checks.MAX_COUNT` keeps every run (a limit, see `checked_query`).
        """
        age = older_than if older_than is not None else self.max_run_age
        if age is None:
            raise ValueError('prune() needs older_than= (a timedelta), or a store built with max_run_age=')
        if not isinstance(age, timedelta) or age < timedelta(0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'older_than must be a timedelta >= 0, got {age!r}')
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'keep_last must be an int >= 0 or None, got {keep_last!r}')
        statuses = _statuses(status)
        cutoff = cutoff_for(age)
        doomed: dict[str, None] = {}
        for closed in ('completed', 'failed'):
            if closed in statuses and cutoff > EARLIEST:
                for run in await self.query_runs(RunQuery(status=closed, ended_before=cutoff)):
                    doomed[run.run_id] = None
        if 'unfinished' in statuses and cutoff > EARLIEST:
            for run in await self.query_runs(RunQuery(status='unfinished', started_before=cutoff)):
                if await self._last_activity(run) < cutoff:
                    doomed[run.run_id] = None
        if keep_last:
            for run in await self.query_runs(RunQuery(newest_first=True, limit=keep_last)):
                doomed.pop(run.run_id, None)
        run_ids = list(doomed)
        if not dry_run:
            run_ids = await self._delete(run_ids)
            await self._tidy_leftovers()
        return PruneResult(run_ids=run_ids, dry_run=dry_run, cutoff=cutoff)

    async def compact_run(self, run_id: str) -> int:
        """Remove the run's message-log entries no remaining snapshot needs (superseded versions).

        Only for a closed run: an open one may still write snapshots that rely on what this process
        or another last wrote. Returns how many entries went.
        """
        record = await self._backend.fetch_run(run_id)
        if record is None or isinstance(record, Damaged) or record.get('status') not in ('completed', 'failed'):
            return 0
        rows = await self._backend.fetch_snapshots(run_id, include_interrupted=True, oldest_first=True)
        views: list[tuple[int, int]] = []
        for row in rows:
            if isinstance(row.row, Damaged) or row.texts is not None:
                return 0  # a damaged or older-layout snapshot: leave the log alone
            try:
                meta = codec.decode_snapshot_meta(row.row)
            except ValueError:
                return 0
            if meta.message_count is None or meta.log_size is None:
                return 0
            views.append((meta.message_count, meta.log_size))
        log = await self._backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
        if log.missing or not log.entries:
            return 0
        needed = needed_entries(log.entries, views)
        last = max(entry.index for entry in log.entries)  # the log end must not move
        unneeded = [entry.index for entry in log.entries if entry.index not in needed and entry.index != last]
        if unneeded:
            await self._backend.delete_log_entries(run_id, unneeded)
        return len(unneeded)

    async def collect_garbage(
        self, *, grace: timedelta = DEFAULT_GRACE, dry_run: bool = False, writers_stopped: bool = False
    ) -> GarbageResult:
        """Remove media blobs no stored text references and nothing has put within `grace`.

        Only for a media store this step store has to itself (the default one): blobs that another
        store references would look unreferenced from here. A `grace` shorter than the time a
        writer trusts a blob it put (`MIN_LIVE_GRACE`) could remove a blob a running writer is
        about to reference without putting it again, so it is refused unless `writers_stopped=True`
        says no process writes to the store meanwhile (a writer process that was only paused trusts
        its puts of the last `BLOB_MEMO_SECONDS`: restart it, or wait that long before it writes).
        """
        media = self.media_store
        if media is None:
            return GarbageResult(dry_run=dry_run)
        if not isinstance(media, CollectableMediaStore):
            raise TypeError(f'{media!r} cannot list and delete its blobs, so its garbage cannot be collected')
        if not isinstance(grace, timedelta) or grace < timedelta(0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'grace must be a timedelta >= 0, got {grace!r}')
        if grace < MIN_LIVE_GRACE and writers_stopped is not True:
            raise ValueError(
                f'grace={grace} is shorter than the {MIN_LIVE_GRACE} a writer trusts a blob it put without '
                'putting it again, so a blob a running writer is about to reference could be removed: give a '
                f'grace of at least {MIN_LIVE_GRACE}, or writers_stopped=True if no process writes to this store'
            )
        cutoff = cutoff_for(grace)  # a grace reaching back before year 1 collects nothing
        if not dry_run and isinstance(media, PreparesCollection):
            await media.prepare_collection()  # after the cutoff: dated now, a blob is not collected this time
        candidates: list[BlobInfo] = []
        recent = 0
        async for blob in media.list_blobs():
            if blob.stored_at < cutoff:
                candidates.append(blob)
            else:
                recent += 1
        referenced: set[str] = set()
        if candidates:  # listed first, then scanned: a reference written meanwhile is seen
            async for text in self._backend.texts_mentioning(MEDIA_URI_PREFIX):
                referenced.update(_URI.findall(text))
        removed: list[str] = []
        size = 0
        deleting: str | None = None
        try:
            for blob in candidates:
                if blob.uri in referenced:
                    continue
                deleting = blob.uri
                if dry_run or await media.delete(blob.uri, stored_before=cutoff):
                    removed.append(blob.uri)
                    size += blob.size
                deleting = None
        finally:
            if not dry_run:  # also after a failed delete, which may have removed its blob before it raised
                forget_collected(removed if deleting is None else [*removed, deleting])
        if not dry_run:
            await self._backend.reclaim_space()
            await self._tidy_leftovers()
        kept = sum(1 for blob in candidates if blob.uri in referenced)
        return GarbageResult(blobs=removed, bytes=size, kept_referenced=kept, kept_recent=recent, dry_run=dry_run)

    async def _delete(self, run_ids: Sequence[str]) -> list[str]:
        removed: list[str] = []
        for start in range(0, len(run_ids), _DELETE_CHUNK):
            chunk = run_ids[start : start + _DELETE_CHUNK]
            removed += await self._backend.delete_runs(chunk)
            for run_id in chunk:
                self._log.forget(run_id)
        if removed:
            await self._backend.reclaim_space()
        return removed

    async def _tidy_leftovers(self) -> None:
        """Here, not in `delete_run`: looking at every run folder is a whole-store job, for the
        maintenance a deployment schedules, not for a call that removes one run."""
        if isinstance(self._backend, TidiesLeftovers):
            await self._backend.tidy_leftovers()

    async def _with_delegates(self, run_ids: Iterable[str], include: bool) -> list[str]:
        ordered = dict.fromkeys(run_ids)
        if include:
            frontier = list(ordered)
            while frontier:
                children = await self.query_runs(RunQuery(parent_run_id=frontier.pop()))
                for child in children:
                    if child.run_id not in ordered:
                        ordered[child.run_id] = None
                        frontier.append(child.run_id)
        return list(ordered)

    async def _last_activity(self, run: RunRecord) -> datetime:
        rows = await self._backend.fetch_events(run.run_id)
        times = [event.timestamp for row in rows if not isinstance(row, Damaged) and (event := _event(row)) is not None]
        return max(times, default=run.started_at)


def _event(row: codec.Row) -> StepEvent | None:
    try:
        return codec.decode_event(row)
    except ValueError:
        return None


def _statuses(status: RunStatus | Sequence[RunStatus] | None) -> set[str]:
    allowed = {'completed', 'failed', 'unfinished'}
    if status is None:
        return allowed
    wanted: set[str] = {status} if isinstance(status, str) else set(status)
    unknown = wanted - allowed
    if unknown:
        raise ValueError(f'status must be among {sorted(allowed)}, got {sorted(unknown)!r}')
    return wanted


def needed_entries(entries: Sequence[LogEntry], views: Iterable[tuple[int, int]]) -> set[int]:
    """Log indices some `(message_count, log_size)` view resolves to, with the bases of patches among them."""
    by_index = {entry.index: entry for entry in entries}
    ordered = sorted(entries, key=lambda entry: entry.index)
    needed: set[int] = set()
    for count, size in views:
        latest: dict[int, int] = {}
        for entry in ordered:
            if entry.index >= size:
                break
            if entry.position < count:
                latest[entry.position] = entry.index
        for index in latest.values():
            needed.add(index)
            text = by_index[index].text
            if is_patch(text):
                with contextlib.suppress(ValueError):
                    needed.add(patch_base_index(text))
    return needed
