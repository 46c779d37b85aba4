"""`SqliteStepStore`: every record in one SQLite database, WAL mode, one connection per store.

Tables (SPEC section 4, plus what message-once storage and migrations need):

- `runs` (`run_id` primary key), indexed on `(conversation_id, started_at)`,
  `(parent_run_id, started_at)` and `started_at`, so lineage queries never scan.
- `events` (`seq` AUTOINCREMENT), unique on `(run_id, idempotency_key)` for keyed events.
- `snapshots` (`seq` AUTOINCREMENT, `state`, `message_count`, `log_size`): a row names its history
  by two numbers; `messages` (`run_id`, `log_index`, `position`, `message`) is the run's message
  log, written once per message version (see `_history`). Rows written by older releases (the
  history inline in `snapshots.messages`, or the upstream package's `snapshot_messages` /
  `snapshot_message_refs` tables) still read.
- `snapshot_keys` (applied snapshot idempotency keys; they outlive pruning), `tool_effects`
  (primary key `(run_id, tool_call_id)`, upserted), `schema_version`.

Why one long-lived connection: opening a connection and setting its pragmas costs more than
most of the statements a hook runs, and `sqlite3` executes one statement at a time per connection
anyway. The connection is opened lazily on a worker thread with `check_same_thread=False` and
every call holds the store's lock while it uses it. Writers in other processes are serialized by
SQLite itself (`BEGIN IMMEDIATE`, 30 s busy timeout); WAL lets readers run alongside.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from ..._sqlite import BackgroundCheckpointer, enable_wal, require_cross_thread_use, write_transaction
from ...media._protocol import MediaStore
from .._codec import (
    event_from_dict,
    metadata_dict,
    optional_str,
    required_int,
    run_from_dict,
    snapshot_state,
    timestamp,
    tool_effect_from_dict,
)
from .._errors import RunAlreadyExistsError, check_max_snapshots, check_threshold
from .._history import LogEntry, resolve_history
from .._message_log import STALE, SUPPRESSED, MessageLog, PreparedSnapshot, SnapshotMeta, WriteOutcome
from .._records import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, ToolEffectRecord
from .._retention import snapshots_to_keep
from ._offload import WouldBlock, acquire, may_wait, run_blocking, run_soon

__all__ = ['SqliteStepStore']

logger = logging.getLogger('pydantic_ai_steps.sqlite_store')

SCHEMA_VERSION = 1
"""The layout this release writes. Older databases are migrated forward on open."""

_MEMORY = ':memory:'
_SAVEPOINT = 'pydantic_ai_steps_store'
_DELETE_CHUNK = 500
_R = TypeVar('_R')

_RUN_COLUMNS: tuple[str, ...] = (
    'run_id',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'metadata',
    'started_at',
    'registration_id',
)
_EVENT_COLUMNS: tuple[str, ...] = (
    'run_id',
    'kind',
    'step_index',
    'timestamp',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'tool_call_id',
    'tool_name',
    'error',
    'metadata',
    'idempotency_key',
)
_EFFECT_COLUMNS: tuple[str, ...] = (
    'run_id',
    'tool_call_id',
    'tool_name',
    'status',
    'started_at',
    'ended_at',
    'idempotency_key',
    'effect_summary',
)
_INSERT_EVENT = (
    f'INSERT INTO events ({", ".join(_EVENT_COLUMNS)}) VALUES ({", ".join("?" * len(_EVENT_COLUMNS))}) '
    'ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING'
)
_UPSERT_EFFECT = (
    f'INSERT INTO tool_effects ({", ".join(_EFFECT_COLUMNS)}) VALUES ({", ".join("?" * len(_EFFECT_COLUMNS))}) '
    f'ON CONFLICT (run_id, tool_call_id) DO UPDATE SET '
    f'{", ".join(f"{column} = excluded.{column}" for column in _EFFECT_COLUMNS[2:])}'
)
_Row = tuple[object, ...]


@dataclass
class _Rows:
    """What a write adds besides a snapshot: a run to register, tool effects, events."""

    run: RunRecord | None = None
    effects: list[_Row] = field(default_factory=list[_Row])
    events: list[_Row] = field(default_factory=list[_Row])

    def statements(self) -> int:
        return (self.run is not None) + len(self.effects) + len(self.events)


_SNAPSHOT_COLUMNS: tuple[str, ...] = (
    'seq',
    'step_index',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'timestamp',
    'state',
    'messages',
    'idempotency_key',
    'message_count',
    'log_size',
)

_CREATE_TABLES = (
    'CREATE TABLE IF NOT EXISTS runs ('
    'run_id TEXT PRIMARY KEY, conversation_id TEXT, parent_run_id TEXT, agent_name TEXT, '
    'metadata TEXT NOT NULL, started_at TEXT NOT NULL, registration_id TEXT)',
    'CREATE TABLE IF NOT EXISTS events ('
    'seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, kind TEXT NOT NULL, '
    'step_index INTEGER NOT NULL, timestamp TEXT NOT NULL, conversation_id TEXT, parent_run_id TEXT, '
    'agent_name TEXT, tool_call_id TEXT, tool_name TEXT, error TEXT, metadata TEXT NOT NULL, '
    'idempotency_key TEXT)',
    'CREATE TABLE IF NOT EXISTS snapshots ('
    'seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, step_index INTEGER NOT NULL, '
    'conversation_id TEXT, parent_run_id TEXT, agent_name TEXT, timestamp TEXT NOT NULL, '
    "state TEXT NOT NULL DEFAULT 'complete', messages TEXT NOT NULL, idempotency_key TEXT, "
    'message_count INTEGER, log_size INTEGER)',
    'CREATE TABLE IF NOT EXISTS messages ('
    'run_id TEXT NOT NULL, log_index INTEGER NOT NULL, position INTEGER NOT NULL, message TEXT NOT NULL, '
    # A rowid table, not WITHOUT ROWID: messages are kilobytes, and WITHOUT ROWID keeps only ~1 KB
    # of a row on its page and spills the rest to overflow pages, which nearly doubled the file.
    'PRIMARY KEY (run_id, log_index))',
    'CREATE TABLE IF NOT EXISTS snapshot_keys ('
    'run_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, PRIMARY KEY (run_id, idempotency_key)) WITHOUT ROWID',
    'CREATE TABLE IF NOT EXISTS tool_effects ('
    'run_id TEXT NOT NULL, tool_call_id TEXT NOT NULL, tool_name TEXT NOT NULL, status TEXT NOT NULL, '
    'started_at TEXT NOT NULL, ended_at TEXT, idempotency_key TEXT, effect_summary TEXT, '
    'PRIMARY KEY (run_id, tool_call_id))',
)
_ADDED_COLUMNS = (
    # Columns later releases added to tables an older database may already have.
    ('runs', 'registration_id', 'TEXT'),
    ('events', 'idempotency_key', 'TEXT'),
    ('snapshots', 'state', "TEXT NOT NULL DEFAULT 'complete'"),
    ('snapshots', 'idempotency_key', 'TEXT'),
    ('snapshots', 'message_count', 'INTEGER'),
    ('snapshots', 'log_size', 'INTEGER'),
)
_CREATE_INDEXES = (
    'CREATE INDEX IF NOT EXISTS idx_runs_conversation_started ON runs(conversation_id, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_parent_started ON runs(parent_run_id, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_started ON runs(started_at)',
    'CREATE INDEX IF NOT EXISTS idx_events_run_seq ON events(run_id, seq)',
    'CREATE UNIQUE INDEX IF NOT EXISTS idx_events_run_key ON events(run_id, idempotency_key) '
    'WHERE idempotency_key IS NOT NULL',
    'CREATE INDEX IF NOT EXISTS idx_snapshots_run_seq ON snapshots(run_id, seq)',
    'CREATE INDEX IF NOT EXISTS idx_snapshots_run_state_seq ON snapshots(run_id, state, seq)',
)


_BUSY_TIMEOUT_MS = 30_000
"""How long a call on a worker thread waits for another connection's write lock."""
_CHECKPOINT_EVERY = 256
"""Commits between WAL checkpoints on the store's own connection (SQLite's default is about as
many pages: 1000, and a commit here writes a few)."""
_WAL_LIMIT_BYTES = 64 << 20
"""A WAL file this large when a checkpoint is due is checkpointed and truncated on the store's own
connection, between two of its writes. The background checkpoints let the WAL start over from
its beginning, but only when one finishes while nobody appends, and the file never shrinks."""


class SqliteStepStore:
    """A `StepStore` in a SQLite database file (or a connection you already have).

    ```python
    from pydantic_ai_steps.step_persistence import SqliteStepStore

    store = SqliteStepStore(database='runs.db', max_snapshots_per_run=8)
    ```

    Give exactly one of `database=` (a path; the store opens and owns one connection, lazily, on a
    worker thread; a call that cannot wait for a lock then runs right on the event loop, any other
    on a worker) or `connection=` (a `sqlite3.Connection` that must be opened with
    `check_same_thread=False`, because store calls run on worker threads; the caller owns and
    closes it). On a shared connection each write is its own `BEGIN IMMEDIATE` transaction,
    committed at once; if you have a transaction open, the write goes in a savepoint inside it
    and commits with yours. Calls through
    this store are serialized, but other users of a shared connection must not run statements on it
    at the same time (the same holds for a `SqliteMediaStore` given the same connection).

    Payloads of `media_threshold_bytes` or more go to `media_store`: by default a
    `SqliteMediaStore` on the same database (table `media`), through a connection of its own
    (except for an in-memory database, which only the given connection can reach); `None` keeps
    them inline.

    What survives what: WAL mode is switched on (for a shared connection too). With
    `durable=False` (`synchronous=NORMAL`) a committed call survives a crash of the process, and
    a power loss can roll back the last transactions but never corrupts the database. With
    `durable=True` (`synchronous=FULL`) every commit is flushed to disk before the call returns,
    so it survives power loss as well. Readers skip rows they cannot decode, with a warning.
    """

    def __init__(
        self,
        *,
        database: str | os.PathLike[str] | None = None,
        connection: sqlite3.Connection | None = None,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        durable: bool = False,
    ) -> None:
        if (database is None) == (connection is None):
            raise ValueError(
                'SqliteStepStore needs exactly one of database= (a path the store opens itself) or '
                f'connection= (an open sqlite3.Connection); got database={database!r}, connection={connection!r}'
            )
        if connection is not None:
            require_cross_thread_use(connection, 'SqliteStepStore')
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        threshold = check_threshold(media_threshold_bytes)
        self._database = os.fspath(database) if database is not None else None
        self._connection = connection
        self._owns_connection = connection is None
        self.durable = durable
        self._lock = threading.Lock()
        self._owned_media: Any = None
        if media_store == 'auto':
            from ...media.stores.sqlite import SqliteMediaStore

            # Same database, own connection: the media store serializes its calls with its own lock,
            # so on a shared connection its commit could land inside this store's transaction.
            path = self._database if self._database is not None else _database_file(connection)
            if path is not None:
                media_store = SqliteMediaStore(database=path, durable=durable)
                self._owned_media = media_store
            else:  # an in-memory database exists only on that connection
                media_store = SqliteMediaStore(connection=connection, durable=durable)
                # Then both stores must take turns on it: `sqlite3` does not survive two threads
                # running statements on one connection at once. SqliteMediaStore has no public way
                # to pass a lock in, so it is handed this store's lock.
                media_store._lock = self._lock  # pyright: ignore[reportPrivateUsage]
        self.media_store: MediaStore | None = media_store
        self._log = MessageLog(media_store, threshold)
        self._schema_ready = False
        self._commits_since_checkpoint = 0
        self._wal_too_long = False
        self._checkpointer = BackgroundCheckpointer.for_database(self._database, 'pydantic-ai-steps-checkpoint')

    def __repr__(self) -> str:
        where = f'database={self._database!r}' if self._database is not None else 'connection=<caller-owned>'
        return (
            f'SqliteStepStore({where}, max_snapshots_per_run={self.max_snapshots_per_run}, '
            f'media_store={self.media_store!r}, durable={self.durable})'
        )

    def close(self) -> None:
        """Close the connection this store opened (a caller's `connection=` is left open).

        The default media store's own connection is closed too, and a background checkpoint is
        waited for. A later call reopens both.
        """
        with self._lock:
            if self._owns_connection and self._connection is not None:
                self._connection.close()
                self._connection = None
                self._schema_ready = False
        if self._checkpointer is not None:
            self._checkpointer.wait()
        close = getattr(self._owned_media, 'close', None)
        if callable(close):
            close()

    async def aclose(self) -> None:
        """`close()` on a worker thread, so the event loop never waits for the lock."""
        await run_blocking(self.close)

    # --- runs -------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        rows = _Rows(run=record)
        await self._run(lambda conn: self._insert_rows(conn, rows))

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        return await self._run(lambda conn: self._get_run(conn, run_id))

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        return await self._run(lambda conn: self._list_runs(conn, parent_run_id, conversation_id), inline=False)

    # --- events -----------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        rows = _Rows(events=[_event_row(event)])
        await self._run(lambda conn: self._insert_rows(conn, rows))

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        return await self._run(lambda conn: self._list_events(conn, run_id), inline=False)

    # --- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._log.save(snapshot, partial(self._write_prepared, rows=_Rows()))

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None:
        """The run, the snapshot, the tool effects and the events in one transaction (see `RecordBatchStore`)."""
        rows = _Rows(run, [_effect_row(record) for record in tool_effects], [_event_row(event) for event in events])
        if snapshot is None:
            await self._run(lambda conn: self._insert_rows(conn, rows))
        else:
            await self._log.save(snapshot, partial(self._write_prepared, rows=rows))

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        return await self._log.newest_readable(
            run_id,
            lambda below: self._run(
                partial(self._read_newest, run_id=run_id, interrupted=include_interrupted, below=below), inline=False
            ),
        )

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Every retained snapshot of the run, oldest first; `interrupted` ones only if asked."""
        return await self._log.all_readable(
            run_id, await self._run(lambda conn: self._read_all(conn, run_id, include_interrupted), inline=False)
        )

    # --- tool effects -----------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        rows = _Rows(effects=[_effect_row(record)])
        await self._run(lambda conn: self._insert_rows(conn, rows))

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        return await self._run(lambda conn: self._get_tool_effect(conn, run_id, tool_call_id))

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return await self._run(lambda conn: self._list_unresolved(conn, run_id))

    # === blocking bodies (worker threads, under the lock) =====================================

    def _insert_run(self, conn: sqlite3.Connection, record: RunRecord) -> None:
        values = (
            record.run_id,
            record.conversation_id,
            record.parent_run_id,
            record.agent_name,
            _metadata_text(record.metadata),
            record.started_at.isoformat(),
            record.registration_id,
        )
        try:
            conn.execute(f'INSERT INTO runs ({", ".join(_RUN_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)', values)
        except sqlite3.IntegrityError as error:
            if 'runs.run_id' not in str(error):
                raise
            raise RunAlreadyExistsError(record.run_id) from None

    def _get_run(self, conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
        row = conn.execute(f'SELECT {", ".join(_RUN_COLUMNS)} FROM runs WHERE run_id = ?', (run_id,)).fetchone()
        return _decode_run(row) if row is not None else None

    def _list_runs(
        self, conn: sqlite3.Connection, parent_run_id: str | None, conversation_id: str | None
    ) -> list[RunRecord]:
        clauses: list[str] = []
        params: list[str] = []
        if conversation_id is not None:
            clauses.append('conversation_id = ?')
            params.append(conversation_id)
        if parent_run_id is not None:
            clauses.append('parent_run_id = ?')
            params.append(parent_run_id)
        where = f' WHERE {" AND ".join(clauses)}' if clauses else ''
        rows = conn.execute(
            f'SELECT {", ".join(_RUN_COLUMNS)} FROM runs{where} ORDER BY started_at, rowid', params
        ).fetchall()
        records = [record for record in map(_decode_run, rows) if record is not None]
        # SQL ordered the ISO text; re-sort (stable, so nearly free) by instant for mixed offsets.
        records.sort(key=lambda record: record.started_at)
        return records

    def _insert_rows(self, conn: sqlite3.Connection, rows: _Rows) -> None:
        """Register a run, upsert tool effects and append events (a duplicate event key is skipped)."""
        with self._write(conn, immediate=rows.statements() > 1):
            if rows.run is not None:
                self._insert_run(conn, rows.run)
            self._insert_effects_and_events(conn, rows)

    def _insert_effects_and_events(self, conn: sqlite3.Connection, rows: _Rows) -> None:
        if rows.effects:
            conn.executemany(_UPSERT_EFFECT, rows.effects)
        if rows.events:
            conn.executemany(_INSERT_EVENT, rows.events)

    def _list_events(self, conn: sqlite3.Connection, run_id: str) -> list[StepEvent]:
        rows = conn.execute(
            f'SELECT seq, {", ".join(_EVENT_COLUMNS)} FROM events WHERE run_id = ? ORDER BY seq', (run_id,)
        ).fetchall()
        events: list[StepEvent] = []
        for row in rows:
            try:
                data = dict(zip(_EVENT_COLUMNS, row[1:], strict=True))
                data['metadata'] = _metadata_value(data['metadata'])
                events.append(event_from_dict(data))
            except ValueError:
                logger.warning('skipping unreadable event row %s of run %r', row[0], run_id, exc_info=True)
        return events

    def _get_tool_effect(self, conn: sqlite3.Connection, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        row = conn.execute(
            f'SELECT {", ".join(_EFFECT_COLUMNS)} FROM tool_effects WHERE run_id = ? AND tool_call_id = ?',
            (run_id, tool_call_id),
        ).fetchone()
        return _decode_effect(row) if row is not None else None

    def _list_unresolved(self, conn: sqlite3.Connection, run_id: str) -> list[ToolEffectRecord]:
        rows = conn.execute(
            f'SELECT {", ".join(_EFFECT_COLUMNS)} FROM tool_effects '
            "WHERE run_id = ? AND status = 'started' ORDER BY rowid",
            (run_id,),
        ).fetchall()
        return [record for record in map(_decode_effect, rows) if record is not None]

    # --- snapshot writes --------------------------------------------------------------------

    async def _write_prepared(self, prepared: PreparedSnapshot, *, rows: _Rows) -> WriteOutcome:
        try:
            return await self._run(lambda conn: self._write_snapshot(conn, prepared, rows))
        except BaseException:
            # The outcome is unknown: the next save of this run rewrites its history in full.
            self._log.forget(prepared.snapshot.run_id)
            raise

    def _write_snapshot(self, conn: sqlite3.Connection, prepared: PreparedSnapshot, rows: _Rows) -> WriteOutcome:
        """One transaction: the run, then key check, message appends, snapshot row, retention, then the rest."""
        try:
            with self._write(conn, immediate=True):
                if rows.run is not None:
                    self._insert_run(conn, rows.run)
                outcome = self._write_snapshot_rows(conn, prepared)
                self._insert_effects_and_events(conn, rows)
            return outcome
        except _Stale:
            return STALE

    def _write_snapshot_rows(self, conn: sqlite3.Connection, prepared: PreparedSnapshot) -> int | Literal['suppressed']:
        snapshot = prepared.snapshot
        run_id, key = snapshot.run_id, snapshot.idempotency_key
        if key is not None:
            claimed = conn.execute(
                'INSERT INTO snapshot_keys (run_id, idempotency_key) VALUES (?, ?) ON CONFLICT DO NOTHING',
                (run_id, key),
            )
            if claimed.rowcount == 0:
                return SUPPRESSED
        (end,) = conn.execute(
            'SELECT COALESCE(MAX(log_index) + 1, 0) FROM messages WHERE run_id = ?', (run_id,)
        ).fetchone()
        if prepared.known_log_size is not None and prepared.known_log_size != end:
            raise _Stale
        if prepared.appends:
            conn.executemany(
                'INSERT INTO messages (run_id, log_index, position, message) VALUES (?, ?, ?, ?)',
                [(run_id, end + offset, position, text) for offset, (position, text) in enumerate(prepared.appends)],
            )
        log_size = end + len(prepared.appends)
        reference = json.dumps({'message_count': prepared.message_count, 'log_size': log_size})
        conn.execute(
            'INSERT INTO snapshots (run_id, step_index, conversation_id, parent_run_id, agent_name, timestamp, '
            'state, messages, idempotency_key, message_count, log_size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
            (
                run_id,
                snapshot.step_index,
                snapshot.conversation_id,
                snapshot.parent_run_id,
                snapshot.agent_name,
                snapshot.timestamp.isoformat(),
                snapshot.state,
                reference,
                key,
                prepared.message_count,
                log_size,
            ),
        )
        if self.max_snapshots_per_run is not None:
            self._prune(conn, run_id, self.max_snapshots_per_run)
        return log_size

    def _prune(self, conn: sqlite3.Connection, run_id: str, limit: int) -> None:
        rows: list[tuple[int, str]] = conn.execute(
            'SELECT seq, state FROM snapshots WHERE run_id = ?', (run_id,)
        ).fetchall()
        keep = snapshots_to_keep(((seq, cast(SnapshotState, state)) for seq, state in rows), limit)
        if keep is None:
            return
        doomed = [seq for seq, _ in rows if seq not in keep]
        for start in range(0, len(doomed), _DELETE_CHUNK):
            chunk = doomed[start : start + _DELETE_CHUNK]
            conn.execute(f'DELETE FROM snapshots WHERE seq IN ({", ".join("?" * len(chunk))})', chunk)

    # --- snapshot reads ---------------------------------------------------------------------

    def _read_newest(
        self, conn: sqlite3.Connection, *, run_id: str, interrupted: bool, below: int | None
    ) -> _FoundSnapshot | None:
        sql = f'SELECT {", ".join(_SNAPSHOT_COLUMNS)} FROM snapshots WHERE run_id = ?'
        params: list[object] = [run_id]
        if not interrupted:
            sql += " AND state = 'complete'"
        if below is not None:
            sql += ' AND seq < ?'
            params.append(below)
        for row in conn.execute(sql + ' ORDER BY seq DESC', params).fetchall():
            found = _decode_snapshot_row(row, run_id)
            if found is None:
                continue
            texts = self._texts(conn, run_id, found, None)
            if texts is None:
                continue
            found.texts = texts
            return found
        return None

    def _read_all(self, conn: sqlite3.Connection, run_id: str, include_interrupted: bool) -> list[_FoundSnapshot]:
        sql = f'SELECT {", ".join(_SNAPSHOT_COLUMNS)} FROM snapshots WHERE run_id = ?'
        if not include_interrupted:
            sql += " AND state = 'complete'"
        rows = conn.execute(sql + ' ORDER BY seq', (run_id,)).fetchall()
        log: list[LogEntry] | None = None
        result: list[_FoundSnapshot] = []
        for row in rows:
            found = _decode_snapshot_row(row, run_id)
            if found is None:
                continue
            if found.log_ref is not None and log is None:
                log = [
                    LogEntry(index, position, text)
                    for index, position, text in conn.execute(
                        'SELECT log_index, position, message FROM messages WHERE run_id = ? ORDER BY log_index',
                        (run_id,),
                    )
                ]
            texts = self._texts(conn, run_id, found, log)
            if texts is not None:
                found.texts = texts
                result.append(found)
        return result

    def _texts(
        self, conn: sqlite3.Connection, run_id: str, found: _FoundSnapshot, log: Sequence[LogEntry] | None
    ) -> list[str] | None:
        """The stored message texts of a snapshot row, or `None` (with a warning) if they are not all there."""
        if found.log_ref is not None:
            count, size = found.log_ref
            if log is None:
                log = [
                    LogEntry(index, position, text)
                    for index, position, text in conn.execute(
                        'SELECT log_index, position, message FROM messages '
                        'WHERE run_id = ? AND log_index < ? AND position < ?',
                        (run_id, size, count),
                    )
                ]
            texts = resolve_history(log, count, size)
            if texts is None:
                logger.warning('skipping snapshot row %s of run %r: messages missing from the log', found.seq, run_id)
            return texts
        return _legacy_texts(conn, run_id, found)

    # --- connection plumbing ----------------------------------------------------------------

    async def _run(self, body: Callable[[sqlite3.Connection], _R], *, inline: bool = True) -> _R:
        """Run `body` on the connection: tried on the event loop first when `inline` (see `_offload`).

        Only the store's own connection is tried there, and not when `durable` (each commit then
        waits for the disk). A caller's `connection=` keeps whatever busy timeout the caller set,
        so its calls always go to a worker.
        """
        return await run_soon(self._locked, body, inline=inline and self._owns_connection and not self.durable)

    def _locked(self, body: Callable[[sqlite3.Connection], _R]) -> _R:
        acquire(self._lock)
        try:
            if may_wait():
                return self._waiting(body)
            return self._without_waiting(body)
        finally:
            self._lock.release()

    def _waiting(self, body: Callable[[sqlite3.Connection], _R]) -> _R:
        """On a worker thread: wait for the write lock up to the busy timeout; checkpoint when due."""
        conn = self._conn()
        if not self._owns_connection:
            return body(conn)
        conn.execute(f'PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}')
        try:
            if self._wal_too_long and self._checkpointer is not None:
                self._checkpointer.wait()  # a running checkpoint would make this one give up at once
                conn.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()
                self._wal_too_long = False
            return body(conn)
        finally:
            conn.execute('PRAGMA busy_timeout = 0')
            self._checkpoint_when_due()

    def _without_waiting(self, body: Callable[[sqlite3.Connection], _R]) -> _R:
        """On the event loop: the connection's busy timeout is 0, so a held write lock raises at once."""
        conn = self._connection
        if conn is None or not self._schema_ready or self._wal_too_long:
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
                self._wal_too_long = self._checkpointer.wal_bytes() > _WAL_LIMIT_BYTES
                if not self._wal_too_long:
                    self._checkpointer.request()

    def _conn(self) -> sqlite3.Connection:
        """The connection, opened and migrated on first use. Call under the lock."""
        conn = self._connection
        if conn is None:
            assert self._database is not None
            if self._database != _MEMORY and not self._database.startswith('file:'):
                Path(self._database).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self._database, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000
            )
            enable_wal(conn)
            conn.execute(f'PRAGMA synchronous={"FULL" if self.durable else "NORMAL"}')
            # Checkpoints flush to disk: they run on a thread of their own every
            # `_CHECKPOINT_EVERY` commits, never inside a commit (see `BackgroundCheckpointer`).
            conn.execute('PRAGMA wal_autocheckpoint = 0')
            self._connection = conn
        if not self._schema_ready:
            if not self._owns_connection and not conn.in_transaction:
                # A shared connection gets WAL too (a property of the database file, so it sticks);
                # its synchronous level is the caller's, unless this store was asked to be durable.
                enable_wal(conn)
                if self.durable:
                    conn.execute('PRAGMA synchronous=FULL')
            self._migrate(conn)
            self._schema_ready = not conn.in_transaction or self._owns_connection
        return conn

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

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the database to `SCHEMA_VERSION`, in one transaction that re-checks the version."""
        if _schema_version(conn) == SCHEMA_VERSION:
            return
        with self._write(conn, immediate=True):
            version = _schema_version(conn)
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f'database schema version {version} is newer than this release understands '
                    f'({SCHEMA_VERSION}); upgrade pydantic-ai-steps to open it'
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                _MIGRATIONS[target](conn)
                conn.execute('INSERT INTO schema_version (version) VALUES (?)', (target,))


class _Stale(Exception):
    """Raised inside the snapshot transaction to roll it back: the run's log grew elsewhere."""


# === migrations ===============================================================================


def _schema_version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute('SELECT MAX(version) FROM schema_version').fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0]) if row is not None and row[0] is not None else 0


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    """Version 1: the message-log layout. Also adopts databases of older layouts.

    A database from before snapshot states gets `state` (old rows read `complete`), and the
    other columns later layouts added. Keys the upstream package kept in
    `snapshot_idempotency_keys` are copied to `snapshot_keys`, and its triggers that would drop
    or duplicate work are removed; its message tables stay readable.
    """
    conn.execute('CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)')
    for statement in _CREATE_TABLES:
        conn.execute(statement)
    for table, column, declaration in _ADDED_COLUMNS:
        columns = {row[1] for row in conn.execute(f'PRAGMA table_info({table})')}
        if column not in columns:
            conn.execute(f'ALTER TABLE {table} ADD COLUMN {column} {declaration}')
    for statement in _CREATE_INDEXES:
        conn.execute(statement)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if 'snapshot_idempotency_keys' in tables:
        conn.execute(
            'INSERT OR IGNORE INTO snapshot_keys (run_id, idempotency_key) '
            'SELECT run_id, idempotency_key FROM snapshot_idempotency_keys'
        )
    conn.execute('DROP TRIGGER IF EXISTS snapshots_idempotency_ignore')
    conn.execute('DROP TRIGGER IF EXISTS snapshots_idempotency_record')


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1}


# === row decoding =============================================================================


@dataclass
class _FoundSnapshot:
    seq: int
    meta: SnapshotMeta
    log_ref: tuple[int, int] | None
    """`(message_count, log_size)`; `None` for a row of an older layout (see `legacy`)."""
    legacy: str | None
    texts: list[str]


def _decode_snapshot_row(row: tuple[Any, ...], run_id: str) -> _FoundSnapshot | None:
    data = dict(zip(_SNAPSHOT_COLUMNS, row, strict=True))
    what = 'snapshot row'
    try:
        meta = SnapshotMeta(
            step_index=required_int(data, 'step_index', what),
            conversation_id=optional_str(data, 'conversation_id', what),
            parent_run_id=optional_str(data, 'parent_run_id', what),
            agent_name=optional_str(data, 'agent_name', what),
            timestamp=timestamp(data, 'timestamp', what),
            state=snapshot_state(data['state']),
            idempotency_key=optional_str(data, 'idempotency_key', what),
        )
        count, size = data['message_count'], data['log_size']
        if count is not None or size is not None:
            count = required_int(data, 'message_count', what)
            size = required_int(data, 'log_size', what)
            if count < 0 or size < 0:
                raise ValueError(f'{what} message_count/log_size must be non-negative, got {count}, {size}')
            return _FoundSnapshot(data['seq'], meta, (count, size), None, [])
        legacy = data['messages']
        if not isinstance(legacy, str):
            raise ValueError(f'{what} field "messages" must be text, got {legacy!r}')
        return _FoundSnapshot(data['seq'], meta, None, legacy, [])
    except ValueError:
        logger.warning('skipping unreadable snapshot row %s of run %r', data['seq'], run_id, exc_info=True)
        return None


def _legacy_texts(conn: sqlite3.Connection, run_id: str, found: _FoundSnapshot) -> list[str] | None:
    """Message texts of a row written before the message log: inline JSON, or upstream references."""
    raw = found.legacy or ''
    try:
        value: object = json.loads(raw)
        if isinstance(value, list):
            return [_compact(item) for item in cast(list[object], value)]
        if isinstance(value, dict) and isinstance(stored := cast(dict[str, Any], value).get('stored_messages'), int):
            rows: list[tuple[object]] = conn.execute(
                'SELECT m.message FROM snapshot_message_refs r LEFT JOIN snapshot_messages m ON m.sha256 = r.sha256 '
                'WHERE r.snapshot_seq = ? ORDER BY r.position',
                (found.seq,),
            ).fetchall()
            texts = [text for (text,) in rows if isinstance(text, str)]
            if len(texts) == stored and len(rows) == stored:
                return texts
            raise ValueError(f'snapshot is missing {stored - len(texts)} of its {stored} stored message(s)')
        raise ValueError(f'snapshot row "messages" is neither a history nor a reference: {raw[:100]!r}')
    except (ValueError, sqlite3.OperationalError):
        logger.warning('skipping unreadable snapshot row %s of run %r', found.seq, run_id, exc_info=True)
        return None


def _decode_run(row: tuple[Any, ...]) -> RunRecord | None:
    data = dict(zip(_RUN_COLUMNS, row, strict=True))
    try:
        data['metadata'] = _metadata_value(data['metadata'])
        return run_from_dict(data)
    except ValueError:
        logger.warning('skipping unreadable run row %r', data['run_id'], exc_info=True)
        return None


def _decode_effect(row: tuple[Any, ...]) -> ToolEffectRecord | None:
    data = dict(zip(_EFFECT_COLUMNS, row, strict=True))
    try:
        return tool_effect_from_dict(data)
    except ValueError:
        logger.warning('skipping unreadable tool effect row %r/%r', data['run_id'], data['tool_call_id'], exc_info=True)
        return None


def _event_row(event: StepEvent) -> _Row:
    """`event` as values for `_EVENT_COLUMNS`."""
    return (
        event.run_id,
        event.kind,
        event.step_index,
        event.timestamp.isoformat(),
        event.conversation_id,
        event.parent_run_id,
        event.agent_name,
        event.tool_call_id,
        event.tool_name,
        event.error,
        _metadata_text(event.metadata),
        event.idempotency_key,
    )


def _effect_row(record: ToolEffectRecord) -> _Row:
    """`record` as values for `_EFFECT_COLUMNS`."""
    return (
        record.run_id,
        record.tool_call_id,
        record.tool_name,
        record.status,
        record.started_at.isoformat(),
        record.ended_at.isoformat() if record.ended_at is not None else None,
        record.idempotency_key,
        record.effect_summary,
    )


def _metadata_text(metadata: dict[str, str]) -> str:
    return json.dumps(metadata, separators=(',', ':'))


def _metadata_value(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, str):
        raise ValueError(f'metadata column must hold JSON text, got {raw!r}')
    try:
        value: object = json.loads(raw)
    except ValueError as error:
        raise ValueError(f'metadata column is not valid JSON: {error}') from None
    return metadata_dict(value, 'row')


def _database_file(connection: sqlite3.Connection | None) -> str | None:
    """The file behind a connection's main database; `None` for an in-memory or temporary one."""
    if connection is None:
        return None
    for _, name, path in connection.execute('PRAGMA database_list').fetchall():
        if name == 'main':
            return path or None
    return None  # pragma: no cover - every connection has a main database


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(',', ':'))
