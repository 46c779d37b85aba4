"""The File backend's reads that need no per-run state: plain reads of whole files, from any thread."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ...._errors import shortened
from ...._files import UnsafeEntryError, check_directory
from ...._records import RunQuery
from ...backend import Damaged, LogEntry, LogSlice, Probe, Row, SnapshotRow
from ._formats import parse_log_line, read_snapshot_file, snapshot_seqs
from ._index import RunIndex
from ._io import json_object, last_line, logger, read_bytes, read_lines
from ._paths import EVENTS_FILE, INDEX_DIR, SNAPSHOTS_DIR, STATUS_FILE, is_run_dir_name, run_dir
from ._state import REMOVED_PREFIX, RunPaths

_CLOSING = {'run_completed': 'completed', 'run_failed': 'failed'}


class FileReads:
    def __init__(self, root: Path, index: RunIndex) -> None:
        self._root = root
        self._index = index
        self._status_cache: dict[str, tuple[int, int, Row]] = {}

    def run(self, run_id: str) -> Row | Damaged | None:
        paths = self._paths(run_id)
        if paths is None:
            return None
        try:
            row = json_object(read_bytes(paths.run))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnsafeEntryError as error:  # listing skips the run too: its index line is no stand-in
            return Damaged(str(paths.run), str(error))
        except (OSError, ValueError) as error:
            fallback = self._index.row_from_index(run_id)
            if fallback is None:
                return Damaged(str(paths.run), str(error))
            logger.warning('unreadable run record %s (%s); using its index entry', paths.run, error)
            row = fallback
        return self.with_status(row)

    def runs(self, query: RunQuery) -> list[Row | Damaged]:
        wanted = query.equalities()
        rows: list[Row | Damaged] = [self.with_status(row) for row in self._index.rows(wanted)]
        if query.newest_first:  # registration order, reversed: `RunQuery.apply` keeps it among equal start times
            rows.reverse()
        return [*rows, *self._index.unreadable()]  # unread, a record may match any query

    def with_status(self, row: Row) -> Row:
        """The row with `status` and `ended_at`: from `status.json`, or (runs closed by other writers)
        from the run's last event when it is a closing one."""
        run_id = row.get('run_id')
        if not isinstance(run_id, str):
            return row
        folder = run_dir(self._root, run_id)  # two files, not all of `RunPaths`: once per listed run
        with contextlib.suppress(OSError, ValueError):
            closed = json_object(read_bytes(folder / STATUS_FILE))
            if closed.get('status') in ('completed', 'failed'):
                return {**row, 'status': closed['status'], 'ended_at': closed.get('ended_at')}
        path = folder / EVENTS_FILE
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
                    kind = event.get('kind')
                    status = _CLOSING.get(kind) if isinstance(kind, str) else None
                    if status is not None:
                        closing = {'status': status, 'ended_at': event.get('timestamp')}
            cached = (*stamp, closing)
            self._status_cache[run_id] = cached
        return {**row, **cached[2]}

    def events(self, run_id: str) -> list[Row | Damaged]:
        paths = self._paths(run_id)
        if paths is None:
            return []
        path = paths.events
        rows: list[Row | Damaged] = []
        for number, text in enumerate(read_lines(path), start=1):
            try:
                rows.append(json_object(text))
            except ValueError as error:
                rows.append(Damaged(f'{path} line {number}', str(error)))
        return rows

    def snapshots(
        self, run_id: str, include_interrupted: bool, below_seq: int | None, limit: int | None, oldest_first: bool
    ) -> list[SnapshotRow]:
        paths = self._paths(run_id)
        if paths is None or not _is_safe(paths.snapshots, 'snapshot folder'):
            return []
        directory = paths.snapshots
        seqs = sorted(snapshot_seqs(directory), reverse=not oldest_first)
        found: list[SnapshotRow] = []
        for seq in seqs:
            if below_seq is not None and seq >= below_seq:
                continue
            row = read_snapshot_file(directory / f'{seq}.json', seq)
            if row is None:
                continue  # pruned since the folder was listed
            if not include_interrupted and not isinstance(row.row, Damaged) and row.row.get('state') != 'complete':
                continue
            found.append(row)
            if limit is not None and len(found) >= limit:
                break
        return found

    def log(self, run_id: str, below_index: int, positions_below: int) -> LogSlice:
        paths = self._paths(run_id)
        if paths is None:
            return LogSlice([], readable_end=0)
        path = paths.messages
        entries: list[LogEntry] = []
        present: set[int] = set()
        removed: set[int] = set()
        for text in read_lines(path):
            if text.startswith(REMOVED_PREFIX):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    removed.update(int(index) for index in json_object(text)['removed'])
                continue
            entry = parse_log_line(text)
            if entry is None:
                logger.warning('skipping damaged message log line in %s: %s', path, shortened(text))
                continue
            present.add(entry.index)
            if entry.index < below_index and entry.position < positions_below:
                entries.append(entry)
        end = max(present, default=-1) + 1
        return LogSlice(entries, _gaps(present, removed), readable_end=end)

    def _paths(self, run_id: str) -> RunPaths | None:
        """The run's files, if its folder is there and safe to read: one check for every read of a run."""
        folder = run_dir(self._root, run_id)
        return RunPaths(folder) if _is_safe(folder, 'run folder') else None

    def run_folders(self) -> list[str]:
        try:
            entries = list(os.scandir(self._root))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [entry.path for entry in entries if is_run_dir_name(entry.name) and entry.is_dir(follow_symlinks=False)]

    def probe(self) -> Probe:
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
        for folder in self.run_folders():
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


def _is_safe(directory: Path, what: str) -> bool:
    """`check_directory` for a read: an absent folder is `False`, an unsafe one too, with a warning."""
    try:
        return check_directory(directory, what)
    except UnsafeEntryError as error:
        logger.warning('skipping %s', error)
        return False


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


def texts_in_folder(folder: Path, marker: bytes) -> list[str]:
    texts: list[str] = []
    for text in read_lines(folder / 'messages.jsonl'):
        if marker in text:
            entry = parse_log_line(text)
            texts.append(entry.text if entry is not None else text.decode('utf-8', 'replace'))
    for seq in snapshot_seqs(folder / SNAPSHOTS_DIR):  # the upstream layout keeps histories here
        with contextlib.suppress(OSError):
            raw = read_bytes(folder / SNAPSHOTS_DIR / f'{seq}.json')
            if marker in raw:
                texts.append(raw.decode('utf-8', 'replace'))
    return texts
