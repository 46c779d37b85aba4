"""Stores from URLs: `open_step_store('sqlite:///runs.db')`, and the CLI's `--store`, through one registry.

Each backend is one `StoreScheme` registered under its URL scheme; the networked ones are imported
only when a URL names them, so their drivers stay optional. Built in:

- `sqlite:///relative/path.db`, `sqlite:////absolute/path.db` (SQLAlchemy's convention: the path
  follows the third slash), and a bare path ending in `.db`, `.sqlite` or `.sqlite3`;
- `file:///absolute/dir` (RFC 8089), `file:relative/dir`, and a bare path to an existing directory;
- `memory:` (this process only);
- `postgresql://user@host:port/db` (also `postgres://`), `mongodb://host:port/db` (also `mongodb+srv://`).
"""

from __future__ import annotations

import importlib
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, urlsplit

from .._errors import StoreUrlError
from .._urls import raw_userinfo, redacted_url
from .protocol import ManagedStepStore

SQLITE_SUFFIXES = ('.db', '.sqlite', '.sqlite3')
_SQLITE_HEADER = b'SQLite format 3\x00'
_SCHEME = re.compile(r'([A-Za-z][A-Za-z0-9+.-]+):')
"""A URL scheme of two or more characters, so a Windows drive letter (`C:`) reads as a path."""


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store URL: the scheme that owns it, its target, and how to print it back."""

    scheme: StoreScheme
    target: str = field(repr=False)
    """Scheme-specific: a filesystem path for SQLite and File, a connection URL for servers (its
    password too: kept out of the repr, which a log or a traceback's locals may show)."""
    url: str
    """How messages should name this store (a server password is never shown)."""

    def open(self, **options: Any) -> ManagedStepStore:
        """A store over this location (created by its first write if nothing is there)."""
        return self.scheme.open(self, **options)


class StoreScheme(ABC):
    """One kind of store behind a URL scheme."""

    scheme: str
    """The URL scheme, without `:`."""
    aliases: tuple[str, ...] = ()
    example: str
    """A sample URL, shown in help and error messages."""

    @abstractmethod
    def parse(self, url: str) -> StoreLocation:
        """Turn a URL of this scheme into a location; raise `StoreUrlError` saying what is wrong."""

    def claims_path(self, path: Path) -> bool:
        """Whether a bare filesystem path (no scheme) names a store of this kind."""
        del path
        return False

    def from_path(self, path: Path) -> StoreLocation:
        raise StoreUrlError(f'{self.scheme} stores cannot be named by a bare path; use {self.example}')

    @abstractmethod
    def open(self, location: StoreLocation, **options: Any) -> ManagedStepStore: ...


class SqliteScheme(StoreScheme):
    scheme = 'sqlite'
    example = 'sqlite:///steps.db'

    def parse(self, url: str) -> StoreLocation:
        rest = url[len('sqlite://') :] if url.lower().startswith('sqlite://') else ''
        bad = f'bad SQLite store URL {redacted_url(url)!r}'
        if not rest.startswith('/') or rest == '/':
            raise StoreUrlError(f'{bad}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db')
        if '?' in rest or '#' in rest:
            raise StoreUrlError(f'{bad}: query strings and fragments are not supported')
        target = unquote(rest[1:])
        if '\x00' in target:
            raise StoreUrlError(f'{bad}: a path cannot hold a NUL character (%00)')
        if not Path(target).name:
            raise StoreUrlError(
                f'{bad}: no database file named; expected sqlite:///relative/path.db or sqlite:////absolute/path.db'
            )
        if target.startswith('file:'):  # SQLite may read it as a URI, which the read-only probe cannot follow
            raise StoreUrlError(
                f"{bad}: 'file:' starts a SQLite URI, not a path; a file of that name is sqlite:///./file:..."
            )
        return StoreLocation(self, target, url)

    def claims_path(self, path: Path) -> bool:
        if path.suffix.lower() in SQLITE_SUFFIXES:
            return True
        if not path.is_file():  # a FIFO would block the read below
            return False
        try:
            with path.open('rb') as handle:
                return path.is_file() and handle.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
        except OSError:
            return False

    def from_path(self, path: Path) -> StoreLocation:
        if str(path).startswith('file:'):  # `./file:x.db`: SQLite would read `file:x.db` as a URI
            path = path.absolute()
        return StoreLocation(self, str(path), 'sqlite:///' + quote(path.as_posix(), safe='/:~'))

    def open(self, location: StoreLocation, **options: Any) -> ManagedStepStore:
        from .backends.sqlite import SqliteStepStore

        return SqliteStepStore(database=location.target, **options)


class FileScheme(StoreScheme):
    scheme = 'file'
    example = 'file:///absolute/dir'

    def parse(self, url: str) -> StoreLocation:
        rest = url[len('file:') :]
        if '?' in rest or '#' in rest:
            raise StoreUrlError(
                f'bad file store URL {redacted_url(url)!r}: query strings and fragments are not supported'
            )
        if rest.startswith('//'):
            host, slash, path = rest[2:].partition('/')
            if host not in ('', 'localhost') or not slash:
                raise StoreUrlError(
                    f'bad file store URL {redacted_url(url)!r}: expected file:///absolute/dir or file:relative/dir'
                )
            target = '/' + path
        else:
            target = rest
        if not target:
            raise StoreUrlError(f'bad file store URL {redacted_url(url)!r}: no directory given')
        return StoreLocation(self, unquote(target), url)

    def claims_path(self, path: Path) -> bool:
        return path.is_dir()

    def from_path(self, path: Path) -> StoreLocation:
        return StoreLocation(self, str(path), 'file://' + quote(path.resolve().as_posix(), safe='/:~'))

    def open(self, location: StoreLocation, **options: Any) -> ManagedStepStore:
        from .backends.file import FileStepStore

        return FileStepStore(location.target, **options)


class MemoryScheme(StoreScheme):
    scheme = 'memory'
    example = 'memory:'

    def parse(self, url: str) -> StoreLocation:
        if url.rstrip('/') not in ('memory:', 'memory:/'):
            raise StoreUrlError(f'bad memory store URL {redacted_url(url)!r}: expected memory:')
        return StoreLocation(self, '', 'memory:')

    def open(self, location: StoreLocation, **options: Any) -> ManagedStepStore:
        from .backends.memory import InMemoryStepStore

        return InMemoryStepStore(**options)


class ServerScheme(StoreScheme):
    """A networked store, whose module (and driver) is imported only when a URL names it."""

    def __init__(
        self,
        scheme: str,
        aliases: tuple[str, ...],
        example: str,
        loader: str,
        *,
        repeatable: frozenset[str] = frozenset(),
        pymongo_query: bool = False,
    ) -> None:
        self.scheme = scheme
        self.aliases = aliases
        self.example = example
        self._loader = loader
        self.repeatable = repeatable
        """Query parameters the driver takes more than once (in lower case), such as pymongo's `readPreferenceTags`."""
        self.pymongo_query = pymongo_query
        """Whether the driver reads the query as pymongo does (`;` separates too, names in any case),
        or as libpq does (`&` only, names as written)."""

    def parse(self, url: str) -> StoreLocation:
        if _password_split_early(url):
            raise StoreUrlError(
                f'bad {self.scheme} store URL {redacted_url(url)!r}: a "/", "?" or "#" in the user name or password '
                'must be percent-encoded (%2F, %3F, %23)'
            )
        try:
            parts = urlsplit(url)
            _check_ports(parts.netloc)
        except ValueError as error:
            raise StoreUrlError(
                f'bad {self.scheme} store URL {redacted_url(url)!r}: {error}; expected {self.example}'
            ) from None
        repeated = _repeated_parameter(parts.query, self.repeatable, pymongo=self.pymongo_query)
        if repeated is not None:
            raise StoreUrlError(
                f'bad {self.scheme} store URL {redacted_url(url)!r}: the query parameter {repeated!r} is given more '
                'than once, and only one of its values would be used; give it once'
            )
        if not parts.hostname and parts.scheme != 'mongodb+srv' and not _host_in_query(parts.query):
            raise StoreUrlError(f'bad {self.scheme} store URL {redacted_url(url)!r}: no host; expected {self.example}')
        return StoreLocation(self, url, redacted_url(url))

    def open(self, location: StoreLocation, **options: Any) -> ManagedStepStore:
        module_name, _, attribute = self._loader.partition(':')
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise StoreUrlError(f'{location.url} needs a driver that is not installed: {error}') from None
        return getattr(module, attribute)(location, **options)


def _check_ports(netloc: str) -> None:
    """Each host's port, if it has one, is a number in 0-65535: a URL may name several hosts
    (`mongodb://h1:27017,h2:27017/db?replicaSet=rs`, libpq's `postgresql://u@h1:5432,h2:5432/db`)."""
    for host in netloc.rpartition('@')[2].split(','):
        urlsplit(f'//{host}').port  # noqa: B018 - read to check it: a port outside 0-65535 raises here


def _host_in_query(query: str) -> bool:
    """libpq's form for a Unix socket or several hosts: `postgresql://user@/db?host=/run/postgresql`."""
    return any(name == 'host' and value for name, value in parse_qsl(query, keep_blank_values=True))


def _repeated_parameter(query: str, repeatable: frozenset[str], *, pymongo: bool) -> str | None:
    """The first query parameter named again, as the driver reads names (pymongo: in any case, and
    `;` separates them too), unless the driver takes it several times; `None` if there is none."""
    seen: set[str] = set()
    for item in re.split('[&;]' if pymongo else '&', query):
        name = unquote_plus(item.partition('=')[0])
        key = name.lower() if pymongo else name
        if not name or key in repeatable:
            continue
        if key in seen:
            return name
        seen.add(key)
    return None


def _password_split_early(url: str) -> bool:
    """A raw `/`, `?` or `#` in a password ended the netloc inside it: `user:pass` with no `@`,
    whose "port" is not a number (a URL with an `@` only in its query has a numeric port, or none)."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:  # an unbalanced IPv6 bracket: the caller's own check reports it
        return False
    if '@' in netloc or ':' not in netloc or raw_userinfo(url) is None:
        return False
    return not netloc.rpartition(':')[2].isdigit()


SCHEMES: dict[str, StoreScheme] = {}
"""Scheme (and alias) -> store kind, in registration order (the order help texts list them)."""


def register_scheme(kind: StoreScheme) -> None:
    """Make `<scheme>:...` store URLs open with `kind` (the CLI's `--store` included)."""
    for name in (kind.scheme, *kind.aliases):
        SCHEMES[name.lower()] = kind


register_scheme(SqliteScheme())
register_scheme(FileScheme())
register_scheme(MemoryScheme())
register_scheme(
    ServerScheme(
        'postgresql',
        ('postgres',),
        'postgresql://user@host:5432/db',
        'pydantic_ai_steps.store.backends.postgres:open_location',
    )
)
register_scheme(
    ServerScheme(
        'mongodb',
        ('mongodb+srv',),
        'mongodb://host:27017/db',
        'pydantic_ai_steps.store.backends.mongo:open_location',
        repeatable=frozenset({'readpreferencetags'}),
        pymongo_query=True,
    )
)


def schemes_help() -> str:
    return ', '.join(dict.fromkeys(kind.example for kind in SCHEMES.values()))


def resolve(value: str | os.PathLike[str]) -> StoreLocation:
    """Parse a store URL of a registered scheme, or a bare path (a `str` or a `Path`) whose shape names one."""
    if isinstance(value, os.PathLike):
        fspath = os.fspath(value)
        if not isinstance(fspath, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise StoreUrlError(f'a store path must be text, got {type(fspath).__name__}')
        return _from_path(fspath)
    if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise StoreUrlError(f'a store URL must be a str (or a path), got {type(value).__name__}')
    if not value:
        raise StoreUrlError(f'empty store URL; expected one of {schemes_help()}, or a path')
    match = _SCHEME.match(value)
    if match is not None:
        scheme = match.group(1).lower()
        kind = SCHEMES.get(scheme)
        if kind is None:
            known = ', '.join(f'{name}:' for name in SCHEMES)
            raise StoreUrlError(
                f'unknown store scheme {scheme + ":"!r} in {redacted_url(value)!r}; known schemes: {known}'
            )
        return kind.parse(value)
    return _from_path(value)


def _from_path(value: str) -> StoreLocation:
    path = Path(value).expanduser()
    for kind in dict.fromkeys(SCHEMES.values()):
        if kind.claims_path(path):
            return kind.from_path(path)
    if path.exists():
        raise StoreUrlError(
            f'{redacted_url(value)!r} is neither a SQLite database nor a directory; name a store like {schemes_help()}'
        )
    raise StoreUrlError(
        f'no store at {redacted_url(value)!r}; a bare path must end in {", ".join(SQLITE_SUFFIXES)} (SQLite) or be an '
        f'existing directory (File store), or use a URL: {schemes_help()}'
    )


def open_step_store(url: str | os.PathLike[str], **options: Any) -> ManagedStepStore:
    """The store a URL names, with the store's own keyword arguments (`max_snapshots_per_run=` and so on).

    ```python
    store = open_step_store('sqlite:///runs.db')
    ```
    """
    return resolve(url).open(**options)
