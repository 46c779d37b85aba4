"""File-level I/O of `DiskMediaStore`: reading, writing and refreshing one file, never through a link,
and tidying the temporary files a killed process left."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from ..._files import UnsafeEntryError, check_entry, fsync_dir, is_stale_temp, open_regular
from .._uri import uri_for_digest
from ._disk_keys import SIDECAR_SUFFIX

logger = logging.getLogger('pydantic_ai_steps.media')

FILE_MODE = 0o600
_UTIME_FOLLOWS_LINKS = os.utime not in os.supports_follow_symlinks
TEMP_NAME = re.compile(r'(?:put|gc)-[0-9a-f]{32}\.tmp')
_DELETING = re.compile(r'gc-[0-9a-f]{32}\.tmp')
"""Temporary files of puts, and blobs `delete` is about to remove (`gc-<32 hex>.tmp`): never listed."""


def temp_name(kind: str) -> str:
    """A fresh name matching `TEMP_NAME`: `kind` is `put` or `gc`."""
    return f'{kind}-{uuid.uuid4().hex}.tmp'


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
    temp = target.with_name(temp_name('put'))
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


def tidy_leftover(path: str, info: os.stat_result, blob_for: Callable[[str], Path], durable: bool) -> None:
    """Finish with a temporary file (`info` its `lstat`) once it is stale (`_files.is_stale_temp`: an hour old).

    Its age is from its status-change time, which the rename into a `gc-` name sets (the mtime is
    the blob's last put). A put's file is removed: the put never returned its URI. A delete's
    holds a blob that may still be referenced (a writer may have put it again while the delete
    looked at it), so it goes back to `blob_for(uri)` (its bytes give the URI), marked as put now:
    a put racing this may have written the blob just before, and its caller trusts it. If a whole
    copy is there already, the leftover is removed instead. Damaged bytes go back under the name
    they hash to, a blob nothing references, for a later collection. One whose blob the key
    strategy keeps in another folder (it changed since) is left, with a warning.
    """
    if not is_stale_temp(info):
        return  # a put or delete may be using it right now
    try:
        if os.path.basename(path).startswith('put-'):
            os.unlink(path)
            return
        blob = _blob_held(path, blob_for)
        if blob is None:
            if os.path.lexists(path):
                logger.warning(
                    'leaving %s, left by a deletion cut short: its blob does not belong in that folder', path
                )
            return
        if refresh(blob, info.st_size):
            os.unlink(path)
            return
        os.replace(path, blob)
        os.utime(blob, follow_symlinks=_UTIME_FOLLOWS_LINKS)
        if durable:
            fsync_dir(blob.parent)
    except FileNotFoundError:  # tidied by another process meanwhile
        return
    except OSError as error:
        logger.warning('leaving %s, which a put or deletion cut short left: %s', path, error)


def tidy_sidecar(path: str, blob: str, durable: bool) -> None:
    """Remove the sidecar at `path` if its blob is not there: a delete killed between removing a
    blob and its sidecar left it, and a later put of those bytes without metadata would read it.

    The sidecar is first renamed aside (a `put-` name, removed by a later collection if this process
    dies now); then the blob is looked for again, and so is a deletion's `gc-` file in the folder,
    which may be this blob held aside by a delete about to put it back. If either is there, the
    sidecar goes back under its name, unless a put wrote a new one meanwhile (`link` refuses to
    replace it): so a sidecar goes only while its blob is absent and no deletion may restore it.
    """
    if os.path.lexists(blob):
        return
    folder = os.path.dirname(path)
    aside = os.path.join(folder, temp_name('put'))
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # removed by a delete or another collection meanwhile
        return
    try:
        if os.path.lexists(blob) or _holds_deletion(folder) or os.path.lexists(blob):
            _put_back(aside, path, durable)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)


def _holds_deletion(folder: str) -> bool:
    with os.scandir(folder) as entries:
        return any(_DELETING.fullmatch(entry.name) for entry in entries)


def _put_back(aside: str, path: str, durable: bool) -> None:
    try:
        os.link(aside, path, follow_symlinks=False)
    except FileExistsError:  # a put wrote the blob's sidecar anew: its own stands
        return
    except OSError:  # a file system without hard links
        if os.path.lexists(path):
            return
        os.rename(aside, path)
    if durable:
        fsync_dir(Path(path).parent)


def _blob_held(path: str, blob_for: Callable[[str], Path]) -> Path | None:
    """Where the blob whose bytes the file at `path` holds is kept, if beside the file."""
    digest = hash_file(path)
    if digest is None:
        return None
    try:
        blob = blob_for(uri_for_digest(digest))
    except ValueError:  # a key the store refuses: no blob is kept under it
        return None
    return blob if os.path.dirname(os.path.abspath(blob)) == os.path.dirname(path) else None
