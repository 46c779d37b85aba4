"""The SQLite backend: each commit one transaction, each fetch one query, over `SqliteConnection`.

The connection (lazily opened, offloaded to a worker when it would wait, checkpointed in the
background) is `_connection.py`'s; this module holds the statements.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from ...._errors import RunAlreadyExistsError, RunNotFoundError
from ...._records import RunQuery
from ...._sqlite import immutable_uri
from ...backend import (
    STALE,
    SUPPRESSED,
    CommitOutcome,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    WriteBatch,
    log_slice,
)
from ...codec import EFFECT_FIELDS, EVENT_FIELDS, RESOLUTION_FIELDS, RUN_FIELDS, SNAPSHOT_FIELDS, TEXT
from .._offload import run_blocking
from .._sql import SQLITE, order_and_limit, run_filters
from ._connection import SqliteConnection
from ._inserts import Insert
from ._legacy import legacy_texts
from ._schema import ON_KEY_CONFLICT, RUN_COLUMNS, Columns, foreign_tables

_MEMORY = ':memory:'
_CHUNK = 500
_values: Callable[[Row], Collection[object]] = dict[str, Any].values
"""A row's values in column order, mapped over rows in C."""

_INSERT_EVENT = Insert('events', EVENT_FIELDS, ON_KEY_CONFLICT)
_UPSERT_EFFECT = Insert(
    'tool_effects',
    EFFECT_FIELDS,
    'ON CONFLICT (run_id, tool_call_id) DO UPDATE SET '
    + ', '.join(f'{column} = excluded.{column}' for column in EFFECT_FIELDS[2:] if column not in RESOLUTION_FIELDS),
)
"""A stored entry keeps its resolution: only `_RESOLVE_EFFECT` writes it."""
_RESOLVE_EFFECT = (
    f'UPDATE tool_effects SET {", ".join(f"{column} = ?" for column in RESOLUTION_FIELDS)} '
    "WHERE run_id = ? AND tool_call_id = ? AND status = 'started'"
)
_INSERT_RUN = Insert('runs', RUN_FIELDS)
_INSERT_SNAPSHOT = Insert('snapshots', (*SNAPSHOT_FIELDS, 'messages'))

_PROBE_SNAPSHOT = (
    'SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1), '
    'EXISTS (SELECT 1 FROM snapshot_idempotency_keys WHERE run_id = ?1 AND idempotency_key = ?2), '
    '(SELECT COALESCE(MAX(log_index) + 1, 0) FROM messages WHERE run_id = ?1)'
)
"""What a snapshot write needs to know first, in one statement: whether its run is stored, whether
its idempotency key was written already, and where the run's message log ends."""


class _Stale(Exception):
    """Raised inside the commit's transaction to roll it back: the run's log grew elsewhere."""


class SqliteBackend(SqliteConnection):
    encoding = TEXT

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
                        _INSERT_RUN.execute(conn, batch.run.values())
                    except sqlite3.IntegrityError as error:
                        if 'runs.run_id' not in str(error):
                            raise
                        raise RunAlreadyExistsError(batch.run['run_id']) from None
                probed = batch.snapshot.run_id if batch.snapshot is not None else None  # checked with its log
                for run_id in batch.run_ids:
                    if (
                        run_id != registered
                        and run_id != probed
                        and conn.execute('SELECT 1 FROM runs WHERE run_id = ?', (run_id,)).fetchone() is None
                    ):
                        raise RunNotFoundError(run_id)
                outcome = self._write_snapshot(conn, batch) if batch.snapshot is not None else None
                if batch.tool_effects:
                    _UPSERT_EFFECT.executemany(conn, map(_values, batch.tool_effects))
                if batch.events:
                    _INSERT_EVENT.executemany(conn, map(_values, batch.events))
                for closing in batch.closings:
                    conn.execute(
                        'UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?',
                        (closing.status, closing.ended_at, closing.run_id),
                    )
            return outcome
        except _Stale:
            return STALE
        except UnicodeEncodeError as error:  # a lone surrogate: SQLite holds UTF-8 text only
            raise batch.unencodable('stored in SQLite', error) from None

    def _write_snapshot(self, conn: sqlite3.Connection, batch: WriteBatch) -> CommitOutcome:
        write = batch.snapshot
        assert write is not None
        run_id, key = write.run_id, write.key
        known, seen, end = conn.execute(_PROBE_SNAPSHOT, (run_id, key)).fetchone()
        if not known:
            raise RunNotFoundError(run_id)
        if seen:
            return SUPPRESSED
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
        _INSERT_SNAPSHOT.execute(conn, (*row.values(), reference))
        if key is not None:
            conn.execute(
                'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) VALUES (?, ?)', (run_id, key)
            )
        return log_size

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        statement = _RESOLVE_EFFECT if overwrite else _RESOLVE_EFFECT + ' AND resolution IS NULL'
        params = (*(resolution.get(column) for column in RESOLUTION_FIELDS), run_id, tool_call_id)

        def resolve(conn: sqlite3.Connection) -> bool:
            with self._write(conn):
                return conn.execute(statement, params).rowcount == 1

        return await self._run(resolve, write=True)

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
            # `+seq` keeps SQLite on the run's index, then sorts: with `ANALYZE` statistics showing
            # few runs, ordering by `seq` itself has it walk the whole table to spare that sort.
            statement = f'SELECT {columns.select("events", EVENT_FIELDS)} FROM events WHERE run_id = ? ORDER BY +seq'
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
            return log_slice(rows)

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
        real = path.resolve()  # SQLite follows a link to the database, and keeps its WAL beside the target
        files = [real, *(real.with_name(real.name + suffix) for suffix in ('-wal', '-journal'))]
        size = sum(info.st_size for info in map(_stat, files) if info is not None)
        if not path.exists():
            return Probe(exists=False, step_store=False, detail=f'{path} does not exist')
        if not path.is_file():  # a FIFO would block the read below, a directory fail it
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path} is not a regular file')
        try:
            with path.open('rb') as handle:
                header = handle.read(20)
        except OSError as error:
            return Probe(exists=True, step_store=False, size_bytes=size, detail=str(error), readable=False)
        if header[:16] != b'SQLite format 3\x00':
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path} is not a SQLite database')
        try:
            try:
                columns = _read_columns(real.as_uri() + '?mode=ro')
            except sqlite3.OperationalError as error:
                immutable = immutable_uri(str(real), error)
                if immutable is None:
                    raise
                columns = _read_columns(immutable)
        except sqlite3.Error as error:
            return _unreadable(path, real, size, error, wal=header[18:20] == b'\x02\x02')
        if not columns.has('runs'):
            return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path} has no runs table')
        problem = foreign_tables(columns)
        if problem is not None:  # another application's tables of those names
            detail = f"{path} holds tables that are not a step store's ({problem})"
            return Probe(exists=True, step_store=False, size_bytes=size, detail=detail)
        return Probe(exists=True, step_store=True, size_bytes=size)


def _read_columns(uri: str) -> Columns:
    reader = sqlite3.connect(uri, uri=True, timeout=5.0)
    try:
        return Columns.read(reader)
    finally:
        reader.close()


def _unreadable(path: Path, real: Path, size: int, error: sqlite3.Error, *, wal: bool) -> Probe:
    """A database SQLite would not open read-only; a WAL one (its header says so: `wal`) it cannot
    read without creating its `-shm` file, which a user who may not write beside it cannot."""
    if wal and getattr(error, 'sqlite_errorname', '').startswith('SQLITE_READONLY'):
        detail = (
            f'{path} is a WAL database, and SQLite must create {real.name}-shm beside it to read it, '
            f'which this user may not do in {real.parent} ({error}); read a copy of it (and of its -wal file, '
            'if there is one) in a directory this user can write, or run as a user who may write there'
        )
        return Probe(exists=True, step_store=False, size_bytes=size, detail=detail, readable=False)
    return Probe(exists=True, step_store=False, size_bytes=size, detail=f'{path}: {error}', readable=False)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None
