"""The SQLite backend's connection: one per store, opened lazily, used under a lock, checkpointed aside.

Why one long-lived connection: opening a connection and setting its pragmas costs more than
most of the statements a hook runs, and `sqlite3` executes one statement at a time per connection
anyway. The connection is opened lazily on a worker thread with `check_same_thread=False` and
every call holds the backend's lock while it uses it. Writers in other processes are serialized
by SQLite itself (`BEGIN IMMEDIATE`, 30 s busy timeout); WAL lets readers run alongside.

Calls are tried on the event loop first (`_offload.run_soon`): the connection's busy timeout is 0
there, so a write lock held elsewhere raises at once and the call moves to a worker thread. A
durable store's calls are tried there too while its commits stay fast (`_offload.FlushTimer`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from ...._sqlite import (
    BUSY_TIMEOUT_MS,
    BackgroundCheckpointer,
    WriteTransaction,
    database_file,
    enable_wal,
    is_uri,
    open_database,
    raise_if_lock_timed_out,
    truncate_wal,
)
from .._offload import FlushTimer, WouldBlock, acquire, may_wait, run_blocking, run_soon
from ._schema import SCHEMA_VERSION, Columns, check_readable, check_step_tables, migrate, schema_version

_R = TypeVar('_R')
_SAVEPOINT = 'pydantic_ai_steps_store'
_AUTOCOMMIT: AbstractContextManager[None] = nullcontext()
"""A single statement on the store's own connection: it commits by itself."""
_BUSY_TIMEOUT_MS = BUSY_TIMEOUT_MS
"""How long a call on a worker thread waits for another connection's write lock."""
_CHECKPOINT_EVERY = 64
"""Commits between background WAL checkpoints on the store's own connection. A tool cycle's commit
writes about a dozen pages, so 64 of them stay well under `WAL_LIMIT_BYTES` and the checkpoint
never has to run inside a call (SQLite's own default, 1000 pages, is about as often)."""
WAL_LIMIT_BYTES = 4 << 20
"""A WAL file larger than this when a checkpoint is due is checkpointed and truncated on the store's
own connection, between two of its writes; `journal_size_limit` truncates it to this size whenever
SQLite starts it over. (See `docs/design.md` for what the bound costs per step.)"""
WAL_WARNING_BYTES = 16 * WAL_LIMIT_BYTES
"""A WAL this long means a reader keeps checkpoints from starting it over: the store logs a warning,
then again each time the WAL has doubled since, until it is back under the bound."""

logger = logging.getLogger('pydantic_ai_steps.sqlite_store')


class SqliteConnection:
    """The connection plumbing of `SqliteBackend`: open, migrate, offload, busy timeout, checkpoints.

    `_run(body)` is the one way the backend reaches the connection; `_write` is its write transaction.
    """

    def __init__(self, *, database: str | None, connection: sqlite3.Connection | None, durable: bool) -> None:
        self._database = database
        self._connection = connection
        self._owns_connection = connection is None
        self.durable = durable
        self.lock = threading.Lock()
        """Serializes every use of the connection (a `SqliteMediaStore` sharing it takes it too)."""
        self._migrated = False
        self._wal = False
        """Whether the database is in WAL mode: switched by the first write, never by a read."""
        self._columns: Columns | None = None
        self._schema_cookie = -1
        """`PRAGMA schema_version` when `_columns` was read."""
        self._commits_since_checkpoint = 0
        self._busy_timeout_set = False
        """Whether the own connection waits for a held write lock (it must not on the event loop)."""
        self._wal_too_long = False
        self._wal_warned_at = 0
        """The WAL's size at the last warning that it keeps growing (0: none since it was under the bound)."""
        self._checkpointer = BackgroundCheckpointer.for_database(database, 'pydantic-ai-steps-checkpoint')
        self._commits = FlushTimer() if durable else None
        """A durable store's write calls, each waiting for the disk: timed, to know where they run."""
        self._nothing: sqlite3.Connection | None = None
        """What reads of a database file that does not exist read: an empty in-memory database."""

    @property
    def database(self) -> str | None:
        return self._database

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection this backend opened (a caller's connection is left open); wait for a
        background checkpoint. A later call reopens it."""
        with self.lock:
            if self._owns_connection and self._connection is not None:
                self._connection.close()
                self._connection = None
                self._migrated = self._wal = False
                self._columns = None
            if self._nothing is not None:
                self._nothing.close()
                self._nothing = None
        if self._checkpointer is not None:
            self._checkpointer.wait()

    async def aclose(self) -> None:
        await run_blocking(self.close)

    # --- connection plumbing ----------------------------------------------------------------

    async def _run(self, body: Callable[[sqlite3.Connection], _R], *, write: bool = False, inline: bool = True) -> _R:
        """Run `body` on the connection: tried on the event loop first when `inline` (see `_offload`).

        Only the store's own connection is tried there, and a durable one's only while its commits
        fit the loop. A caller's `connection=` keeps whatever busy timeout the caller set, so its
        calls always go to a worker.
        """
        inline = inline and self._owns_connection and self._loop_may_flush
        return await run_soon(self._locked, body, write, inline=inline)

    @property
    def _loop_may_flush(self) -> bool:
        return self._commits is None or self._commits.fits_the_loop

    def _timed(self, body: Callable[[sqlite3.Connection], _R], conn: sqlite3.Connection, write: bool) -> _R:
        if self._commits is None or not write:
            return body(conn)
        start = time.perf_counter()
        try:
            return body(conn)
        finally:
            self._commits.measured(time.perf_counter() - start)

    def _locked(self, body: Callable[[sqlite3.Connection], _R], write: bool) -> _R:
        acquire(self.lock)
        try:
            if may_wait():
                return self._waiting(body, write)
            return self._without_waiting(body, write)
        except sqlite3.OperationalError as error:  # never a held lock on the loop: that is `WouldBlock`
            timeout_ms = _BUSY_TIMEOUT_MS if self._owns_connection else None  # a caller's: what it set
            raise_if_lock_timed_out(error, self._connection, database=self._database, timeout_ms=timeout_ms)
            raise
        finally:
            self.lock.release()

    def _waiting(self, body: Callable[[sqlite3.Connection], _R], write: bool) -> _R:
        """On a worker thread: wait for the write lock up to the busy timeout; checkpoint when due."""
        conn = self._conn(write)
        if not self._owns_connection:
            return body(conn)
        if not self._busy_timeout_set:
            conn.execute(f'PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}')
            self._busy_timeout_set = True
        try:
            if self._wal_too_long and self._checkpointer is not None:
                self._checkpointer.wait()  # a running checkpoint would make this one give up at once
                self._wal_too_long = False
                truncate_wal(conn, busy_timeout_ms=_BUSY_TIMEOUT_MS)
            return self._timed(body, conn, write)
        finally:
            # The event loop's calls need a busy timeout of 0 (see `_without_waiting`); a durable
            # store whose commits do not fit the loop makes none, so its connection keeps the timeout.
            if self._loop_may_flush:
                conn.execute('PRAGMA busy_timeout = 0')
                self._busy_timeout_set = False
            self._checkpoint_when_due()

    def _without_waiting(self, body: Callable[[sqlite3.Connection], _R], write: bool) -> _R:
        """On the event loop: the connection's busy timeout is 0, so a held write lock raises at once."""
        conn = self._connection
        if (
            conn is None
            or self._busy_timeout_set
            or self._wal_too_long
            or (write and not (self._migrated and self._wal))
            or (not write and self._columns is None)
        ):
            raise WouldBlock  # opening, migrating, WAL and a checkpoint on this connection are a worker's job
        try:
            return self._timed(body, conn, write)
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            if conn.in_transaction:  # the store's own connection: any open transaction is ours
                conn.execute('ROLLBACK')
            raise WouldBlock from None
        finally:
            self._checkpoint_when_due()

    def _checkpoint_when_due(self) -> None:
        """Every `_CHECKPOINT_EVERY` commits, have the WAL checkpointed on a thread of its own."""
        if self._commits_since_checkpoint >= _CHECKPOINT_EVERY:
            self._commits_since_checkpoint = 0
            if self._checkpointer is not None:
                wal_bytes = self._checkpointer.wal_bytes()
                self._wal_too_long = wal_bytes > WAL_LIMIT_BYTES
                self._warn_if_the_wal_keeps_growing(wal_bytes)
                if not self._wal_too_long:
                    self._checkpointer.request()

    def _warn_if_the_wal_keeps_growing(self, wal_bytes: int) -> None:
        """Say why a WAL outgrew its bound many times over: nothing here can shorten it while a reader holds it."""
        if wal_bytes <= WAL_LIMIT_BYTES:
            self._wal_warned_at = 0
        elif wal_bytes >= max(WAL_WARNING_BYTES, 2 * self._wal_warned_at):
            self._wal_warned_at = wal_bytes
            logger.warning(
                'the write-ahead log of SQLite store %r has grown to %.0f MiB (its bound is %.0f MiB): a '
                'connection, maybe in another process, keeps a read transaction open, so no checkpoint can '
                'start the log over. End read transactions between reads (commit, or close cursors that were '
                'not read to the end); the log shrinks at the next checkpoint after that.',
                self._database,
                wal_bytes / (1 << 20),
                WAL_LIMIT_BYTES / (1 << 20),
            )

    def _conn(self, write: bool) -> sqlite3.Connection:
        """The connection, opened on first use and migrated by the first write. Call under the lock."""
        conn = self._connection
        if conn is None:
            assert self._database is not None
            if not write and _missing(self._database):  # reading never creates the file, nor its folder
                if self._nothing is None:
                    self._nothing = sqlite3.connect(':memory:', check_same_thread=False)
                return self._nothing
            conn = open_database(
                self._database, durable=self.durable, timeout=_BUSY_TIMEOUT_MS / 1000, check=self._read_view
            )
            self._busy_timeout_set = True
            conn.execute(f'PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}')
            # Checkpoints flush to disk: they run on a thread of their own every
            # `_CHECKPOINT_EVERY` commits, never inside a commit (see `BackgroundCheckpointer`).
            conn.execute('PRAGMA wal_autocheckpoint = 0')
            if self._checkpointer is not None:
                self._checkpointer.located(conn)
            self._connection = conn
        if self._columns is None:  # before anything below changes the database
            self._read_view(conn)
        if write and not self._wal:
            if not conn.in_transaction:  # a caller's open transaction: the journal mode stays the caller's
                # WAL is a property of the database file, so it sticks; a shared connection's
                # synchronous level is the caller's, unless this store was asked to be durable.
                enable_wal(conn)
                if self.durable and not self._owns_connection:
                    conn.execute('PRAGMA synchronous=FULL')
            self._wal = True
        if write and not self._migrated:
            if schema_version(conn) != SCHEMA_VERSION:
                with self._write(conn, immediate=True):
                    migrate(conn)
            migrated = not conn.in_transaction or self._owns_connection
            self._migrated = migrated
            self._columns = None
            if migrated:
                self._read_view(conn)
        return conn

    def _view(self, conn: sqlite3.Connection) -> Columns:
        """What the database has, read again while it is not at this release's version and its
        schema changed since: another process may create or migrate the tables at any time, and a
        view kept from before would read an empty store (and its media as unreferenced) for good."""
        columns = self._columns
        if columns is None or (not self._migrated and _schema_cookie(conn) != self._schema_cookie):
            columns = self._read_view(conn)
        return columns

    def _read_view(self, conn: sqlite3.Connection) -> Columns:
        self._schema_cookie = _schema_cookie(conn)  # first: a change after it is seen at the next read
        version = schema_version(conn)
        check_readable(version)
        columns = Columns.read(conn)
        check_step_tables(columns, self._database or database_file(conn) or ':memory:')
        self._columns = columns
        self._migrated = version == SCHEMA_VERSION
        return columns

    def _write(self, conn: sqlite3.Connection, *, immediate: bool = False) -> AbstractContextManager[None]:
        """A write transaction that takes the write lock up front (see `WriteTransaction`).

        A single statement on the store's own (autocommit) connection needs no transaction at
        all. On a shared connection already inside a transaction of the caller's, the work goes in
        a savepoint and commits (or not) with the caller's transaction.
        """
        if self._owns_connection:
            self._commits_since_checkpoint += 1
            if not immediate:
                return _AUTOCOMMIT
        return WriteTransaction(conn, _SAVEPOINT)


def _missing(database: str) -> bool:
    return database != ':memory:' and not is_uri(database) and not os.path.exists(database)


def _schema_cookie(conn: sqlite3.Connection) -> int:
    """SQLite's count of schema changes to the database file (any connection's): read from its header."""
    return int(conn.execute('PRAGMA schema_version').fetchone()[0])
