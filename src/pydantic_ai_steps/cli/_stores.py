"""Store URLs: which backend a `--store` value names, and how to open, measure and reset it.

Every backend is one `Backend` registered under its URL scheme, so adding `mongodb://` or
`postgresql://` later is one class and one `register_backend` call; nothing else in the CLI
knows which backends exist. Two are built in:

- `sqlite:///relative/path.db`, `sqlite:////absolute/path.db` (SQLAlchemy's convention: the path
  follows the third slash), and a bare path ending in `.db`, `.sqlite` or `.sqlite3`;
- `file:///absolute/dir` (RFC 8089), `file:relative/dir`, and a bare path to an existing directory.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, unquote

from ..step_persistence import ContinuableSnapshot, StepStore
from ._errors import CliError

SQLITE_SUFFIXES = ('.db', '.sqlite', '.sqlite3')
_SQLITE_HEADER = b'SQLite format 3\x00'
_SCHEME = re.compile(r'([A-Za-z][A-Za-z0-9+.-]+):')
"""A URL scheme of two or more characters, so a Windows drive letter (`C:`) reads as a path."""


class InspectableStore(StepStore, Protocol):
    """What the inspector reads: the `StepStore` protocol plus `list_snapshots`, which every shipped
    store has (it is outside the protocol because the capability never needs it)."""

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]: ...


@dataclass(frozen=True)
class StoreLocation:
    """A parsed `--store` value: the backend that owns it, its target, and a URL to print back."""

    backend: Backend
    target: str
    """Backend-specific: a filesystem path for SQLite and File, a connection URL for servers."""
    url: str
    """How commands suggested to the user should name this store."""

    def exists(self) -> bool:
        return self.backend.exists(self)

    def open(self) -> InspectableStore:
        return self.backend.open(self)


class Backend(ABC):
    """One kind of store behind a URL scheme."""

    scheme: str
    """The URL scheme, without `://`."""
    example: str
    """A sample URL, shown in `--help` and in error messages."""

    @abstractmethod
    def parse(self, url: str) -> StoreLocation:
        """Turn a URL of this scheme into a location; raise `CliError` saying what is wrong."""

    def claims_path(self, path: Path) -> bool:
        """Whether a bare filesystem path (no scheme) names a store of this backend."""
        return False

    def from_path(self, path: Path) -> StoreLocation:
        raise CliError(f'{self.scheme} stores cannot be named by a bare path; use {self.example}')

    @abstractmethod
    def exists(self, location: StoreLocation) -> bool:
        """Whether a store is already there (inspecting must never create one by accident)."""

    @abstractmethod
    def check_store(self, location: StoreLocation) -> None:
        """Raise `CliError` when something is there but it is not a step store."""

    @abstractmethod
    def open(self, location: StoreLocation) -> InspectableStore: ...

    @abstractmethod
    def size_bytes(self, location: StoreLocation) -> int:
        """The store's footprint on disk (or on the server), for `stats`."""

    @abstractmethod
    def media_blobs(self, location: StoreLocation) -> int | None:
        """How many externalized media blobs the store's default media store holds (`None`: unknown)."""

    @abstractmethod
    def remove(self, location: StoreLocation) -> None:
        """Delete the whole store (the demo resets its own store with this)."""


class SqliteBackend(Backend):
    scheme = 'sqlite'
    example = 'sqlite:///steps.db'

    def parse(self, url: str) -> StoreLocation:
        rest = url[len('sqlite://') :]
        if not rest.startswith('/') or rest == '/':
            raise CliError(
                f'bad SQLite store URL {url!r}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db'
            )
        if '?' in rest or '#' in rest:
            raise CliError(f'bad SQLite store URL {url!r}: query strings and fragments are not supported')
        return StoreLocation(self, unquote(rest[1:]), url)

    def claims_path(self, path: Path) -> bool:
        if path.suffix.lower() in SQLITE_SUFFIXES:
            return True
        return path.is_file() and _has_sqlite_header(path)

    def from_path(self, path: Path) -> StoreLocation:
        return StoreLocation(self, str(path), sqlite_url(path))

    def exists(self, location: StoreLocation) -> bool:
        return Path(location.target).is_file()

    def check_store(self, location: StoreLocation) -> None:
        path = Path(location.target)
        if not _has_sqlite_header(path):
            raise CliError(f'{location.url} is not a SQLite database ({path} has no SQLite header)')
        try:
            with _read_only(path) as connection:
                row = connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'"
                ).fetchone()
        except sqlite3.Error as error:
            raise CliError(f'cannot read {location.url}: {error}') from None
        if row is None:
            raise CliError(f'{location.url} is a SQLite database but not a step store (it has no runs table)')

    def open(self, location: StoreLocation) -> InspectableStore:
        from ..step_persistence.stores.sqlite import SqliteStepStore

        return SqliteStepStore(database=location.target)

    def size_bytes(self, location: StoreLocation) -> int:
        """The database, its write-ahead log and any rollback journal: the files holding data.

        Not the `-shm` WAL index: shared memory that exists only while some connection is open
        (this command's own read-only check creates it), so counting it would make the size
        depend on who happens to be reading.
        """
        return sum(_file_size(path) for path in _sqlite_files(Path(location.target)) if not path.name.endswith('-shm'))

    def media_blobs(self, location: StoreLocation) -> int | None:
        """Rows of the `media` table that `SqliteMediaStore` keeps in the same database."""
        try:
            with _read_only(Path(location.target)) as connection:
                exists = connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'media'"
                ).fetchone()
                if exists is None:
                    return 0
                (count,) = connection.execute('SELECT COUNT(*) FROM media').fetchone()
        except sqlite3.Error:
            return None
        return int(count)

    def remove(self, location: StoreLocation) -> None:
        for path in _sqlite_files(Path(location.target)):
            path.unlink(missing_ok=True)


class FileBackend(Backend):
    scheme = 'file'
    example = 'file:///absolute/dir'

    def parse(self, url: str) -> StoreLocation:
        rest = url[len('file:') :]
        if '?' in rest or '#' in rest:
            raise CliError(f'bad file store URL {url!r}: query strings and fragments are not supported')
        if rest.startswith('//'):
            host, slash, path = rest[2:].partition('/')
            if host not in ('', 'localhost') or not slash:
                raise CliError(f'bad file store URL {url!r}: expected file:///absolute/dir or file:relative/dir')
            target = '/' + path
        else:
            target = rest
        if not target:
            raise CliError(f'bad file store URL {url!r}: no directory given')
        return StoreLocation(self, unquote(target), url)

    def claims_path(self, path: Path) -> bool:
        return path.is_dir()

    def from_path(self, path: Path) -> StoreLocation:
        return StoreLocation(self, str(path), file_url(path))

    def exists(self, location: StoreLocation) -> bool:
        return Path(location.target).is_dir()

    def check_store(self, location: StoreLocation) -> None:
        if not Path(location.target).is_dir():
            raise CliError(f'{location.url} is not a directory')

    def open(self, location: StoreLocation) -> InspectableStore:
        from ..step_persistence.stores.file import FileStepStore

        return FileStepStore(location.target)

    def size_bytes(self, location: StoreLocation) -> int:
        return sum(_file_size(path) for path in _walk_files(Path(location.target)))

    def media_blobs(self, location: StoreLocation) -> int | None:
        """Blobs of the default `DiskMediaStore` under `<dir>/media` (sidecars and temp files excluded)."""
        media = Path(location.target) / 'media'
        return sum(1 for path in _walk_files(media) if not path.name.endswith(('.meta.json', '.tmp')))

    def remove(self, location: StoreLocation) -> None:
        shutil.rmtree(location.target, ignore_errors=True)


BACKENDS: dict[str, Backend] = {}
"""Scheme -> backend, in registration order (the order `--help` lists them)."""


def register_backend(backend: Backend) -> None:
    """Make `<scheme>://...` store URLs open with `backend`."""
    BACKENDS[backend.scheme] = backend


register_backend(SqliteBackend())
register_backend(FileBackend())


def schemes_help() -> str:
    return ', '.join(backend.example for backend in BACKENDS.values())


def resolve(value: str) -> StoreLocation:
    """Parse a `--store` value: a URL of a registered scheme, or a bare path whose shape names one."""
    if not value:
        raise CliError(f'empty --store; expected a URL ({schemes_help()}) or a path')
    match = _SCHEME.match(value)
    if match is not None:
        scheme = match.group(1)
        backend = BACKENDS.get(scheme.lower())
        if backend is None:
            known = ', '.join(f'{name}:' for name in BACKENDS)
            raise CliError(f'unknown store scheme {scheme + ":"!r} in {value!r}; known schemes: {known}')
        return backend.parse(value)
    path = Path(value).expanduser()
    for backend in BACKENDS.values():
        if backend.claims_path(path):
            return backend.from_path(path)
    if path.exists():
        raise CliError(f'{value!r} is neither a SQLite database nor a directory; name a store like {schemes_help()}')
    raise CliError(
        f'no store at {value!r}; a bare path must end in {", ".join(SQLITE_SUFFIXES)} (SQLite) or be an '
        f'existing directory (File store), or use a URL: {schemes_help()}'
    )


def open_existing(value: str) -> tuple[StoreLocation, InspectableStore]:
    """Resolve and open a store that must already exist: inspecting never creates one."""
    location = resolve(value)
    if not location.exists():
        raise CliError(f'no store at {location.url} ({location.target} does not exist)')
    location.backend.check_store(location)
    return location, location.open()


async def close_store(store: object) -> None:
    """Release what a store holds open (SQLite connections), for stores that have `aclose`/`close`.

    Not part of the protocol, so looked up by name: a store without either has nothing to release.
    """
    aclose = getattr(store, 'aclose', None)
    if callable(aclose):
        pending = aclose()
        if inspect.isawaitable(pending):
            await pending
        return
    close = getattr(store, 'close', None)
    if callable(close):
        close()


def sqlite_url(path: Path) -> str:
    """`sqlite:///<path>`: relative paths stay relative (so printed commands stay short)."""
    return 'sqlite:///' + quote(path.as_posix(), safe='/:~')


def file_url(path: Path) -> str:
    """An absolute `file:///` URL: relative `file:` URLs are legal but easy to misread."""
    return 'file://' + quote(path.resolve().as_posix(), safe='/:~')


def _has_sqlite_header(path: Path) -> bool:
    try:
        with path.open('rb') as handle:
            return handle.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False


class _read_only:
    """A read-only connection, so checking a database never creates or migrates anything in it."""

    def __init__(self, path: Path) -> None:
        self._connection = sqlite3.connect(path.resolve().as_uri() + '?mode=ro', uri=True, timeout=5.0)

    def __enter__(self) -> sqlite3.Connection:
        return self._connection

    def __exit__(self, *exc: object) -> None:
        self._connection.close()


def _sqlite_files(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + suffix) for suffix in ('-wal', '-shm', '-journal'))]


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _walk_files(root: Path) -> Iterator[Path]:
    for directory, _, names in os.walk(root):
        for name in names:
            yield Path(directory) / name
