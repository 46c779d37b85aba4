"""The PostgreSQL backend: each write one statement (`{t}_commit`), each read one or two.

Why a function: a write of the capability registers the run, claims a snapshot key, checks
where the run's log ends, appends to it, inserts the snapshot, upserts tool effects, inserts
events and closes runs, each conditional on the one before. As one `SELECT {t}_commit(...)` with
the tool effects and events bound as two JSON arrays of rows, that is one round trip and one
implicit transaction whatever the batch holds or the history's length. A refusal (run taken,
run missing, log moved) is raised inside it, so nothing the statement did stays.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError, to_json

from ...._errors import InvalidRecordError, RunAlreadyExistsError, RunNotFoundError
from ...._records import RunQuery
from ...backend import (
    STALE,
    SUPPRESSED,
    CommitOutcome,
    Damaged,
    LogEntry,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    WriteBatch,
)
from ...codec import EFFECT_FIELDS, EVENT_FIELDS, RESOLUTION_FIELDS, RUN_FIELDS, SNAPSHOT_FIELDS, Encoding
from .._sql import POSTGRES, order_and_limit, run_filters
from ._legacy import legacy_texts
from ._pool import Connections, PostgresConnection, sqlstate
from ._schema import (
    LEGACY_TABLES,
    LOG_MOVED,
    RUN_COLUMNS,
    RUN_EXISTS,
    RUN_MISSING,
    SCHEMA_VERSION,
    SUPPRESSED_CODE,
    TABLES,
    Columns,
    check_readable,
    commit_statement,
    migrate,
    read_columns,
)

_R = TypeVar('_R')
_BIG = (1 << 62) - 1
_PAGE = 500


class PostgresBackend:
    encoding = Encoding(native_times=True)
    """`timestamptz` columns take `datetime`s; maps go as JSON text (cast to `jsonb` where typed)."""

    def __init__(self, connections: Connections, table: str) -> None:
        self.connections = connections
        self.table = table
        self._columns: Columns | None = None
        self._migrated = False
        self._commit = commit_statement(table)

    # --- writes -----------------------------------------------------------------------------

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        try:
            args = _commit_args(batch)
        except PydanticSerializationError as error:
            raise batch.unencodable('sent to PostgreSQL', error) from None

        async def body(conn: PostgresConnection) -> CommitOutcome:
            await self._ready_to_write(conn)
            try:
                value = await conn.fetchval(self._commit, *args)
            except Exception as error:
                code = sqlstate(error)
                if code == RUN_EXISTS and batch.run is not None:
                    raise RunAlreadyExistsError(batch.run['run_id']) from None
                if code == RUN_MISSING:
                    raise RunNotFoundError(_server_message(error)) from None
                if code == LOG_MOVED:
                    return STALE
                if code in _UNSTORABLE_TEXT:
                    raise InvalidRecordError(_unstorable_text(batch, error)) from None
                encoding = error if isinstance(error, UnicodeEncodeError) else error.__cause__
                if isinstance(encoding, UnicodeEncodeError):  # the driver's message would quote the value
                    raise batch.unencodable('sent to PostgreSQL', encoding) from None
                raise
            if value is None:
                return None
            assert isinstance(value, int)
            if value == SUPPRESSED_CODE:
                return SUPPRESSED
            if batch.snapshot is not None:
                batch.snapshot.row['log_size'] = value
            return value

        return await self.connections.run(body, replay_safe=batch.replay_safe)

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        columns = ', '.join(f'{name} = ${index}' for index, name in enumerate(RESOLUTION_FIELDS, start=3))
        statement = (
            f'UPDATE {self.table}_tool_effects SET {columns} '
            "WHERE run_id = $1 AND tool_call_id = $2 AND status = 'started'"
            + ('' if overwrite else ' AND resolution IS NULL')
            + ' RETURNING 1'
        )
        values = [resolution.get(name) for name in RESOLUTION_FIELDS]

        async def resolve(conn: PostgresConnection) -> bool:
            await self._ready_to_write(conn)
            return await conn.fetchval(statement, run_id, tool_call_id, *values) is not None

        # Not replayed after a connection died with the outcome unknown: a replay of a write that
        # landed would match nothing and read as a refusal. The error surfaces instead.
        return await self.connections.run(resolve, replay_safe=False)

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        statement = f'DELETE FROM {self.table}_snapshots WHERE run_id = $1 AND seq = ANY ($2::bigint[])'
        await self._write(lambda conn: conn.execute(statement, run_id, list(seqs)))

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        if not run_ids:
            return []
        statement = f'SELECT run_id FROM {self.table}_delete_runs($1::text[]) AS run_id'

        async def delete(conn: PostgresConnection) -> list[str]:
            return [str(row[0]) for row in await conn.fetch(statement, list(run_ids))]

        return await self._write(delete)

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        if not indices:
            return
        statement = f'DELETE FROM {self.table}_message_log WHERE run_id = $1 AND log_index = ANY ($2::integer[])'
        await self._write(lambda conn: conn.execute(statement, run_id, list(indices)))

    async def reclaim_space(self) -> None:
        return None  # autovacuum's job: a VACUUM here would hold up the caller for no gain it can see

    # --- reads ------------------------------------------------------------------------------

    async def fetch_run(self, run_id: str) -> Row | None:
        async def read(conn: PostgresConnection) -> Row | None:
            view = await self._view(conn)
            if not view.has('runs'):
                return None
            found = await conn.fetchrow(
                f'SELECT {view.select("runs", RUN_COLUMNS)} FROM {self.table}_runs WHERE run_id = $1', run_id
            )
            return dict(zip(RUN_COLUMNS, found, strict=True)) if found is not None else None

        return await self._read(read)

    async def fetch_runs(self, query: RunQuery) -> list[Row]:
        async def read(conn: PostgresConnection) -> list[Row]:
            view = await self._view(conn)
            if not view.has('runs'):
                return []
            present = set(view.columns['runs'])
            sql = run_filters(query, POSTGRES, self.encoding, present)
            tail = order_and_limit(query, sql, POSTGRES, 'seq' if 'seq' in present else 'run_id')
            statement = f'SELECT {view.select("runs", RUN_COLUMNS)} FROM {self.table}_runs{sql.clause()}{tail}'
            return [dict(zip(RUN_COLUMNS, row, strict=True)) for row in await conn.fetch(statement, *sql.params)]

        return await self._read(read)

    async def fetch_events(self, run_id: str) -> list[Row]:
        async def read(conn: PostgresConnection) -> list[Row]:
            view = await self._view(conn)
            if not view.has('events'):
                return []
            statement = (
                f'SELECT {view.select("events", EVENT_FIELDS)} FROM {self.table}_events WHERE run_id = $1 ORDER BY seq'
            )
            return [dict(zip(EVENT_FIELDS, row, strict=True)) for row in await conn.fetch(statement, run_id)]

        return await self._read(read)

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        async def read(conn: PostgresConnection) -> list[Row]:
            view = await self._view(conn)
            if not view.has('tool_effects'):
                return []
            present = view.columns['tool_effects']
            statement = (
                f'SELECT {view.select("tool_effects", EFFECT_FIELDS)} FROM {self.table}_tool_effects WHERE run_id = $1'
            )
            params: list[object] = [run_id]
            if tool_call_id is not None:
                statement += ' AND tool_call_id = $2'
                params.append(tool_call_id)
            if unresolved_only:
                statement += " AND status = 'started'" + (' AND resolution IS NULL' if 'resolution' in present else '')
            statement += ' ORDER BY seq' if 'seq' in present else ' ORDER BY started_at, tool_call_id'
            return [dict(zip(EFFECT_FIELDS, row, strict=True)) for row in await conn.fetch(statement, *params)]

        return await self._read(read)

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        async def read(conn: PostgresConnection) -> list[SnapshotRow]:
            view = await self._view(conn)
            if not view.has('snapshots'):
                return []
            present = view.columns['snapshots']
            messages = 'messages' if 'messages' in present else 'NULL'
            statement = (
                f'SELECT seq, {messages}, {view.select("snapshots", SNAPSHOT_FIELDS)} '
                f'FROM {self.table}_snapshots WHERE run_id = $1'
            )
            params: list[object] = [run_id]
            if not include_interrupted and 'state' in present:
                statement += " AND state = 'complete'"
            if below_seq is not None:
                params.append(below_seq)
                statement += f' AND seq < ${len(params)}'
            statement += ' ORDER BY seq' + ('' if oldest_first else ' DESC')
            if limit is not None:
                params.append(limit)
                statement += f' LIMIT ${len(params)}'
            rows = await conn.fetch(statement, *params)
            found: list[tuple[int, Row, object]] = []
            for seq, raw, *values in rows:
                found.append((int(seq), dict(zip(SNAPSHOT_FIELDS, values, strict=True)), raw))  # pyright: ignore[reportArgumentType]
            legacy = [(seq, raw) for seq, row, raw in found if row['message_count'] is None and row['log_size'] is None]
            texts: dict[int, list[str] | Damaged] = {}
            if legacy:
                texts = await legacy_texts(conn, self.table, view.has('messages'), legacy)
            return [SnapshotRow(seq, row, texts.get(seq)) for seq, row, _ in found]

        return await self._read(read)

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        async def read(conn: PostgresConnection) -> list[tuple[int, str]]:
            view = await self._view(conn)
            if not view.has('snapshots'):
                return []
            state = 'state' if 'state' in view.columns['snapshots'] else "'complete'"
            rows = await conn.fetch(f'SELECT seq, {state} FROM {self.table}_snapshots WHERE run_id = $1', run_id)
            return [(int(seq), str(value)) for seq, value in rows]  # pyright: ignore[reportArgumentType]

        return await self._read(read)

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        async def read(conn: PostgresConnection) -> LogSlice:
            view = await self._view(conn)
            if not view.has('message_log'):
                return LogSlice(())
            rows = await conn.fetch(
                f'SELECT log_index, position, message FROM {self.table}_message_log '
                'WHERE run_id = $1 AND log_index < $2::bigint AND position < $3::bigint',
                run_id,
                min(below_index, _BIG),
                min(positions_below, _BIG),
            )
            return LogSlice([LogEntry(int(index), int(position), str(text)) for index, position, text in rows])  # pyright: ignore[reportArgumentType]

        return await self._read(read)

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        t = self.table

        async def page(after: tuple[str, int]) -> list[Sequence[Any]]:
            async def read(conn: PostgresConnection) -> list[Sequence[Any]]:
                if not (await self._view(conn)).has('message_log'):
                    return []
                return list(
                    await conn.fetch(
                        f'SELECT run_id, log_index, message FROM {t}_message_log WHERE (run_id, log_index) > ($1, $2) '
                        f'AND strpos(message, $3) > 0 ORDER BY run_id, log_index LIMIT {_PAGE}',
                        *after,
                        needle,
                    )
                )

            return await self._read(read)

        after = ('', -1)
        while rows := await page(after):
            for run_id, index, text in rows:
                after = (str(run_id), int(index))
                yield str(text)

        async def legacy(conn: PostgresConnection) -> list[str]:
            view = await self._view(conn)
            texts: list[str] = []
            if view.has('snapshots') and 'messages' in view.columns['snapshots']:
                rows = await conn.fetch(f'SELECT messages FROM {t}_snapshots WHERE strpos(messages, $1) > 0', needle)
                texts += [str(row[0]) for row in rows]
            if view.has('messages'):
                rows = await conn.fetch(f'SELECT message FROM {t}_messages WHERE strpos(message, $1) > 0', needle)
                texts += [str(row[0]) for row in rows]
            return texts

        for text in await self._read(legacy):
            yield text

    async def probe(self) -> Probe:
        names = [f'{self.table}_{table}' for table in (*TABLES, *LEGACY_TABLES, 'media', 'media_chunks')]

        async def look(conn: PostgresConnection) -> Probe:
            rows = await conn.fetch(
                'SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c '
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') "
                'AND c.relname = ANY ($1::text[])',
                names,
            )
            found = {str(name): int(size) for name, size in rows}  # pyright: ignore[reportArgumentType]
            if not found:
                return Probe(exists=False, step_store=False, detail=f'no tables with the prefix {self.table!r}')
            size = sum(found.values())
            if f'{self.table}_runs' not in found:
                return Probe(exists=True, step_store=False, size_bytes=size, detail=f'no table {self.table}_runs')
            return Probe(exists=True, step_store=True, size_bytes=size)

        return await self._read(look)

    async def aclose(self) -> None:
        await self.connections.aclose()

    # --- plumbing ---------------------------------------------------------------------------

    async def _read(self, body: Callable[[PostgresConnection], Awaitable[_R]]) -> _R:
        return await self.connections.read(body)

    async def _write(self, body: Callable[[PostgresConnection], Awaitable[_R]]) -> _R:
        async def write(conn: PostgresConnection) -> _R:
            await self._ready_to_write(conn)
            return await body(conn)

        return await self.connections.run(write, replay_safe=True)

    async def _view(self, conn: PostgresConnection) -> Columns:
        """The tables and columns reads may use (two statements): kept once they are this release's
        layout, read again at every read until then, as another process may create or migrate the
        tables at any time (a view kept from before would read an empty store, and its media as
        unreferenced, for good)."""
        columns = self._columns
        if columns is None or not self._migrated:
            columns = await read_columns(conn, self.table)
            check_readable(columns.version)
            self._columns = columns
            self._migrated = columns.version == SCHEMA_VERSION
        return columns

    async def _ready_to_write(self, conn: PostgresConnection) -> None:
        """Migrate on the first write (never on a read), then know the layout for good."""
        if self._migrated:
            return
        if (await self._view(conn)).version != SCHEMA_VERSION:
            await migrate(conn, self.table)
            self._columns = await read_columns(conn, self.table)
        self._migrated = True


def _commit_args(batch: WriteBatch) -> list[object]:
    run = batch.run
    args: list[object] = [run.get(name) for name in RUN_FIELDS] if run is not None else [None] * len(RUN_FIELDS)
    write = batch.snapshot
    if write is not None:
        row = write.row
        args += [
            write.run_id,
            row['step_index'],
            row['conversation_id'],
            row['parent_run_id'],
            row['agent_name'],
            row['timestamp'],
            row['state'],
            write.key,
            row['message_count'],
            write.expected_log_size,
            [position for position, _ in write.appends],
            [text for _, text in write.appends],
        ]
    else:
        args += [None] * 10 + [[], []]
    args += [_json_rows(_latest_per_call(batch.tool_effects)), _json_rows(batch.events)]
    args += [
        [closing.run_id for closing in batch.closings],
        [closing.status for closing in batch.closings],
        [closing.ended_at for closing in batch.closings],
        sorted(batch.run_ids),
    ]
    return args


def _latest_per_call(effects: Sequence[Row]) -> Sequence[Row]:
    """One row per tool call, its last, at the place of its first: as if each had been upserted in turn
    (one `INSERT ... ON CONFLICT DO UPDATE` cannot touch a row twice)."""
    if len(effects) < 2:
        return effects
    latest: dict[tuple[object, object], Row] = {}
    for row in effects:
        latest[row['run_id'], row['tool_call_id']] = row
    return list(latest.values())


def _json_rows(rows: Sequence[Row]) -> str | None:
    """Rows as one JSON array for `json_populate_recordset` (times as ISO 8601 text); `None` for none.

    The text only carries the rows to the server, which parses it: no stored spelling depends on it.
    """
    return to_json(rows).decode() if rows else None


_UNSTORABLE_TEXT = frozenset({'22P05', '22021'})
"""SQLSTATEs of a text PostgreSQL cannot hold: U+0000 in a `jsonb` value, a NUL byte in a `text` one."""


def _unstorable_text(batch: WriteBatch, error: BaseException) -> str:
    return (
        f'PostgreSQL cannot store a text of this write for run {batch.named_runs}: it holds the NUL character '
        f'(U+0000), which PostgreSQL text and jsonb cannot hold ({_server_message(error)}); nothing of the write was '
        'stored. Remove it from the metadata or field that carries it (message texts may hold it: they are JSON)'
    )


def _server_message(error: BaseException) -> str:
    diag = getattr(error, 'diag', None)
    primary = getattr(diag, 'message_primary', None) if diag is not None else getattr(error, 'message', None)
    return primary if isinstance(primary, str) else str(error)
