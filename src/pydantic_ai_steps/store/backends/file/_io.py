"""File primitives of the File store: whole-line appends, exclusive atomic writes, tails, safe paths.

Every file is created owner-only (0o600, directories 0o700): runs hold prompts and tool results.
No file is opened through a symbolic link (`O_NOFOLLOW`) or waited on (a FIFO planted at a
file's name is refused like a folder), every file opened is checked to be a regular file owned by
this user (on the `fstat` the open needs anyway), and every directory the store enters is checked
the same way first (`check_directory`, the rule in `_files`), so a link or another user's entry
planted in a store directory can neither make the store write elsewhere nor feed it records.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ...._files import check_entry, fsync_dir, open_regular
from ...._json import compact_json, loads
from .._offload import WouldBlock, may_wait

logger = logging.getLogger('pydantic_ai_steps.file_store')

FILE_MODE = 0o600
DIR_MODE = 0o700
TEMP_NAME = re.compile(r'.+\.[0-9a-f]{32}\.tmp')
"""A write's temporary file beside its target (`temp_path`): never read, tidied once stale (`_removal`)."""

if sys.platform != 'win32':
    import fcntl

    def lock_fd(fd: int) -> None:
        """`flock` the file; when the caller may not wait (see `_offload`), only if it is free."""
        if may_wait():
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WouldBlock from None

else:  # pragma: no cover - Windows has no flock; see the FileStepStore docstring

    def lock_fd(fd: int) -> None:
        del fd


def open_file(path: Path, flags: int) -> tuple[int, os.stat_result]:
    """The regular file of this user at `path`, opened by `open_regular` (never through a link, never
    waiting on a FIFO) and checked by `check_entry` (`UnsafeEntryError`), with its `fstat`."""
    fd, info = open_regular(path, flags, 'file')
    try:
        check_entry(info, path, 'file', directory=False)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


@dataclass
class Appender:
    """One append session on an open `O_APPEND` descriptor; remembers the file size around it."""

    path: Path
    fd: int
    inode: int
    size_before: int = -1
    size_after: int = -1

    def write(self, data: bytes, durable: bool) -> None:
        """Append whole lines in one `write`; close a torn last line first (see the store docs)."""
        if self.size_before < 0:
            size = os.fstat(self.fd).st_size
            self.size_before = self.size_after = size
            if size and read_at(self.fd, 1, size - 1) != b'\n':
                data = b'\n' + data
        write_all(self.fd, data)
        if durable:
            os.fsync(self.fd)
            if self.size_before == 0:  # maybe a new file: make its name durable too
                fsync_dir(self.path.parent)
        self.size_after += len(data)


@contextmanager
def append_locked(path: Path, *, lock: bool = True) -> Generator[Appender]:
    """An `O_APPEND` descriptor on `path` (created if missing, its directory never), under `flock`
    unless `lock=False` (closing releases it). `FileNotFoundError` when the directory is gone."""
    fd, info = open_file(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        if lock:
            lock_fd(fd)
        yield Appender(path, fd, info.st_ino)
    finally:
        os.close(fd)


def write_exclusive(target: Path, data: bytes, durable: bool, *, sync_dir: bool = True) -> bool:
    """Write `target` atomically and only if it does not exist yet; `False` if it already did.

    The bytes go to a temporary file in the same directory, which is then hard-linked to the final
    name: readers see the whole file or none of it, and `link` refuses an existing name (unlike
    `rename`), which is what makes registration and seq allocation exclusive across processes.
    """
    with _temporary(target, data, durable) as temp:
        try:
            os.link(temp, target, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:  # a file system without hard links: create the name itself, exclusively
                _write_new(target, data, durable)
            except FileExistsError:
                return False
            return True
    if durable and sync_dir:
        fsync_dir(target.parent)
    return True


def replace_file(target: Path, data: bytes, durable: bool) -> None:
    """Write `target` atomically, replacing what is there (temp file + rename)."""
    with _temporary(target, data, durable) as temp:
        os.replace(temp, target)
    if durable:
        fsync_dir(target.parent)


@contextmanager
def _temporary(target: Path, data: bytes, durable: bool) -> Generator[Path]:
    """`data` in a fresh temporary file beside `target`, removed afterwards unless moved into place."""
    temp = temp_path(target)
    try:
        _write_new(temp, data, durable)
        yield temp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def temp_path(target: Path) -> Path:
    """A fresh name matching `TEMP_NAME` beside `target`: `<target name>.<32 hex>.tmp`."""
    return target.with_name(f'{target.name}.{uuid.uuid4().hex}.tmp')


def _write_new(path: Path, data: bytes, durable: bool) -> None:
    """Create `path` (it must not exist: `FileExistsError`), owner-only, holding `data`."""
    fd, _ = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_at(fd: int, size: int, offset: int) -> bytes:
    """`os.pread`, or seek-and-read where it does not exist (Windows)."""
    if hasattr(os, 'pread'):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - Windows
    return os.read(fd, size)  # pragma: no cover - Windows


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until done: one call for a regular file, unless interrupted or out of space."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def make_dir(path: Path) -> bool:
    """Create `path` (owner-only; missing parents too); `True` if this call created it."""
    try:
        os.mkdir(path, DIR_MODE)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        return make_dir(path)


def read_bytes(path: Path) -> bytes:
    """A file's bytes, never through a link; `FileNotFoundError` if absent, `UnsafeEntryError` and
    friends (`OSError`) if it is not a readable regular file of this user."""
    fd, info = open_file(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, max(info.st_size, 1 << 16)):
            chunks.append(chunk)
        return b''.join(chunks)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[bytes]:
    """Complete, non-blank lines of `path`; a partial last line is skipped with a warning.

    A path that is missing reads as empty; one that is not a regular file as well, with a warning.
    """
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return []
    except OSError as error:
        logger.warning('skipping %s: %s', path, error)
        return []
    end = data.rfind(b'\n') + 1
    if end < len(data):
        logger.warning('skipping incomplete last line of %s (%d bytes)', path, len(data) - end)
    return [line for line in data[:end].split(b'\n') if line.strip()]


def json_object(raw: bytes | str) -> dict[str, Any]:
    """Parse a JSON object; `ValueError` (never another error) for anything else."""
    value = loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f'expected a JSON object, got {type(value).__name__}')
    return cast(dict[str, Any], value)


def line(document: dict[str, Any]) -> bytes:
    return compact_json(document).encode('utf-8', 'surrogatepass') + b'\n'


Consumer = Callable[[list[bytes], bool], None]
"""Receives new complete lines, and whether to forget what it read before (file replaced)."""


@dataclass
class Tail:
    """How far this process has read an append-only file (by byte offset and inode)."""

    offset: int = 0
    inode: int | None = None

    def reset(self) -> None:
        self.offset = 0
        self.inode = None

    def sync_path(self, path: Path, consume: Consumer) -> None:
        """Read complete lines appended since the last sync (a partial last line is left for later)."""
        try:
            info = os.lstat(path)
            if info.st_ino == self.inode and info.st_size == self.offset:
                return  # nothing new: the common case, one stat instead of open + fstat + close
            fd, info = open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            if self.inode is not None:
                self.reset()
                consume([], True)
            return
        try:
            self._sync(fd, path, consume, None, info)
        finally:
            os.close(fd)

    def sync_fd(self, fd: int, path: Path, consume: Consumer, torn: Callable[[], None] | None = None) -> None:
        """Like `sync_path`, on a file this process holds the `flock` of.

        No other writer can be mid-append, so a partial last line is a torn one: it is counted
        (`torn`) and closed with a newline so the next append starts on a fresh line.
        """
        self._sync(fd, path, consume, torn)

    def follows(self, appender: Appender) -> bool:
        """After an append: advance past it if the cache had read everything before it."""
        if appender.size_before == self.offset and appender.inode == self.inode:
            self.offset = appender.size_after
            return True
        return False

    def _sync(
        self,
        fd: int,
        path: Path,
        consume: Consumer,
        torn: Callable[[], None] | None,
        info: os.stat_result | None = None,
    ) -> None:
        """`info`: the checked `fstat` of `fd`, if its opener took it (`open_file`)."""
        if info is None:
            info = os.fstat(fd)
            check_entry(info, path, 'file', directory=False)
        if info.st_ino != self.inode or info.st_size < self.offset:
            if self.inode is not None:
                logger.warning('%s was replaced or truncated; re-reading it', path)
            self.offset = 0
            self.inode = info.st_ino
            consume([], True)
        size = info.st_size
        if size == self.offset:
            return
        data = read_at(fd, size - self.offset, self.offset)
        end = data.rfind(b'\n') + 1
        lines = data[:end].split(b'\n')[:-1] if end else []
        self.offset += end
        if lines:
            consume(lines, False)
        if end < len(data) and torn is not None:
            logger.warning('%s ends in a torn line (%d bytes); skipping it', path, len(data) - end)
            os.write(fd, b'\n')
            self.offset = size + 1
            torn()


def last_line(path: Path) -> bytes | None:
    """The last complete line of a file, read from its end; `None` if there is none."""
    try:
        fd, info = open_file(path, os.O_RDONLY)
    except OSError:  # absent, not a regular file of this user: no line to read
        return None
    try:
        size = info.st_size
        chunk = 4096
        while True:
            start = max(0, size - chunk)
            data = read_at(fd, size - start, start)
            end = data.rfind(b'\n')  # where the last complete line ends
            begin = data.rfind(b'\n', 0, max(end, 0)) + 1
            if end >= 0 and (begin > 0 or start == 0):
                return data[begin:end] or None
            if start == 0 or chunk >= 1 << 22:
                return None
            chunk *= 4
    finally:
        os.close(fd)
