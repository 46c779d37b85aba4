"""The connection plumbing of `SqliteMediaStore`: open lazily, one lock, schema, deferred checkpoints.

`sqlite.py` holds the statements and says why the store keeps one connection (its module docs).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TypeVar

import anyio.to_thread

from ..._closing import AsyncClosing
from ..._errors import check_bool
from ..._sqlite import (
    BUSY_TIMEOUT_MS,
    BackgroundCheckpointer,
    database_file,
    database_path,
    enable_wal,
    open_database,
    raise_if_lock_timed_out,
    require_cross_thread_use,
)
from .._errors import check_blob_table

_TABLE_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
COLUMNS = frozenset({'sha256', 'media_type', 'bytes', 'size_bytes', 'metadata', 'blob_id', 'stored_at'})
"""The blob table's columns in this layout."""
_R = TypeVar('_R')


class SqliteMediaConnection(AsyncClosing):
    """The connection of a `SqliteMediaStore`; `_run` (writes) and `_read` are how its statements reach it."""

    deferred_checkpoint_bytes: int = 4 << 20
    """Payloads at least this large, committed on the store's own file connection, leave the WAL
    checkpoint to a background thread (see `sqlite.py`)."""

    def __init__(
        self,
        *,
        database: str | os.PathLike[str] | None = None,
        connection: sqlite3.Connection | None = None,
        table: str = 'media',
        durable: bool = False,
        lock: threading.Lock | None = None,
    ) -> None:
        check_bool(durable, 'durable')
        if (database is None) == (connection is None):
            raise ValueError(
                'provide exactly one of database= (a path the store opens itself) or connection= '
                f'(an open sqlite3.Connection); got database={database!r}, connection={connection!r}'
            )
        if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'invalid table name: {table!r}; expected [A-Za-z_][A-Za-z0-9_]*')
        if connection is not None:
            require_cross_thread_use(connection, 'SqliteMediaStore')
        self._database = None if database is None else database_path(database, 'SqliteMediaStore')
        self._connection = connection
        self._owns_connection = connection is None
        self._table = table
        self.durable = durable
        self._chunks = f'{table}_chunks'
        self._lock = lock if lock is not None else threading.Lock()
        self._schema_ready = False
        self._checkpointer = BackgroundCheckpointer.for_database(self._database, 'pydantic-ai-steps-media-checkpoint')

    def close(self) -> None:
        """Close the connection this store opened (a caller's `connection=` is left alone).

        Waits for a background checkpoint that a large put started.
        """
        with self._lock:
            if self._owns_connection and self._connection is not None:
                self._connection.close()
                self._connection = None
                self._schema_ready = False
        if self._checkpointer is not None:
            self._checkpointer.wait()

    async def aclose(self) -> None:
        """`close()` on a worker thread, so the event loop never waits on the lock. Closing twice is a no-op."""
        await anyio.to_thread.run_sync(self.close)

    @contextmanager
    def _checkpoint_deferred(self, conn: sqlite3.Connection, size: int) -> Generator[None]:
        """No automatic checkpoint inside a large commit on the store's own file connection.

        The background checkpointer runs it afterwards instead (see `sqlite.py`).
        """
        checkpointer = self._checkpointer
        if (
            checkpointer is None
            or conn.in_transaction
            or not self._owns_connection
            or size < self.deferred_checkpoint_bytes
        ):
            yield
            return
        (pages,) = conn.execute('PRAGMA wal_autocheckpoint').fetchone()
        conn.execute('PRAGMA wal_autocheckpoint=0')
        try:
            yield
        finally:
            conn.execute(f'PRAGMA wal_autocheckpoint={int(pages)}')
        checkpointer.request()

    # -- plumbing ---------------------------------------------------------------------------------

    async def _run(self, body: Callable[[sqlite3.Connection], _R]) -> _R:
        return await anyio.to_thread.run_sync(self._locked, body)

    def _locked(self, body: Callable[[sqlite3.Connection], _R]) -> _R:
        with self._lock, self._lock_waits_named():
            return body(self._conn())

    async def _read(self, body: Callable[[sqlite3.Connection, frozenset[str]], _R]) -> _R:
        """Run `body` with the table's columns (none: no table yet); a read never creates or migrates it."""
        return await anyio.to_thread.run_sync(self._read_locked, body)

    def _read_locked(self, body: Callable[[sqlite3.Connection, frozenset[str]], _R]) -> _R:
        with self._lock, self._lock_waits_named():
            conn = self._open()
            return body(conn, self._columns(conn))

    @contextmanager
    def _lock_waits_named(self) -> Generator[None]:
        """A write lock another connection held past the busy timeout, raised as an error that says so."""
        try:
            yield
        except sqlite3.OperationalError as error:  # the own connection may not be open yet: its timeout is known
            timeout_ms = BUSY_TIMEOUT_MS if self._owns_connection else None  # a caller's: what it set
            raise_if_lock_timed_out(error, self._connection, database=self._database, timeout_ms=timeout_ms)
            raise

    def _check_database(self, conn: sqlite3.Connection) -> None:
        """Refuse, before anything in it changes, a database whose table of this store's name holds something else."""
        self._columns(conn)

    def _columns(self, conn: sqlite3.Connection) -> frozenset[str]:
        if self._schema_ready:
            return COLUMNS
        columns = frozenset(row[1] for row in conn.execute(f'PRAGMA table_info("{self._table}")'))
        self._check_table(conn, columns)
        return columns

    def _check_table(self, conn: sqlite3.Connection, columns: frozenset[str]) -> None:
        where = self._database or database_file(conn) or ':memory:'
        check_blob_table(self._table, columns, f' in SQLite database {where!r}')

    def _open(self) -> sqlite3.Connection:
        """The connection, opened on first use (on this worker thread); call under the lock."""
        conn = self._connection
        if conn is None:
            assert self._database is not None
            conn = open_database(
                self._database, durable=self.durable, timeout=BUSY_TIMEOUT_MS / 1000, check=self._check_database
            )
            self._connection = conn
        return conn

    def _conn(self) -> sqlite3.Connection:
        """The connection for a write, its schema created or migrated on first use; call under the lock."""
        conn = self._open()
        if not self._schema_ready:
            if self._owns_connection:
                enable_wal(conn)  # a read leaves the journal mode as it found it (see `open_database`)
            elif self.durable and not conn.in_transaction:
                conn.execute('PRAGMA synchronous=FULL')
            self._ensure_schema(conn)
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        # Never commits: inside a caller's transaction the table lands only if the caller commits,
        # so it is marked ready only when no transaction was open, and re-checked otherwise.
        in_transaction = conn.in_transaction
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{self._table}" ('
            'sha256 TEXT PRIMARY KEY, media_type TEXT, bytes BLOB NOT NULL, '
            'size_bytes INTEGER NOT NULL, metadata TEXT, blob_id INTEGER, stored_at REAL)'
        )
        columns = frozenset(row[1] for row in conn.execute(f'PRAGMA table_info("{self._table}")'))
        self._check_table(conn, columns)
        migrations = (('media_type', 'TEXT'), ('metadata', 'TEXT'), ('blob_id', 'INTEGER'), ('stored_at', 'REAL'))
        for column, declaration in migrations:
            if column not in columns:
                conn.execute(f'ALTER TABLE "{self._table}" ADD COLUMN {column} {declaration}')
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{self._chunks}" (blob_id INTEGER NOT NULL, idx INTEGER NOT NULL, '
            'data BLOB NOT NULL, PRIMARY KEY (blob_id, idx))'
        )
        if not in_transaction:
            self._schema_ready = True
