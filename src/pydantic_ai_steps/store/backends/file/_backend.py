"""The File backend: one directory per run, append-only JSON lines, snapshots as small files.

Crash safety: `run.json` and snapshot files are written to a temporary file in the same directory
and moved into place (`os.link`, which also refuses to overwrite). Every append is one `write` of
whole lines to a file opened with `O_APPEND`, under an advisory `flock` so appenders in several
processes never interleave or race a check-then-append. A file that ends in a torn line (a
process died inside a `write`) gets a newline before the next append, so the damage stays
confined to that line, and readers are handed it as `Damaged`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from ...._errors import RunAlreadyExistsError, RunNotFoundError
from ...._files import fsync_dir
from ...._json import compact_json
from ...._records import RunQuery
from ...backend import (
    STALE,
    SUPPRESSED,
    Closing,
    CommitOutcome,
    Damaged,
    LogEntry,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    SnapshotWrite,
    WriteBatch,
)
from ...codec import Encoding
from .._offload import held, run_blocking, run_soon
from ._index import RunIndex
from ._io import (
    UnsafeEntryError,
    append_locked,
    check_directory,
    json_object,
    last_line,
    line,
    logger,
    make_dir,
    read_bytes,
    read_lines,
    replace_file,
    write_exclusive,
)
from ._paths import INDEX_DIR, SNAPSHOTS_DIR, TRASH_DIR, is_run_dir_name, run_dir_name
from ._state import LOG_PREFIX, REMOVED_PREFIX, RunPaths, RunState

_R = TypeVar('_R')
_MAX_CACHED_RUNS = 256
_SEQ_STEM = re.compile(r'[0-9]{1,18}')
_CLOSING = {'run_completed': 'completed', 'run_failed': 'failed'}


class FileBackend:
    encoding = Encoding(native_maps=True, omit_empty=True)

    def __init__(self, root: Path, *, durable: bool) -> None:
        self._root = root
        self.durable = durable
        self._runs: OrderedDict[str, RunState] = OrderedDict()
        self._runs_lock = threading.Lock()
        self._index = RunIndex(root, lambda: self.durable)
        self._status_cache: dict[str, tuple[int, int, Row]] = {}

    # --- writes -----------------------------------------------------------------------------

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        """The run, the snapshot, the tool effects, then the events, each file with one append.

        A crash in between leaves a snapshot whose ledger entries still say `started` (the call is
        then reported as possibly done, which it is), never a closed entry whose result no
        snapshot holds.
        """
        inline = not self.durable
        registered = None
        if batch.run is not None:
            registered = batch.run['run_id']
            await run_soon(self._register, batch.run, inline=inline)
        for run_id in batch.run_ids:
            if run_id != registered:
                await run_soon(self._require_registered, run_id, inline=inline)
        outcome: CommitOutcome = None
        if batch.snapshot is not None:
            outcome = await self._guarded(batch.snapshot.run_id, self._write_snapshot, batch.snapshot)
            if outcome == STALE:
                return STALE
        for run_id, rows in _by_run(batch.tool_effects):
            await self._guarded(run_id, self._append_effects, rows)
        for run_id, rows in _by_run(batch.events):
            await self._guarded(run_id, self._append_events, rows)
        for closing in batch.closings:
            await self._guarded(closing.run_id, self._write_status, closing)
        return outcome

    def _write_status(self, state: RunState, closing: Closing) -> None:
        """`status.json`: how the run ended, replaced atomically (a run closes once; a retry rewrites it)."""
        replace_file(state.paths.status, line({'status': closing.status, 'ended_at': closing.ended_at}), self.durable)

    async def _guarded(self, run_id: str, body: Callable[[RunState, Any], _R], argument: Any) -> _R:
        """Run a write of one run's files; a run folder gone meanwhile (deleted) is `RunNotFoundError`."""
        try:
            return await run_soon(self._with_state, run_id, body, argument, inline=not self.durable)
        except FileNotFoundError:
            self._drop_state(run_id)
            raise RunNotFoundError(run_id) from None

    def _with_state(self, run_id: str, body: Callable[[RunState, Any], _R], argument: Any) -> _R:
        state = self._state(run_id)
        with held(state.lock):
            return body(state, argument)

    def _register(self, row: Row) -> None:
        run_id = row['run_id']
        paths = RunPaths(self._root / run_dir_name(run_id))
        if paths.run.exists():
            raise RunAlreadyExistsError(run_id)
        if not self._root.exists():
            make_dir(self._root)
        created = make_dir(paths.run_dir)
        check_directory(paths.run_dir, 'run folder')
        if created and self.durable:
            fsync_dir(self._root)
        text = line(row)
        # The index line goes first: a crash between the two leaves a line for a run that does
        # not exist (readers ignore it), never a run that the index cannot find.
        self._index.append(text)
        if not write_exclusive(paths.run, text, self.durable):
            raise RunAlreadyExistsError(run_id)
        self._index.registered(run_id)

    def _require_registered(self, run_id: str) -> None:
        state = self._state(run_id)
        if not state.registered:
            if not state.paths.run.exists():
                self._drop_state(run_id)
                raise RunNotFoundError(run_id)
            state.registered = True

    def _append_events(self, state: RunState, rows: list[Row]) -> None:
        """Append events as one write, skipping those whose idempotency key the run already has."""
        path = state.paths.events
        durable = self.durable
        with append_locked(path) as appender:
            if any(row.get('idempotency_key') is not None for row in rows):
                state.events.sync_fd(appender.fd, path, state.add_event_lines)
            fresh: list[bytes] = []
            new_keys: set[str] = set()
            for row in rows:
                key = row.get('idempotency_key')
                if key is not None:
                    if key in state.event_keys or key in new_keys:
                        continue
                    new_keys.add(key)
                fresh.append(line(row))
            if not fresh:
                return
            appender.write(b''.join(fresh), durable)
            if state.events.follows(appender):
                state.event_keys.update(new_keys)

    def _append_effects(self, state: RunState, rows: list[Row]) -> None:
        path = state.paths.effects
        with append_locked(path) as appender:
            appender.write(b''.join(line(row) for row in rows), self.durable)
            if state.effects_tail.follows(appender):
                for row in rows:
                    state.effects[row['tool_call_id']] = row

    def _write_snapshot(self, state: RunState, write: SnapshotWrite) -> CommitOutcome:
        """Append the new message versions, write the snapshot file, ledger it.

        Runs under the run's `flock` (taken on `messages.jsonl`), so writers of one run in any
        process take turns and the log index, the snapshot seq and the key check stay consistent.
        """
        paths = state.paths
        durable = self.durable
        with append_locked(paths.messages) as log:
            if not state.snapshots_dir_ready:
                if make_dir(paths.snapshots) and durable:
                    fsync_dir(paths.run_dir)
                check_directory(paths.snapshots, 'snapshot folder')
                state.snapshots_dir_ready = True
            self._sync_ledger(state)
            key = write.key
            if key is not None and key in state.snapshot_keys:
                return SUPPRESSED
            state.log_tail.sync_fd(log.fd, paths.messages, state.add_log_lines, torn=state.add_torn_log_line)
            if write.expected_log_size is not None and write.expected_log_size != state.next_log_index:
                return STALE
            if write.appends:
                base = state.next_log_index
                payload = b''.join(
                    _log_line(base + offset, position, text) for offset, (position, text) in enumerate(write.appends)
                )
                log.write(payload, durable)
                if state.log_tail.follows(log):
                    state.next_log_index = base + len(write.appends)
                else:  # pragma: no cover - only without flock (Windows) could another writer slip in
                    return STALE
            log_size = state.next_log_index
            seq = state.max_seq + 1
            body = _snapshot_body(write.row, log_size)
            while not write_exclusive(paths.snapshots / f'{seq}.json', body, durable, sync_dir=False):
                seq += 1  # a file no ledger line names (a crash between the two writes): step over it
            if durable:
                fsync_dir(paths.snapshots)
            state_name = write.row['state']
            with append_locked(paths.ledger, lock=False) as ledger:
                ledger.write(line({'seq': seq, 'state': state_name, 'key': key}), durable)
                # Out of step only without flock (Windows): the next sync re-reads this line, harmlessly.
                state.ledger_tail.follows(ledger)
            state.max_seq = seq
            state.live[seq] = state_name
            if key is not None:
                state.snapshot_keys.add(key)
            return log_size

    def _sync_ledger(self, state: RunState) -> None:
        """Catch up with the snapshot ledger; on first sight of a run, with its snapshot files too."""
        if not state.ledger_loaded:
            state.reset_snapshots()
        state.ledger_tail.sync_path(state.paths.ledger, state.add_ledger_lines)
        if state.ledger_loaded:
            return
        # First look at this run in this process: files the ledger does not name (written by the
        # upstream package, or before a crash cut the ledger line) must still count for seq
        # allocation and retention. Their state is read once from the file.
        snapshots_dir = state.paths.snapshots
        present = _snapshot_seqs(snapshots_dir)
        for seq in present:
            state.max_seq = max(state.max_seq, seq)
            if seq not in state.live:
                file_state = _peek_state(snapshots_dir / f'{seq}.json')
                if file_state is not None:
                    state.live[seq] = file_state
        for seq in [seq for seq in state.live if seq not in present]:
            del state.live[seq]
        state.ledger_loaded = True

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        def delete(state: RunState, doomed: Sequence[int]) -> None:
            for seq in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(state.paths.snapshots / f'{seq}.json')
                state.live.pop(seq, None)

        await self._guarded(run_id, delete, seqs)

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        return await run_blocking(self._delete_runs, list(run_ids))

    def _delete_runs(self, run_ids: list[str]) -> list[str]:
        """Move each run's folder out of the store in one rename, then remove it."""
        trash = self._root / INDEX_DIR / TRASH_DIR
        removed: list[str] = []
        for run_id in run_ids:
            run_dir = self._root / run_dir_name(run_id)
            try:
                if not check_directory(run_dir, 'run folder'):
                    continue
            except UnsafeEntryError:
                logger.warning('not deleting %s: it is not a folder this store made', run_dir)
                continue
            make_dir(trash)
            target = trash / uuid.uuid4().hex
            try:
                os.rename(run_dir, target)
            except FileNotFoundError:
                continue
            removed.append(run_id)
            self._drop_state(run_id)
            shutil.rmtree(target, ignore_errors=True)
        self._index.deleted(removed)
        if self.durable and removed:
            fsync_dir(self._root)
        return removed

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        await self._guarded(run_id, self._rewrite_log, set(indices))

    def _rewrite_log(self, state: RunState, doomed: set[int]) -> None:
        """Rewrite the run's message log without `doomed`, recording them as removed (first line)."""
        path = state.paths.messages
        with append_locked(path):
            kept: list[bytes] = []
            removed = set(doomed)
            for text in read_lines(path):
                if text.startswith(REMOVED_PREFIX):
                    with contextlib.suppress(ValueError):
                        removed.update(int(index) for index in json_object(text)['removed'])
                    continue
                match = LOG_PREFIX.match(text)
                if match is None or int(match.group(1)) not in doomed:
                    kept.append(text + b'\n')
            header = line({'removed': sorted(removed)})
            replace_file(path, header + b''.join(kept), self.durable)
        state.log_tail.reset()
        state.next_log_index = 0

    async def reclaim_space(self) -> None:
        return None  # deleted folders and files give their space back at once

    # --- reads ------------------------------------------------------------------------------

    async def fetch_run(self, run_id: str) -> Row | Damaged | None:
        return await run_soon(self._fetch_run, run_id)

    def _fetch_run(self, run_id: str) -> Row | Damaged | None:
        paths = RunPaths(self._root / run_dir_name(run_id))
        try:
            row = json_object(read_bytes(paths.run))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as error:
            fallback = self._index.row_from_index(run_id)
            if fallback is None:
                return Damaged(str(paths.run), str(error))
            logger.warning('unreadable run record %s (%s); using its index entry', paths.run, error)
            row = fallback
        return self._with_status(row)

    async def fetch_runs(self, query: RunQuery) -> list[Row]:
        return await run_blocking(self._fetch_runs, query)

    def _fetch_runs(self, query: RunQuery) -> list[Row]:
        wanted = {
            name: value
            for name in ('conversation_id', 'parent_run_id', 'agent_name', 'pydantic_ai_run_id')
            if (value := getattr(query, name)) is not None
        }
        return [self._with_status(row) for row in self._index.rows(wanted)]

    def _with_status(self, row: Row) -> Row:
        """The row with `status` and `ended_at`: from `status.json`, or (runs closed by other writers)
        from the run's last event when it is a closing one."""
        run_id = row.get('run_id')
        if not isinstance(run_id, str):
            return row
        paths = RunPaths(self._root / run_dir_name(run_id))
        with contextlib.suppress(OSError, ValueError):
            closed = json_object(read_bytes(paths.status))
            if closed.get('status') in ('completed', 'failed'):
                return {**row, 'status': closed['status'], 'ended_at': closed.get('ended_at')}
        path = paths.events
        try:
            info = os.lstat(path)
            stamp = (info.st_ino, info.st_size)
        except (FileNotFoundError, NotADirectoryError):
            return {**row, 'status': None, 'ended_at': None}
        cached = self._status_cache.get(run_id)
        if cached is None or cached[:2] != stamp:
            closing: Row = {'status': None, 'ended_at': None}
            last = last_line(path)
            if last is not None:
                with contextlib.suppress(ValueError):
                    event = json_object(last)
                    status = _CLOSING.get(cast(str, event.get('kind')))
                    if status is not None:
                        closing = {'status': status, 'ended_at': event.get('timestamp')}
            cached = (*stamp, closing)
            self._status_cache[run_id] = cached
        return {**row, **cached[2]}

    async def fetch_events(self, run_id: str) -> list[Row | Damaged]:
        return await run_blocking(self._read_rows, RunPaths(self._root / run_dir_name(run_id)).events)

    def _read_rows(self, path: Path) -> list[Row | Damaged]:
        rows: list[Row | Damaged] = []
        for number, text in enumerate(read_lines(path), start=1):
            try:
                rows.append(json_object(text))
            except ValueError as error:
                rows.append(Damaged(f'{path} line {number}', str(error)))
        return rows

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        def read(state: RunState, _: None) -> list[Row]:
            state.effects_tail.sync_path(state.paths.effects, state.add_effect_lines)
            if tool_call_id is not None:
                found = state.effects.get(tool_call_id)
                return [dict(found)] if found is not None else []
            rows = [dict(row) for row in state.effects.values()]
            if unresolved_only:
                rows = [row for row in rows if row.get('status') == 'started' and row.get('resolution') is None]
            return rows

        try:
            return await run_soon(self._with_state, run_id, read, None)
        except UnsafeEntryError as error:
            logger.warning('%s', error)
            return []

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        return await run_blocking(self._fetch_snapshots, run_id, include_interrupted, below_seq, limit, oldest_first)

    def _fetch_snapshots(
        self, run_id: str, include_interrupted: bool, below_seq: int | None, limit: int | None, oldest_first: bool
    ) -> list[SnapshotRow]:
        directory = self._root / run_dir_name(run_id) / SNAPSHOTS_DIR
        seqs = sorted(_snapshot_seqs(directory), reverse=not oldest_first)
        found: list[SnapshotRow] = []
        for seq in seqs:
            if below_seq is not None and seq >= below_seq:
                continue
            row = _read_snapshot_file(directory / f'{seq}.json', seq)
            if row is None:
                continue  # pruned since the folder was listed
            if not include_interrupted and not isinstance(row.row, Damaged) and row.row.get('state') != 'complete':
                continue
            found.append(row)
            if limit is not None and len(found) >= limit:
                break
        return found

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        def read(state: RunState, _: None) -> list[tuple[int, str]]:
            self._sync_ledger(state)
            return list(state.live.items())

        return await self._guarded(run_id, read, None)

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        return await run_blocking(self._fetch_log, run_id, below_index, positions_below)

    def _fetch_log(self, run_id: str, below_index: int, positions_below: int) -> LogSlice:
        path = RunPaths(self._root / run_dir_name(run_id)).messages
        entries: list[LogEntry] = []
        present: set[int] = set()
        removed: set[int] = set()
        for text in read_lines(path):
            if text.startswith(REMOVED_PREFIX):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    removed.update(int(index) for index in json_object(text)['removed'])
                continue
            entry = _parse_log_line(text)
            if entry is None:
                logger.warning('skipping damaged message log line in %s: %r', path, text[:200])
                continue
            present.add(entry.index)
            if entry.index < below_index and entry.position < positions_below:
                entries.append(entry)
        end = max(present, default=-1) + 1
        return LogSlice(entries, _gaps(present, removed), readable_end=end)

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        marker = needle.encode()
        for folder in await run_blocking(self._run_folders):
            texts = await run_blocking(_texts_in_folder, Path(folder), marker)
            for text in texts:
                yield text

    def _run_folders(self) -> list[str]:
        try:
            entries = list(os.scandir(self._root))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [entry.path for entry in entries if is_run_dir_name(entry.name) and entry.is_dir(follow_symlinks=False)]

    async def probe(self) -> Probe:
        return await run_blocking(self._probe)

    def _probe(self) -> Probe:
        """Read-only, never following a link: a store has `_index/` or a run folder with a `run.json`."""
        try:
            info = os.lstat(self._root)
        except FileNotFoundError:
            return Probe(exists=False, step_store=False, detail=f'{self._root} does not exist')
        if not os.path.isdir(self._root):
            return Probe(exists=True, step_store=False, detail=f'{self._root} is not a directory')
        del info
        size = _tree_size(self._root)
        if not os.listdir(self._root):
            return Probe(exists=True, step_store=True, size_bytes=0, detail='an empty directory: a new store')
        try:
            if check_directory(self._root / INDEX_DIR, 'index folder'):
                return Probe(exists=True, step_store=True, size_bytes=size)
        except UnsafeEntryError as error:
            return Probe(exists=True, step_store=False, size_bytes=size, detail=str(error))
        for folder in self._run_folders():
            if os.path.isfile(os.path.join(folder, 'run.json')) and not os.path.islink(
                os.path.join(folder, 'run.json')
            ):
                return Probe(exists=True, step_store=True, size_bytes=size)
        return Probe(
            exists=True,
            step_store=False,
            size_bytes=size,
            detail=f'{self._root} holds no step store (no {INDEX_DIR}/ folder and no run folder with a run.json)',
        )

    # --- lifecycle and caches ---------------------------------------------------------------

    async def aclose(self) -> None:
        with self._runs_lock:
            self._runs.clear()

    def _state(self, run_id: str) -> RunState:
        """This process's cache for a run (bounded LRU; a forgotten run is simply re-read)."""
        with self._runs_lock:
            state = self._runs.get(run_id)
            if state is None:
                run_dir = self._root / run_dir_name(run_id)
                check_directory(run_dir, 'run folder')
                state = self._runs[run_id] = RunState(RunPaths(run_dir))
                while len(self._runs) > _MAX_CACHED_RUNS:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(run_id)
            return state

    def _drop_state(self, run_id: str) -> None:
        with self._runs_lock:
            self._runs.pop(run_id, None)


def _by_run(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row['run_id'], []).append(row)
    return list(groups.items())


def _tree_size(root: Path) -> int:
    """Bytes of the regular files under `root`, links not followed, at most 4 levels deep."""
    total = 0
    pending = [(root, 0)]
    while pending:
        folder, depth = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < 4:
                        pending.append((Path(entry.path), depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def _gaps(present: set[int], removed: set[int]) -> tuple[range, ...]:
    """The index ranges below the highest present index that hold neither an entry nor a removal."""
    gaps: list[range] = []
    expected = 0
    for index in sorted(present | removed):
        if index > expected:
            gaps.append(range(expected, index))
        expected = index + 1
    return tuple(gaps)


def _log_line(index: int, position: int, text: str) -> bytes:
    return b'{"i":%d,"p":%d,"m":%s}\n' % (index, position, text.encode('utf-8', 'surrogatepass'))


def _parse_log_line(text: bytes) -> LogEntry | None:
    try:
        value: object = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    data = cast(dict[str, Any], value)
    index, position, message = data.get('i'), data.get('p'), data.get('m')
    if not isinstance(index, int) or not isinstance(position, int) or not isinstance(message, dict):
        return None
    if index < 0 or position < 0:
        return None
    match = LOG_PREFIX.match(text)
    if match is not None and len(data) == 3 and text.endswith(b'}'):
        stored = text[match.end() : -1].decode('utf-8', 'surrogatepass')  # the stored text, as written
    else:
        stored = compact_json(cast(dict[str, Any], message))
    return LogEntry(index, position, stored)


def _snapshot_body(row: Row, log_size: int) -> bytes:
    """A snapshot file: its fields, the history named by `{"message_count", "log_size"}` under `messages`."""
    body = {key: value for key, value in row.items() if key not in ('message_count', 'log_size')}
    body['messages'] = {'message_count': row['message_count'], 'log_size': log_size}
    return line(body)


def _read_snapshot_file(path: Path, seq: int) -> SnapshotRow | None:
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return SnapshotRow(seq, Damaged(str(path), str(error)))
    try:
        data = json_object(raw)
    except ValueError as error:
        return SnapshotRow(seq, Damaged(str(path), str(error)))
    messages: object = data.pop('messages', None)
    if isinstance(messages, list):  # written by the upstream package: the history inline
        return SnapshotRow(seq, data, [compact_json(item) for item in cast(list[object], messages)])
    if isinstance(messages, dict):
        reference = cast(dict[str, Any], messages)
        data['message_count'] = reference.get('message_count')
        data['log_size'] = reference.get('log_size')
        if data['message_count'] is None and data['log_size'] is None:
            return SnapshotRow(seq, Damaged(str(path), f'its messages reference names no history: {reference!r}'))
        return SnapshotRow(seq, data)
    return SnapshotRow(seq, Damaged(str(path), f'"messages" must be a list or a log reference, got {messages!r}'))


def _snapshot_seqs(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(name[:-5]) for name in names if name.endswith('.json') and _SEQ_STEM.fullmatch(name[:-5])]


def _peek_state(path: Path) -> str | None:
    """The state of a snapshot file the ledger does not name; `None` if it cannot be read."""
    try:
        state = json_object(read_bytes(path)).get('state', 'complete')
    except (OSError, ValueError):
        return None
    return state if isinstance(state, str) else None


def _texts_in_folder(folder: Path, marker: bytes) -> list[str]:
    texts: list[str] = []
    for text in read_lines(folder / 'messages.jsonl'):
        if marker in text:
            entry = _parse_log_line(text)
            texts.append(entry.text if entry is not None else text.decode('utf-8', 'replace'))
    for seq in _snapshot_seqs(folder / SNAPSHOTS_DIR):  # the upstream layout keeps histories here
        with contextlib.suppress(OSError):
            raw = read_bytes(folder / SNAPSHOTS_DIR / f'{seq}.json')
            if marker in raw:
                texts.append(raw.decode('utf-8', 'replace'))
    return texts
