"""The SQLite backend: one connection per store, WAL mode, each commit one transaction.

Why one long-lived connection: opening a connection and setting its pragmas costs more than
most of the statements a hook runs, and `sqlite3` executes one statement at a time per connection
anyway. The connection is opened lazily on a worker thread with `check_same_thread=False` and
every call holds the backend's lock while it uses it. Writers in other processes are serialized
by SQLite itself (`BEGIN IMMEDIATE`, 30 s busy timeout); WAL lets readers run alongside.

Calls are tried on the event loop first (`_offload.run_soon`): the connection's busy timeout is 0
there, so a write lock held elsewhere raises at once and the call moves to a worker thread.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from ...._errors import RunAlreadyExistsError, RunNotFoundError
from ...._records import RunQuery
from ...._sqlite import BackgroundCheckpointer, enable_wal, open_database, write_transaction
from ...backend import STALE, SUPPRESSED, CommitOutcome, LogEntry, LogSlice, Probe, Row, SnapshotRow, WriteBatch
from ...codec import EFFECT_FIELDS, EVENT_FIELDS, RUN_FIELDS, SNAPSHOT_FIELDS, TEXT
from .._offload import WouldBlock, acquire, may_wait, run_blocking, run_soon
from .._sql import SQLITE, order_and_limit, run_filters
from ._legacy import legacy_texts
from ._schema import RUN_COLUMNS, SCHEMA_VERSION, Columns, check_readable, migrate, schema_version

_R = TypeVar('_R')
_MEMORY = ':memory:'
_SAVEPOINT = 'pydantic_ai_steps_store'
_CHUNK = 500
_BUSY_TIMEOUT_MS = 30_000
"""How long a call on a worker thread waits for another connection's write lock."""
_CHECKPOINT_EVERY = 64
"""Commits between background WAL checkpoints on the store's own connection. A tool cycle's commit
writes about a dozen pages, so 64 of them stay well under `WAL_LIMIT_BYTES` and the checkpoint
never has to run inside a call (SQLite's own default, 1000 pages, is about as often)."""
WAL_LIMIT_BYTES = 4 << 20
"""A WAL file larger than this when a checkpoint is due is checkpointed and truncated on the store's
own connection, between two of its writes; `journal_size_limit` truncates it to this size whenever
SQLite starts it over. (See `docs/design.md` for what the bound costs per step.)"""

_INSERT_EVENT = (
    f'INSERT INTO events ({", ".join(EVENT_FIELDS)}) VALUES ({", ".join("?" * len(EVENT_FIELDS))}) '
    'ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING'
)
_UPSERT_EFFECT = (
    f'INSERT INTO tool_effects ({", ".join(EFFECT_FIELDS)}) VALUES ({", ".join("?" * len(EFFECT_FIELDS))}) '
    f'ON CONFLICT (run_id, tool_call_id) DO UPDATE SET '
    f'{", ".join(f"{column} = excluded.{column}" for column in EFFECT_FIELDS[2:])}'
)
_INSERT_RUN = f'INSERT INTO runs ({", ".join(RUN_FIELDS)}) VALUES ({", ".join("?" * len(RUN_FIELDS))})'
_SNAPSHOT_COLUMNS = (*SNAPSHOT_FIELDS, 'messages')
_INSERT_SNAPSHOT = (
    f'INSERT INTO snapshots ({", ".join(_SNAPSHOT_COLUMNS)}) VALUES ({", ".join("?" * len(_SNAPSHOT_COLUMNS))})'
)


class _Stale(Exception):
    """Raised inside the commit's transaction to roll it back: the run's log grew elsewhere."""


class SqliteBackend:
    encoding = TEXT

    def __init__(self, *, database: str | None, connection: sqlite3.Connection | None, durable: bool) -> None:
        self._database = database
        self._connection = connection
        self._owns_connection = connection is None
        self.durable = durable
        self.lock = threading.Lock()
        """Serializes every use of the connection (a `SqliteMediaStore` sharing it takes it too)."""
        self._migrated = False
        self._columns: Columns | None = None
        self._commits_since_checkpoint = 0
        self._busy_timeout_set = False
        """Whether the own connection waits for a held write lock (it must not on the event loop)."""
        self._wal_too_long = False
        self._checkpointer = BackgroundCheckpointer.for_database(database, 'pydantic-ai-steps-checkpoint')

    @property
    def database(self) -> str | None:
        return self._database

    # --- writes -----------------------------------------------------------------------------

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        return await self._run(lambda conn: self._commit(conn, batch), write=True)

    def _commit(self, conn: sqlite3.Connection, batch: WriteBatch) -> CommitOutcome:
        statements = (batch.run is not None) + len(batch.tool_effects) + len(batch.events) + len(batch.closings)
        try:
            with self._write(conn, immediate=batch.snapshot is not None or statements > 1 or bool(batch.run_ids)):
                registered = batch.run['run_id'] if batch.run is not None else None
                if batch.run is not None:
                    try:
                        conn.execute(_INSERT_RUN, tuple(batch.run.values()))
                    except sqlite3.IntegrityError as error:
                        if 'runs.run_id' not in str(error):
                            raise
                        raise RunAlreadyExistsError(batch.run['run_id']) from None
                for run_id in batch.run_ids:
                    if (
                        run_id != registered
                        and conn.execute('SELECT 1 FROM runs WHERE run_id = ?', (run_id,)).fetchone() is None
                    ):
                        raise RunNotFoundError(run_id)
                outcome = self._write_snapshot(conn, batch) if batch.snapshot is not None else None
                if batch.tool_effects:
                    conn.executemany(_UPSERT_EFFECT, [tuple(row.values()) for row in batch.tool_effects])
                if batch.events:
                    conn.executemany(_INSERT_EVENT, [tuple(row.values()) for row in batch.events])
                for closing in batch.closings:
                    conn.execute(
                        'UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?',
                        (closing.status, closing.ended_at, closing.run_id),
                    )
            return outcome
        except _Stale:
            return STALE

    def _write_snapshot(self, conn: sqlite3.Connection, batch: WriteBatch) -> CommitOutcome:
        write = batch.snapshot
        assert write is not None
        run_id, key = write.run_id, write.key
        if (
            key is not None
            and conn.execute(
                'SELECT 1 FROM snapshot_idempotency_keys WHERE run_id = ? AND idempotency_key = ?', (run_id, key)
            ).fetchone()
        ):
            return SUPPRESSED
        (end,) = conn.execute(
            'SELECT COALESCE(MAX(log_index) + 1, 0) FROM messages WHERE run_id = ?', (run_id,)
        ).fetchone()
        if write.expected_log_size is not None and write.expected_log_size != end:
            raise _Stale
        if write.appends:
            conn.executemany(
                'INSERT INTO messages (run_id, log_index, position, message) VALUES (?, ?, ?, ?)',
                [(run_id, end + offset, position, text) for offset, (position, text) in enumerate(write.appends)],
            )
        log_size = end + len(write.appends)
        row = write.row
        row['log_size'] = log_size
        reference = f'{{"message_count":{row["message_count"]},"log_size":{log_size}}}'
        conn.execute(_INSERT_SNAPSHOT, (*row.values(), reference))
        if key is not None:
            conn.execute(
                'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) VALUES (?, ?)', (run_id, key)
            )
        return log_size

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        await self._run(lambda conn: self._delete_rows(conn, 'snapshots', 'seq', run_id, seqs), write=True)

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        def delete(conn: sqlite3.Connection) -> list[str]:
            marks = ', '.join('?' * len(run_ids))
            with self._write(conn, immediate=True):
                existing = [
                    row[0] for row in conn.execute(f'SELECT run_id FROM runs WHERE run_id IN ({marks})', tuple(run_ids))
                ]
                for table in ('events', 'snapshots', 'messages', 'tool_effects', 'snapshot_idempotency_keys', 'runs'):
                    conn.execute(f'DELETE FROM {table} WHERE run_id IN ({marks})', tuple(run_ids))
            return existing

        return await self._run(delete, write=True, inline=False)

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        await self._run(
            lambda conn: self._delete_rows(conn, 'messages', 'log_index', run_id, indices), write=True, inline=False
        )

    def _delete_rows(self, conn: sqlite3.Connection, table: str, column: str, run_id: str, keys: Sequence[int]) -> None:
        """Delete a run's rows whose `column` is among `keys`, in chunks, as one transaction."""
        with self._write(conn, immediate=True):
            for start in range(0, len(keys), _CHUNK):
                chunk = list(keys[start : start + _CHUNK])
                conn.execute(
                    f'DELETE FROM {table} WHERE run_id = ? AND {column} IN ({", ".join("?" * len(chunk))})',
                    (run_id, *chunk),
                )

    async def reclaim_space(self) -> None:
        def vacuum(conn: sqlite3.Connection) -> None:
            if conn.in_transaction:
                return  # a caller's transaction: its space comes back when it vacuums
            if conn.execute('PRAGMA auto_vacuum').fetchone()[0] == 2:  # INCREMENTAL
                # `execute` steps the pragma once, which frees one page; a script runs it to the end.
                conn.executescript('PRAGMA incremental_vacuum;')
            if self._checkpointer is not None:
                self._checkpointer.wait()
                conn.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()

        await self._run(vacuum, inline=False)

    # --- reads ------------------------------------------------------------------------------

    async def fetch_run(self, run_id: str) -> Row | None:
        def read(conn: sqlite3.Connection) -> Row | None:
            columns = self._view(conn)
            if not columns.has('runs'):
                return None
            found = conn.execute(
                f'SELECT {columns.select("runs", RUN_COLUMNS)} FROM runs WHERE run_id = ?', (run_id,)
            ).fetchone()
            return dict(zip(RUN_COLUMNS, found, strict=True)) if found is not None else None

        return await self._run(read)

    async def fetch_runs(self, query: RunQuery) -> list[Row]:
        def read(conn: sqlite3.Connection) -> list[Row]:
            columns = self._view(conn)
            if not columns.has('runs'):
                return []
            sql = run_filters(query, SQLITE, TEXT, set(columns.columns['runs']))
            tail = order_and_limit(query, sql, SQLITE, 'rowid')
            statement = f'SELECT {columns.select("runs", RUN_COLUMNS)} FROM runs{sql.clause()}{tail}'
            return [dict(zip(RUN_COLUMNS, found, strict=True)) for found in conn.execute(statement, sql.params)]

        return await self._run(read, inline=False)

    async def fetch_events(self, run_id: str) -> list[Row]:
        def read(conn: sqlite3.Connection) -> list[Row]:
            columns = self._view(conn)
            if not columns.has('events'):
                return []
            statement = f'SELECT {columns.select("events", EVENT_FIELDS)} FROM events WHERE run_id = ? ORDER BY seq'
            return [dict(zip(EVENT_FIELDS, found, strict=True)) for found in conn.execute(statement, (run_id,))]

        return await self._run(read, inline=False)

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        def read(conn: sqlite3.Connection) -> list[Row]:
            columns = self._view(conn)
            if not columns.has('tool_effects'):
                return []
            statement = f'SELECT {columns.select("tool_effects", EFFECT_FIELDS)} FROM tool_effects WHERE run_id = ?'
            params: list[object] = [run_id]
            if tool_call_id is not None:
                statement += ' AND tool_call_id = ?'
                params.append(tool_call_id)
            if unresolved_only:
                statement += " AND status = 'started'"
                if 'resolution' in columns.columns['tool_effects']:
                    statement += ' AND resolution IS NULL'
            rows = conn.execute(statement + ' ORDER BY rowid', params)
            return [dict(zip(EFFECT_FIELDS, found, strict=True)) for found in rows]

        return await self._run(read)

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        def read(conn: sqlite3.Connection) -> list[SnapshotRow]:
            columns = self._view(conn)
            if not columns.has('snapshots'):
                return []
            statement = (
                f'SELECT seq, messages, {columns.select("snapshots", SNAPSHOT_FIELDS)} FROM snapshots WHERE run_id = ?'
            )
            params: list[object] = [run_id]
            if not include_interrupted and 'state' in columns.columns['snapshots']:
                statement += " AND state = 'complete'"  # without the column, every row is complete
            if below_seq is not None:
                statement += ' AND seq < ?'
                params.append(below_seq)
            statement += ' ORDER BY seq' + ('' if oldest_first else ' DESC')
            if limit is not None:
                statement += ' LIMIT ?'
                params.append(limit)
            found: list[SnapshotRow] = []
            for seq, messages, *values in conn.execute(statement, params).fetchall():
                row: Row = dict(zip(SNAPSHOT_FIELDS, values, strict=True))
                legacy = None
                if row['message_count'] is None and row['log_size'] is None:
                    legacy = legacy_texts(conn, columns, seq, messages)
                found.append(SnapshotRow(seq, row, legacy))
            return found

        return await self._run(read, inline=False)

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        def read(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            columns = self._view(conn)
            if not columns.has('snapshots'):
                return []
            state = 'state' if 'state' in columns.columns['snapshots'] else "'complete'"
            return conn.execute(f'SELECT seq, {state} FROM snapshots WHERE run_id = ?', (run_id,)).fetchall()

        return await self._run(read)

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        def read(conn: sqlite3.Connection) -> LogSlice:
            if not self._view(conn).has('messages'):
                return LogSlice(())
            rows = conn.execute(
                'SELECT log_index, position, message FROM messages WHERE run_id = ? AND log_index < ? AND position < ?',
                (run_id, min(below_index, 1 << 62), min(positions_below, 1 << 62)),
            )
            return LogSlice([LogEntry(index, position, text) for index, position, text in rows])

        return await self._run(read, inline=False)

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        def read(conn: sqlite3.Connection, after: tuple[str, int]) -> list[tuple[str, int, str]]:
            columns = self._view(conn)
            if not columns.has('messages'):
                return []
            return conn.execute(
                'SELECT run_id, log_index, message FROM messages WHERE (run_id, log_index) > (?, ?) '
                'AND instr(message, ?) > 0 ORDER BY run_id, log_index LIMIT 500',
                (*after, needle),
            ).fetchall()

        after = ('', -1)
        while batch := await self._run(lambda conn, after=after: read(conn, after), inline=False):
            for run_id, index, text in batch:
                after = (run_id, index)
                yield text
        for text in await self._run(self._legacy_texts_mentioning(needle), inline=False):
            yield text

    def _legacy_texts_mentioning(self, needle: str) -> Callable[[sqlite3.Connection], list[str]]:
        def read(conn: sqlite3.Connection) -> list[str]:
            columns = self._view(conn)
            texts: list[str] = []
            if columns.has('snapshots'):
                statement = 'SELECT messages FROM snapshots WHERE instr(messages, ?) > 0'
                texts += [text for (text,) in conn.execute(statement, (needle,)) if isinstance(text, str)]
            if columns.has('snapshot_messages'):
                statement = 'SELECT message FROM snapshot_messages WHERE instr(message, ?) > 0'
                texts += [text for (text,) in conn.execute(statement, (needle,)) if isinstance(text, str)]
            return texts

        return read

    async def probe(self) -> Probe:
        return await run_blocking(self._probe)

    def _probe(self) -> Probe:
        """Read-only: a missing file stays missing, a foreign database untouched."""
        if self._database is None or self._database == _MEMORY or self._database.startswith('file:'):
            return Probe(exists=True, step_store=True)
        path = Path(self._database)
        files = [path, *(path.with_name(path.name + suffix) for suffix in ('-wal', '-journal'))]
        size = sum(info.st_size for info in map(_lstat, files) if info is not None)
        if not path.exists():
            return Probe(exists=False, step_store=False, detail=f'{path} does not exist')
        try:
            with path.open('rb') as handle:
                header = handle.read(16)
        except OSError as error:
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'cannot read {path}: {error}')
        if header != b'SQLite format 3\x00':
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path} is not a SQLite database')
        try:
            reader = sqlite3.connect(path.resolve().as_uri() + '?mode=ro', uri=True, timeout=5.0)
            try:
                found = reader.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()
            finally:
                reader.close()
        except sqlite3.Error as error:
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'cannot read {path}: {error}')
        if found is None:
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path} has no runs table')
        return Probe(exists=True, step_store=True, size_bytes=size)

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection this backend opened (a caller's connection is left open); wait for a
        background checkpoint. A later call reopens it."""
        with self.lock:
            if self._owns_connection and self._connection is not None:
                self._connection.close()
                self._connection = None
                self._migrated = False
                self._columns = None
        if self._checkpointer is not None:
            self._checkpointer.wait()

    async def aclose(self) -> None:
        await run_blocking(self.close)

    # --- connection plumbing ----------------------------------------------------------------

    async def _run(self, body: Callable[[sqlite3.Connection], _R], *, write: bool = False, inline: bool = True) -> _R:
        """Run `body` on the connection: tried on the event loop first when `inline` (see `_offload`).

        Only the store's own connection is tried there, and not when `durable` (each commit then
        waits for the disk). A caller's `connection=` keeps whatever busy timeout the caller set,
        so its calls always go to a worker.
        """
        inline = inline and self._owns_connection and not self.durable
        return await run_soon(self._locked, body, write, inline=inline)

    def _locked(self, body: Callable[[sqlite3.Connection], _R], write: bool) -> _R:
        acquire(self.lock)
        try:
            if may_wait():
                return self._waiting(body, write)
            return self._without_waiting(body, write)
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
                conn.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()
                self._wal_too_long = False
            return body(conn)
        finally:
            # The event loop's calls need a busy timeout of 0 (see `_without_waiting`); a durable
            # store never makes any, so its connection keeps the timeout between calls.
            if not self.durable:
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
            or (write and not self._migrated)
            or (not write and self._columns is None)
        ):
            raise WouldBlock  # opening, migrating and a checkpoint on this connection are a worker's job
        try:
            return body(conn)
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
                self._wal_too_long = self._checkpointer.wal_bytes() > WAL_LIMIT_BYTES
                if not self._wal_too_long:
                    self._checkpointer.request()

    def _conn(self, write: bool) -> sqlite3.Connection:
        """The connection, opened on first use and migrated by the first write. Call under the lock."""
        conn = self._connection
        if conn is None:
            assert self._database is not None
            conn = open_database(self._database, durable=self.durable, timeout=_BUSY_TIMEOUT_MS / 1000)
            self._busy_timeout_set = True
            conn.execute(f'PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}')
            # Checkpoints flush to disk: they run on a thread of their own every
            # `_CHECKPOINT_EVERY` commits, never inside a commit (see `BackgroundCheckpointer`).
            conn.execute('PRAGMA wal_autocheckpoint = 0')
            self._connection = conn
        if write and not self._migrated:
            if not self._owns_connection and not conn.in_transaction:
                # A shared connection gets WAL too (a property of the database file, so it sticks);
                # its synchronous level is the caller's, unless this store was asked to be durable.
                enable_wal(conn)
                if self.durable:
                    conn.execute('PRAGMA synchronous=FULL')
            if schema_version(conn) != SCHEMA_VERSION:
                with self._write(conn, immediate=True):
                    migrate(conn)
            migrated = not conn.in_transaction or self._owns_connection
            self._migrated = migrated
            self._columns = Columns.read(conn) if migrated else None
        elif self._columns is None:
            version = schema_version(conn)
            check_readable(version)
            self._columns = Columns.read(conn)
            self._migrated = version == SCHEMA_VERSION
        return conn

    def _view(self, conn: sqlite3.Connection) -> Columns:
        if self._columns is None:
            self._conn(False)
        assert self._columns is not None
        return self._columns

    @contextmanager
    def _write(self, conn: sqlite3.Connection, *, immediate: bool = False) -> Generator[None]:
        """A write transaction that takes the write lock up front (see `write_transaction`).

        A single statement on the store's own (autocommit) connection needs no transaction at
        all. On a shared connection already inside a transaction of the caller's, the work goes in
        a savepoint and commits (or not) with the caller's transaction.
        """
        if self._owns_connection:
            self._commits_since_checkpoint += 1
            if not immediate:
                yield
                return
        with write_transaction(conn, _SAVEPOINT):
            yield


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def database_file(connection: sqlite3.Connection | None) -> str | None:
    """The file behind a connection's main database; `None` for an in-memory or temporary one."""
    if connection is None:
        return None
    for _, name, path in connection.execute('PRAGMA database_list').fetchall():
        if name == 'main':
            return path or None
    return None  # pragma: no cover - every connection has a main database
