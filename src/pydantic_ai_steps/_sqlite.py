"""SQLite rules shared by the SQLite step store and the SQLite media store."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ._errors import DatabaseLockedError, DatabaseReadOnlyError
from ._files import store_path

BUSY_TIMEOUT_MS = 30_000
"""How long a store's own connection waits for another connection's write lock (both SQLite stores)."""


def is_uri(database: str) -> bool:
    """Whether SQLite takes `database` for a URI (`file:...`): opened with `uri=True`, so on every
    build, not only those compiled to read URIs in plain file names."""
    return database.startswith('file:')


def database_path(value: object, owner: str) -> str:
    """A store's `database=` as it will be opened, for as long as the store lives: a relative path
    made absolute now. The store opens its connection lazily and reopens it after `close()`, and its
    checkpoint thread connects again each time: after an `os.chdir` a relative path would name
    another file (and create it). Not normalized: `..` after a link is the link target's parent."""
    path = store_path(value, owner, directory=False)
    if path == ':memory:' or is_uri(path) or os.path.isabs(path):
        return path
    return os.path.join(os.getcwd(), path)


def open_database(
    database: str, *, durable: bool, timeout: float, check: Callable[[sqlite3.Connection], object] | None = None
) -> sqlite3.Connection:
    """A store's own connection to a database file, set up the same way by both SQLite stores.

    A new file (a link's missing target too) is created readable by its owner only (SQLite gives its
    `-wal` and `-shm` files the database's permissions: the whole database holds prompts and tool
    results), with incremental auto-vacuum, so deleting runs can give space back (that can only be
    chosen before the journal mode and the first table), and in WAL mode. An existing one is first
    given to `check`, which raises to refuse it while nothing in it has changed, and keeps its
    journal mode: the store's first write switches it to WAL (`enable_wal`), so a store that only
    reads (an inspector) changes nothing in it. Then `synchronous` by `durable`.
    """
    new = False
    if database != ':memory:' and not is_uri(database):
        path = Path(os.path.realpath(database))  # SQLite follows a link, and creates a missing target
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0), 0o600)
        except FileExistsError:
            new = os.path.getsize(path) == 0
        else:
            os.close(fd)
            new = True
    connection = sqlite3.connect(
        database, isolation_level=None, check_same_thread=False, timeout=timeout, uri=is_uri(database)
    )
    if new:
        connection.execute('PRAGMA auto_vacuum = INCREMENTAL')
        enable_wal(connection)
    elif check is not None:
        try:
            try:
                check(connection)
            except sqlite3.OperationalError as error:
                immutable = immutable_uri(database, error)
                if immutable is None:
                    raise
                connection.close()
                connection = sqlite3.connect(immutable, uri=True, isolation_level=None, check_same_thread=False)
                check(connection)
        except BaseException:
            connection.close()
            raise
    connection.execute(f'PRAGMA synchronous={"FULL" if durable else "NORMAL"}')
    return connection


def immutable_uri(database: str, error: sqlite3.Error) -> str | None:
    """A URI that reads a WAL database on a read-only file system, if `error` is SQLite failing to
    open it there; `None` otherwise.

    SQLite reads a WAL database through its `-shm` file, which it cannot create on a read-only mount
    once the last writer has closed the database (and removed it). Opened `immutable`, SQLite reads
    the file alone, which then holds every commit: no `-wal` file is left, and nothing can write there
    meanwhile. Every write through it fails as SQLite's `attempt to write a readonly database`.
    """
    if getattr(error, 'sqlite_errorcode', 0) & 0xFF != sqlite3.SQLITE_CANTOPEN or is_uri(database):
        return None
    real = os.path.realpath(database)
    try:
        read_only = os.statvfs(os.path.dirname(real)).f_flag & os.ST_RDONLY
    except (OSError, AttributeError):  # pragma: no cover - no statvfs (Windows)
        return None
    if not read_only or os.path.lexists(real + '-wal'):
        return None
    return Path(real).as_uri() + '?immutable=1'


def raise_if_lock_timed_out(
    error: sqlite3.OperationalError,
    connection: sqlite3.Connection | None,
    *,
    database: str | None = None,
    timeout_ms: int | None = None,
) -> None:
    """Raise a `DatabaseLockedError` naming the file and the wait if `error` is SQLite's bare
    `database is locked` after the busy timeout, or naming the caller's open transaction if SQLite
    refused at once to make that transaction a write (no wait can help it); return otherwise.
    `database` and `timeout_ms` default to what `connection` says (it must be given unless both are).
    A write to a database this process may only read raises `DatabaseReadOnlyError` naming it."""
    if isinstance(error, DatabaseLockedError | DatabaseReadOnlyError):
        return
    if error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_READONLY:
        where = database or database_file(connection) or ':memory:'
        read_only = DatabaseReadOnlyError(
            f'SQLite database {where!r} cannot be written by this process ({error}): the file, or the file '
            'system or directory it is in, is read-only to it; reads of it still work'
        )
        read_only.sqlite_errorcode, read_only.sqlite_errorname = error.sqlite_errorcode, error.sqlite_errorname
        raise read_only from error
    if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
        return
    where = database or database_file(connection) or ':memory:'
    if error.sqlite_errorcode == sqlite3.SQLITE_BUSY_SNAPSHOT:
        message = (
            f'SQLite database {where!r} cannot be written in the transaction open on this connection: it '
            'began reading before another connection (maybe in another process) committed, and SQLite cannot '
            'turn such a transaction into a write; end it (commit or roll back) and write again'
        )
    else:
        if timeout_ms is None:
            assert connection is not None
            timeout_ms = int(connection.execute('PRAGMA busy_timeout').fetchone()[0])
        message = (
            f'SQLite database {where!r} is locked: another connection (maybe in another process) held its '
            f'write lock for all of the {timeout_ms / 1000:g} s busy timeout; try again once that writer has '
            'committed or rolled back'
        )
    locked = DatabaseLockedError(message)
    locked.sqlite_errorcode, locked.sqlite_errorname = error.sqlite_errorcode, error.sqlite_errorname
    raise locked from error


def database_file(connection: sqlite3.Connection | None) -> str | None:
    """The file behind a connection's main database; `None` for an in-memory or temporary one."""
    if connection is None:
        return None
    for _, name, path in connection.execute('PRAGMA database_list').fetchall():
        if name == 'main':
            return path or None
    return None  # pragma: no cover - every connection has a main database


def require_cross_thread_use(connection: sqlite3.Connection, owner: str) -> None:
    """Fail at construction, with the reason, on a connection only its creating thread may use.

    Every store call runs on a worker thread so the event loop never blocks on disk I/O, and
    `sqlite3` refuses such use of a connection opened with the default `check_same_thread=True`,
    but only at its first use, deep inside a run. Probing from another thread now says why.
    """
    failures: list[sqlite3.ProgrammingError] = []

    def probe() -> None:
        try:
            connection.cursor().close()
        except sqlite3.ProgrammingError as error:
            failures.append(error)

    thread = threading.Thread(target=probe, name='pydantic-ai-steps-sqlite-probe', daemon=True)
    thread.start()
    thread.join()
    if not failures:
        return
    error = failures[0]
    if 'thread' in str(error):
        raise ValueError(
            f'{owner}(connection=...) needs a connection opened with sqlite3.connect(..., check_same_thread=False): '
            'the store runs every call on a worker thread so the event loop never blocks on disk I/O, and this '
            'connection may only be used by the thread that created it'
        ) from error
    raise ValueError(f'{owner}(connection=...) cannot use this connection: {error}') from error


class WriteTransaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`; inside a caller's open transaction, `savepoint` instead.

    Taking the write lock up front matters: a deferred transaction that reads and then writes
    fails at once with `database is locked` if another connection committed in between. In a
    caller's transaction the work is released into it, and commits (or not) with it. A class, not
    a generator: every store write enters one.
    """

    __slots__ = ('_connection', '_nested', '_savepoint')

    def __init__(self, connection: sqlite3.Connection, savepoint: str) -> None:
        self._connection = connection
        self._savepoint = savepoint
        self._nested = False

    def __enter__(self) -> None:
        connection = self._connection
        self._nested = connection.in_transaction
        connection.execute(f'SAVEPOINT {self._savepoint}' if self._nested else 'BEGIN IMMEDIATE')

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        connection = self._connection
        if not self._nested:
            connection.execute('COMMIT' if kind is None else 'ROLLBACK')
            return
        if kind is not None:
            connection.execute(f'ROLLBACK TO {self._savepoint}')
        connection.execute(f'RELEASE {self._savepoint}')


def enable_wal(connection: sqlite3.Connection, *, timeout: float = BUSY_TIMEOUT_MS / 1000) -> None:
    """Put the database in WAL mode, waiting out other processes that are opening it too.

    Switching the journal mode needs the database to itself, and SQLite answers `database is
    locked` at once, without its busy handler, when another connection holds it (two processes
    creating one store together do exactly that). A database already in WAL mode needs nothing.
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            if connection.execute('PRAGMA journal_mode').fetchone()[0] != 'wal':
                connection.execute('PRAGMA journal_mode=WAL')
            return
        except sqlite3.OperationalError as error:
            if ('locked' not in str(error) and 'busy' not in str(error)) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


READER_WAIT_MS = 20
"""How long a checkpoint that starts the WAL over (`RESTART`, `TRUNCATE`) waits for readers: it
holds its caller (and a `RESTART` new writers) up meanwhile, and a reader in another process that
reads again and again could keep it waiting for the whole busy timeout."""


def checkpoint_caught_up(connection: sqlite3.Connection) -> None:
    """A `PASSIVE` pass, then a `RESTART` that makes the next write start the WAL over.

    SQLite starts the WAL over (and `journal_size_limit` trims it) only at a write that begins
    with every frame copied. A `PASSIVE` pass copies the frames there were when it began without
    holding anyone up, so a writer committing while it ran leaves a few behind, no write starts the
    WAL over, and it keeps growing until something truncates it on the writer's own path. The
    `RESTART` copies those few while new writers wait (a store's writer waits on a worker thread),
    and waits at most `READER_WAIT_MS` for readers. Skipped when the pass could not copy every
    frame: a reader holds them, and would hold the writers up for all of that time.
    """
    busy, frames, copied = connection.execute('PRAGMA wal_checkpoint(PASSIVE)').fetchone()
    if busy or copied < frames:
        return
    connection.execute(f'PRAGMA busy_timeout = {READER_WAIT_MS}')
    connection.execute('PRAGMA wal_checkpoint(RESTART)').fetchone()


def truncate_wal(connection: sqlite3.Connection, *, busy_timeout_ms: int) -> None:
    """Truncate the WAL on a writer's own connection, waiting at most `READER_WAIT_MS` for readers,
    then give the connection its busy timeout back. One that cannot finish leaves the WAL long
    until a later try: the write it precedes goes on either way."""
    connection.execute(f'PRAGMA busy_timeout = {READER_WAIT_MS}')
    try:
        connection.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()
    except sqlite3.OperationalError as error:
        if error.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise
    finally:
        connection.execute(f'PRAGMA busy_timeout = {busy_timeout_ms}')


class BackgroundCheckpointer:
    """Runs `checkpoint_caught_up` on a thread of its own, through a connection of its own.

    A checkpoint copies the WAL into the database file and flushes both to disk: milliseconds
    on a busy disk. SQLite runs it inside whichever commit crosses `wal_autocheckpoint`, so a
    store that turns that off and asks for a checkpoint here keeps its commits short. Its bulk
    (the `PASSIVE` pass) never waits for, nor blocks, other connections; only the short `RESTART`
    after it holds new writers up. A checkpoint that fails or cannot finish costs nothing, the
    next one catches up. At most one thread runs, until nothing more is asked.
    """

    @classmethod
    def for_database(cls, database: str | None, name: str) -> BackgroundCheckpointer | None:
        """One for a database file; `None` for a caller's connection or an in-memory database."""
        if database is None or database == ':memory:':
            return None
        return cls(database, name)

    def __init__(self, database: str, name: str) -> None:
        self._database = database
        self._name = name
        self._lock = threading.Lock()
        self._wanted = False
        self._thread: threading.Thread | None = None
        self._wal_file: str | None = None

    def request(self) -> None:
        """Have a checkpoint run soon; returns at once."""
        with self._lock:
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    @property
    def running(self) -> bool:
        """Whether a checkpoint thread is running."""
        with self._lock:
            return self._thread is not None

    def wait(self) -> None:
        """Wait for a running checkpoint (and any asked for meanwhile) to finish."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def wal_bytes(self) -> int:
        """The size of the database's `-wal` file (0 if there is none, or none is `located` yet). A
        checkpoint does not shrink it; only a truncating one, or the last connection closing, does."""
        if self._wal_file is None:
            return 0
        try:
            return os.stat(self._wal_file).st_size
        except FileNotFoundError:
            return 0

    def located(self, connection: sqlite3.Connection) -> None:
        """Learn where the `-wal` file is from a connection to the database: beside the file SQLite
        opened, which a link or a `file:` URI only leads to."""
        path = database_file(connection)
        self._wal_file = None if path is None else f'{path}-wal'

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._wanted:
                    self._thread = None
                    return
                self._wanted = False
            with contextlib.suppress(sqlite3.Error):
                checkpointer = sqlite3.connect(
                    self._database, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, uri=is_uri(self._database)
                )
                try:
                    checkpoint_caught_up(checkpointer)
                finally:
                    checkpointer.close()
