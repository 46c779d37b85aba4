"""File-level I/O of `DiskMediaStore`: reading, writing and refreshing one file, never through a link."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import stat
import uuid
from pathlib import Path

from ..._files import UnsafeEntryError, check_entry, fsync_dir, open_regular
from ._disk_keys import SIDECAR_SUFFIX

logger = logging.getLogger('pydantic_ai_steps.media')

FILE_MODE = 0o600
_UTIME_FOLLOWS_LINKS = os.utime not in os.supports_follow_symlinks


def sidecar(blob: Path) -> Path:
    return blob.with_name(blob.name + SIDECAR_SUFFIX)


def refresh(blob: Path, size: int) -> bool:
    """Mark a stored blob of `size` bytes as put now (its mtime); `False` if there is none to mark, or
    the file there has another size: damaged (cut short, say), it is written again. A link or
    another kind of entry planted at its name is `UnsafeEntryError`: a put never writes through
    it, nor takes it for the blob."""
    try:
        info = os.lstat(blob)
    except FileNotFoundError:
        return False
    check_entry(info, blob, 'media blob', directory=False)
    if info.st_size != size:
        logger.warning('media blob %s holds %d bytes, not the %d put: writing it again', blob, info.st_size, size)
        return False
    try:
        os.utime(blob, follow_symlinks=_UTIME_FOLLOWS_LINKS)
    except FileNotFoundError:  # collected just now: the caller writes it again
        return False
    return True


def hash_file(path: str) -> str | None:
    """SHA-256 of a regular file's bytes; `None` if it turned into something else (a link) meanwhile."""
    file = _open_regular(path)
    if file is None:
        return None
    with file:
        return hashlib.file_digest(file, 'sha256').hexdigest()


def read_regular(path: Path) -> bytes | None:
    """The bytes of the regular file at `path`; `None` if there is none, or another kind of entry (a
    link planted there, a folder, a FIFO) is there instead: a read never follows a link nor waits."""
    file = _open_regular(path)
    if file is None:
        return None
    with file:
        return file.read()


def _open_regular(path: str | Path) -> io.BufferedReader | None:
    try:
        fd, _ = open_regular(path, os.O_RDONLY, 'media blob')
    except (FileNotFoundError, UnsafeEntryError):
        return None
    return open(fd, 'rb')


def is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def write_atomic(target: Path, payload: bytes, durable: bool) -> None:
    """Write `payload` to a fresh 0o600 temp file beside `target`, then rename it over `target`."""
    temp = target.with_name(f'put-{uuid.uuid4().hex}.tmp')
    try:
        write_new_file(temp, payload, durable)
        os.replace(temp, target)
        if durable:
            fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def write_new_file(path: Path, payload: bytes, durable: bool) -> None:
    """Create `path` (it must not exist) readable by the owner only and write all of `payload` to it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_BINARY', 0), FILE_MODE)
    try:
        if hasattr(os, 'fchmod'):
            os.fchmod(fd, FILE_MODE)  # exactly 0o600, whatever the process umask
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
