"""What the File backend removes: run folders (through the trash), snapshot files, log entries,
and what killed writes left.

A run folder leaves the store in one rename into `_index/trash`, so a reader never sees half a
run; the removal of the moved folder may be cut short by a crash, and the next deletion, or the
next tidying of leftovers, clears it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from ...._files import UnsafeEntryError, check_directory, check_entry, ensure_directory, fsync_dir, is_stale_temp
from ._io import TEMP_NAME, append_locked, json_object, line, logger, read_lines, replace_file
from ._paths import INDEX_DIR, SNAPSHOTS_DIR, TRASH_DIR, is_run_dir_name, registered_id, run_dir
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
    _empty(trash)
    return trash


def _empty(trash: Path) -> None:
    """Remove what the trash holds: folders already out of the store, which nothing reads."""
    with os.scandir(trash) as entries:
        leftovers = list(entries)
    for entry in leftovers:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def tidy_leftovers(root: Path) -> None:
    """Remove what writes killed midway left: stale temporary files, and folders in the trash.

    Nothing stored or still in use goes. A temporary file (`TEMP_NAME`) has a fresh name of its
    own, which its writer moves into place (rename, or hard link then unlink) right after writing
    it, and no reader opens one; unchanged for an hour (`is_stale_temp`), it belongs to a writer
    that died, so no live writer can still move it. One a hard link had already placed is a second
    name of a stored file, which keeps its own. Only the folders writes use are looked at (the
    index folder and each run folder with its snapshots), never through a link, and only regular
    files of this user are removed. The trash holds folders already moved out of the store.
    """
    index = root / INDEX_DIR
    folders = [index]
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if is_run_dir_name(entry.name) and entry.is_dir(follow_symlinks=False):
            folders += [Path(entry.path), Path(entry.path, SNAPSHOTS_DIR)]
    for folder in folders:
        _remove_stale_temporaries(folder)
    trash = index / TRASH_DIR
    try:
        if check_directory(index, 'index folder') and check_directory(trash, 'trash folder'):
            _empty(trash)
    except UnsafeEntryError as error:
        logger.warning('not tidying %s', error)


def _remove_stale_temporaries(folder: Path) -> None:
    try:
        if not check_directory(folder, 'folder'):
            return
        entries = list(os.scandir(folder))
    except UnsafeEntryError as error:
        logger.warning('not tidying %s', error)
        return
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if not TEMP_NAME.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            check_entry(info, entry.path, 'temporary file', directory=False)
            if is_stale_temp(info):
                os.unlink(entry.path)
        except (FileNotFoundError, UnsafeEntryError):
            continue  # gone meanwhile, or not a file this store wrote: left alone
        except OSError as error:
            logger.warning('leaving %s, which a write cut short left: %s', entry.path, error)


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
