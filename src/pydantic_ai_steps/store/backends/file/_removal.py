"""What the File backend removes: run folders (through the trash), snapshot files, log entries.

A run folder leaves the store in one rename into `_index/trash`, so a reader never sees half a
run; the removal of the moved folder may be cut short by a crash, and the next deletion clears it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from ...._files import UnsafeEntryError, check_directory, ensure_directory, fsync_dir
from ._io import append_locked, json_object, line, logger, read_lines, replace_file
from ._paths import INDEX_DIR, TRASH_DIR, registered_id, run_dir
from ._state import LOG_PREFIX, REMOVED_PREFIX, RunState


def remove_run_folders(
    root: Path, run_ids: Sequence[str], *, durable: bool, forget: Callable[[str], None]
) -> list[str]:
    """Move each run's folder out of the store in one rename, then remove it; return the ids removed.

    A folder that is not one this store made (a link, a file) is left alone, with a warning.
    `forget` drops what the caller caches about a removed run.
    """
    trash: Path | None = None
    removed: list[str] = []
    for run_id in run_ids:
        folder = run_dir(root, run_id)
        try:
            if not check_directory(folder, 'run folder'):
                continue
        except UnsafeEntryError:
            logger.warning('not deleting %s: it is not a folder this store made', folder)
            continue
        holder = registered_id(folder)
        if holder is not None and holder != run_id:  # a case-insensitive file system folds `Run1` and `run1`
            logger.warning('not deleting %s for run %r: it holds run %r', folder, run_id, holder)
            continue
        if trash is None:  # checked before the first rename: an unsafe trash stops the call, nothing moved
            trash = _emptied_trash(root)
        target = trash / uuid.uuid4().hex
        try:
            os.rename(folder, target)
        except FileNotFoundError:
            continue
        removed.append(run_id)
        forget(run_id)
        shutil.rmtree(target, ignore_errors=True)
    if durable and removed:
        fsync_dir(root)
    return removed


def _emptied_trash(root: Path) -> Path:
    """`_index/trash`, made if missing, both checked: a run folder is never moved through a link.

    Anything in it is a deletion cut short (the process died in `rmtree`), removed now.
    """
    ensure_directory(root / INDEX_DIR, 'index folder')
    trash = root / INDEX_DIR / TRASH_DIR
    ensure_directory(trash, 'trash folder')
    with os.scandir(trash) as entries:
        leftovers = list(entries)
    for entry in leftovers:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    return trash


def remove_snapshot_files(state: RunState, seqs: Sequence[int]) -> None:
    for seq in seqs:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state.paths.snapshots / f'{seq}.json')
        state.live.pop(seq, None)


def rewrite_log_without(state: RunState, doomed: set[int], *, durable: bool) -> None:
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
        replace_file(path, header + b''.join(kept), durable)
    state.log_tail.reset()
    state.next_log_index = 0
