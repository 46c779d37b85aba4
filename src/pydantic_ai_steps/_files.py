"""File-system rules shared by the File step store and the Disk media store."""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import cast

_NONBLOCK = getattr(os, 'O_NONBLOCK', 0)
_OPEN_FLAGS = getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_BINARY', 0) | _NONBLOCK
"""Never through a link, never waiting on a FIFO (see `open_regular`)."""

STALE_TEMP_SECONDS = 3600
"""A temporary file unchanged this long was left by a killed process: a writer holds one only for a
write and a rename (`is_stale_temp`)."""

_euid: int | None = None
"""This process's effective user id, as last asked (see `_is_own`)."""


class UnsafeEntryError(PermissionError):
    """A store entry that is a link, not the kind of entry expected there, or owned by another user."""


_URL_SHAPED = re.compile(r'[A-Za-z][A-Za-z0-9+.-]+://')


def store_path(value: object, owner: str, *, directory: bool) -> str:
    """A store's path argument as a `str`, or a `ValueError` naming what was passed instead.

    An empty path is refused: SQLite opens `''` as a temporary database that vanishes on close,
    and a directory store would write into the current directory. So is a URL given where a
    directory goes (`'file:///var/steps'` would become a folder named `file:`).
    """
    what = 'directory' if directory else 'database'
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f'{owner} {what} must be a path (str or os.PathLike), got {type(value).__name__}')
    path = os.fspath(cast('str | os.PathLike[str]', value))
    if not isinstance(path, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'{owner} {what} must be a text path, got bytes {path!r}')
    if not path:
        remedy = "'.' for the current directory" if directory else 'a file name, or :memory:'
        raise ValueError(f'{owner} {what} is an empty path; pass {remedy}')
    if directory and _URL_SHAPED.match(path):
        raise ValueError(f'{owner} directory {path!r} is a URL, not a path; open store URLs with open_step_store(url)')
    return path


def check_entry(info: os.stat_result, path: Path | str, what: str, *, directory: bool) -> None:
    """The one rule for every entry a store uses: not a link, a directory or a regular file as
    expected, owned by this user. `info` is the entry's `lstat` (or the `fstat` of a descriptor
    opened with `O_NOFOLLOW`), so checking costs no system call of its own."""
    check_kind(info, path, what, directory=directory)
    if not _is_own(info.st_uid):
        raise UnsafeEntryError(f'{what} {path} belongs to another user (uid {info.st_uid}); refusing to use it')


def check_kind(info: os.stat_result, path: Path | str, what: str, *, directory: bool) -> None:
    """The part of `check_entry` that looks at the kind of entry only, not at its owner."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise _link_error(path, what)
    if directory and not stat.S_ISDIR(mode):
        raise UnsafeEntryError(f'{what} {path} is not a directory')
    if not directory and not stat.S_ISREG(mode):
        raise UnsafeEntryError(f'{what} {path} is not a regular file')


def open_regular(path: Path | str, flags: int, what: str) -> tuple[int, os.stat_result]:
    """`os.open` of the regular file at `path` (created 0o600 with `O_CREAT`), with its `fstat`.

    A link there is `UnsafeEntryError`, and so is any other entry that is not a regular file
    (`check_kind`); its owner is the caller's to check. The open is non-blocking, since opening
    a FIFO planted there for reading would wait for a writer before `fstat` could refuse it; the
    descriptor of a regular file is made blocking again.
    """
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _link_error(path, what) from None
        raise
    try:
        info = os.fstat(fd)
        check_kind(info, path, what, directory=False)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _link_error(path: Path | str, what: str) -> UnsafeEntryError:
    return UnsafeEntryError(f'{what} {path} is a symbolic link; the store does not follow links')


def check_directory(path: Path | str, what: str) -> bool:
    """Whether `path` is a real directory owned by this user; `False` if absent; else `UnsafeEntryError`."""
    return _check_path(path, what, directory=True)


def check_file(path: Path | str, what: str) -> bool:
    """Whether `path` is a regular file owned by this user; `False` if absent; else `UnsafeEntryError`."""
    return _check_path(path, what, directory=False)


def _check_path(path: Path | str, what: str, *, directory: bool) -> bool:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    check_entry(info, path, what, directory=directory)
    return True


def ensure_directory(path: Path, what: str) -> bool:
    """Create `path` (0o700; its parent must exist) unless it is there, then `check_directory` it;
    `True` if this call created it."""
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    check_directory(path, what)
    return created


def _is_own(uid: int) -> bool:
    """Whether `uid` is this process's effective user. The id is remembered and asked again only
    on a mismatch, so the check on the append path costs no system call; a process that changed
    its user still takes the entries it made before as its own."""
    global _euid
    if uid == _euid or not hasattr(os, 'geteuid'):
        return True
    _euid = os.geteuid()
    return uid == _euid


def is_stale_temp(info: os.stat_result) -> bool:
    """Whether a temporary file (`info` its `lstat`) is old enough to tidy: unchanged for
    `STALE_TEMP_SECONDS` by its mtime (its last write) and its status-change time (a rename or a
    link sets that one), so no live writer can still be about to move it into place."""
    return time.time() - max(info.st_mtime, info.st_ctime) >= STALE_TEMP_SECONDS


def fsync_dir(path: Path) -> None:
    """Flush `path`'s directory entries to disk, so a file created or renamed in it survives power loss.

    A no-op on Windows, where a directory cannot be opened (NTFS journals its metadata).
    """
    if sys.platform == 'win32':  # pragma: no cover - directories cannot be opened there
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))  # a FIFO there is refused, not waited on
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
