"""`_index/runs.jsonl`: the File store's lineage index, mirrored in memory and refreshed from its tail.

Lines are full run rows (a registration), `{"deleted": run_id}` (a deletion), or
`{"repaired_through": offset}` (damage before that offset was handled). Which runs exist is
decided by `run.json`: a line whose run has no `run.json` is a registration that has not finished
(or never will); when a run has several lines (a registration raced a duplicate), `run.json` says
which one is real. A deletion line only tells other processes to forget the run: it hides no
folder. A deletion moves the run's folder into `_index/trash` in one rename before its line is
written, so a half-deleted folder is never at a run's name, and a folder there with a valid
`run.json` (copied back, say) is a run again.

Runs whose folder was made by another program (the upstream package writing the same
directory, or a run folder copied in) have no index line. The index notices them: whenever the
store directory's modification time changed since it last looked, it lists the directory and
reads the `run.json` of every folder it does not know, and a writer appends their lines.

Reading never writes: a missing index is rebuilt in memory by a scan, and written only by the
next registration. An index that is not safe to use (`_index` or `runs.jsonl` a link, or another
user's) is ignored with a warning by readers, which scan the folders instead, and refused by
writers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from ...._errors import shortened
from ...._files import UnsafeEntryError, check_directory, check_file, ensure_directory
from ...._records import RUN_EQUALITY_FIELDS
from ...backend import Damaged
from ...codec import Row
from .._offload import held
from ._io import Tail, append_locked, json_object, line, logger, read_bytes, write_exclusive
from ._paths import INDEX_DIR, INDEX_FILE, RUN_FILE, folder_names, is_run_dir_name, run_dir


class RunIndex:
    def __init__(self, root: Path, durable: Callable[[], bool]) -> None:
        self._root = root
        self._dir = root / INDEX_DIR
        self._path = self._dir / INDEX_FILE
        self._durable = durable
        self._lock = threading.Lock()
        self._tail = Tail()
        self._lines: dict[str, list[Row]] = {}
        self._confirmed: dict[str, Row] = {}
        self._registered_here: set[str] = set()
        self._repaired_through = 0
        self._needs_repair = False
        self._damaged = False
        self._seen_mtime: int | None = None
        self._noticed: dict[str, Row] = {}
        """Runs found by scanning the directory that the index file does not name (yet)."""
        self._unreadable: dict[str, Damaged] = {}
        """Folders the index does not name whose `run.json` the last scan could not read."""
        self._by_field: dict[tuple[str, object], dict[str, None]] | None = None
        """(field, value) -> ids of the confirmed runs with it, in registration order; rebuilt after
        the index or the folders changed, so `list_runs` by lineage does not confirm every run."""
        self._unconfirmed: dict[str, None] = {}
        """Runs the last rebuild could not confirm (a registration still writing): asked again each time."""

    # --- writing ----------------------------------------------------------------------------

    def append(self, text: bytes) -> None:
        """Append lines, creating the index from the run folders first if it is missing.

        Lines for runs found in folders the index did not name go first, and a marker after
        damage this process saw, so the next reader neither misses those runs nor warns again.
        """
        for _ in range(3):
            check_directory(self._dir, 'index folder')  # absent: the append below finds no file
            try:
                with append_locked(self._path, lock=False) as appender:
                    adopted = list(self._noticed.values())  # a copy: no lock may be waited for here
                    appender.write(b''.join(line(row) for row in adopted) + text, self._durable())
                    if self._damaged:
                        appender.write(line({'repaired_through': appender.size_after}), self._durable())
                        self._damaged = False
                return
            except FileNotFoundError:
                with held(self._lock):
                    self._create()
        raise FileNotFoundError(f'could not create the run index {self._path}')

    def registered(self, run_id: str) -> None:
        # No lock: this runs after the registration's writes, where waiting (a reader may hold
        # the lock for a while) is not allowed on the event loop; `set.add` is atomic.
        self._registered_here.add(run_id)

    def deleted(self, run_ids: list[str]) -> None:
        if run_ids:
            self.append(b''.join(line({'deleted': run_id}) for run_id in run_ids))

    # --- reading ----------------------------------------------------------------------------

    def rows(self, wanted: dict[str, str]) -> list[Row]:
        """Rows of existing runs whose fields equal `wanted` (by registration order)."""
        with self._lock:
            self._refresh()
            if wanted:
                by_field = self._lineage_map()
                known = min((by_field.get(item, {}) for item in wanted.items()), key=len)
                candidates = [*known, *self._unconfirmed]
            else:
                candidates = self._run_ids()
            found: list[Row] = []
            for run_id in candidates:
                row = self._confirm(run_id)
                if row is not None and all(row.get(name) == value for name, value in wanted.items()):
                    found.append(row)
            return found

    def _run_ids(self) -> list[str]:
        return [*self._lines, *(run_id for run_id in self._noticed if run_id not in self._lines)]

    def _lineage_map(self) -> dict[tuple[str, object], dict[str, None]]:
        if self._by_field is not None:
            return self._by_field
        by_field: dict[tuple[str, object], dict[str, None]] = {}
        self._unconfirmed = {}
        for run_id in self._run_ids():
            row = self._confirm(run_id)
            if row is None:
                self._unconfirmed[run_id] = None
                continue
            for name in RUN_EQUALITY_FIELDS:
                value = row.get(name)
                if value is None or isinstance(value, str):  # another type is damage: the record's reader reports it
                    by_field.setdefault((name, value), {})[run_id] = None
        self._by_field = by_field
        return by_field

    def unreadable(self) -> list[Damaged]:
        """Run records only a folder holds, and that do not read: listings report them as damage."""
        with self._lock:
            return list(self._unreadable.values())

    def row_from_index(self, run_id: str) -> Row | None:
        """The run's index line: its copy of `run.json`, when that file is unreadable."""
        with held(self._lock):
            self._refresh()
            lines = self._lines.get(run_id)
            return dict(lines[-1]) if lines else None

    def _confirm(self, run_id: str) -> Row | None:
        row = self._confirmed.get(run_id)
        if row is not None:
            return row
        lines = self._lines.get(run_id) or [self._noticed[run_id]]
        folder = run_dir(self._root, run_id)
        run_file = folder / RUN_FILE
        try:
            if not check_directory(folder, 'run folder'):
                return None
            if len(lines) == 1 and (run_id in self._registered_here or check_file(run_file, 'run record')):
                row = lines[0]
            else:
                row = json_object(read_bytes(run_file))
        except UnsafeEntryError as error:
            logger.warning('skipping run %r: %s', run_id, error)
            return None
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as error:
            logger.warning('unreadable run record %s (%s); using its index entry', run_file, error)
            row = lines[-1]
        self._confirmed[run_id] = row
        return row

    def _refresh(self) -> None:
        try:
            present = check_directory(self._dir, 'index folder') and os.path.lexists(self._path)
            if present:
                self._tail.sync_path(self._path, self._add_lines)
        except UnsafeEntryError as error:
            logger.warning('ignoring the run index (%s); scanning the run folders instead', error)
            present = False
        if not present:
            self._tail.reset()
            self._reset()
            self._scan_folders()
            return
        if self._needs_repair:
            self._scan_folders()
            self._needs_repair = False
        else:
            self._notice_new_folders()

    def _reset(self) -> None:
        self._by_field = None
        self._lines.clear()
        self._confirmed.clear()
        self._noticed.clear()
        self._unreadable.clear()
        self._repaired_through = 0
        self._needs_repair = False
        self._seen_mtime = None

    def _add_lines(self, lines: list[bytes], reset: bool) -> None:
        self._by_field = None
        if reset:
            self._reset()
        for text in lines:  # markers first: damage before one was already handled
            if text.startswith(b'{"repaired_through":'):
                try:
                    marker = json_object(text).get('repaired_through')
                except ValueError:
                    continue
                if isinstance(marker, int):
                    self._repaired_through = max(self._repaired_through, marker)
        position = self._tail.offset - sum(len(text) + 1 for text in lines)
        for text in lines:
            position += len(text) + 1
            if not text.strip():
                continue
            try:
                data = json_object(text)
            except ValueError:
                if position > self._repaired_through:
                    logger.warning('damaged line in run index %s: %s', self._path, shortened(text))
                    self._needs_repair = self._damaged = True
                continue
            repaired, deleted, run_id = data.get('repaired_through'), data.get('deleted'), data.get('run_id')
            if isinstance(repaired, int):
                self._repaired_through = max(self._repaired_through, repaired)
                self._needs_repair = self._damaged = False
            elif isinstance(deleted, str):
                self._confirmed.pop(deleted, None)
                self._lines.pop(deleted, None)
                self._noticed.pop(deleted, None)
            elif isinstance(run_id, str):
                lines_of_run = self._lines.setdefault(run_id, [])
                lines_of_run.append(data)
                self._noticed.pop(run_id, None)
                if len(lines_of_run) > 1:
                    self._confirmed.pop(run_id, None)
            elif position > self._repaired_through:
                logger.warning('unrecognised line in run index %s: %s', self._path, shortened(text))

    def _notice_new_folders(self) -> None:
        """List the store directory when it changed: folders the index does not name are runs too."""
        try:
            mtime = os.lstat(self._root).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._seen_mtime:
            self._scan_folders(mtime)

    def _scan_folders(self, mtime: int | None = None) -> None:
        if mtime is None:
            try:
                mtime = os.lstat(self._root).st_mtime_ns
            except FileNotFoundError:
                return
        self._seen_mtime = mtime
        self._by_field = None
        known = {name for run_id in (*self._lines, *self._noticed) for name in folder_names(run_id)}
        self._unreadable = {}
        try:
            entries = list(os.scandir(self._root))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name in known or not is_run_dir_name(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            run_file = Path(entry.path, RUN_FILE)
            try:
                check_directory(entry.path, 'run folder')  # unsafe: reported below, as an unreadable one
                row = json_object(read_bytes(run_file))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (OSError, ValueError) as error:
                self._unreadable[entry.name] = Damaged(f'run record {run_file}', str(error))  # the kernel warns
                continue
            run_id = row.get('run_id')
            if isinstance(run_id, str) and entry.name in folder_names(run_id):
                self._noticed[run_id] = row

    def _create(self) -> None:
        """Write the index file from the run folders (first registration, or after it was deleted)."""
        if os.path.lexists(self._path):
            return
        self._reset()
        self._scan_folders()
        text = b''.join(line(row) for row in self._noticed.values())
        if ensure_directory(self._dir, 'index folder') and self._durable():
            from ...._files import fsync_dir

            fsync_dir(self._root)
        # Exclusive create: if another process rebuilt it first, its file (and every line
        # appended to it since) stands, and this one is discarded.
        write_exclusive(self._path, text, self._durable())
        self._tail.reset()
