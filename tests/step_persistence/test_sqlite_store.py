"""`SqliteStepStore` beyond the shared contract: connections, migrations, damaged rows, legacy data."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import threading
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from pydantic_ai_steps._errors import NotAStoreError
from pydantic_ai_steps.media.stores.sqlite import SqliteMediaStore
from pydantic_ai_steps.step_persistence import (
    DatabaseLockedError,
    RunNotFoundError,
    RunRecord,
    SqliteStepStore,
    StepEvent,
    ToolEffectRecord,
    open_step_store,
)
from pydantic_ai_steps.store.backends import _offload as offload_module
from pydantic_ai_steps.store.backends.sqlite import _connection as sqlite_module
from pydantic_ai_steps.store.backends.sqlite._inserts import Insert
from pydantic_ai_steps.testing.step_store import T0, dump

from .builders import history, snap

pytestmark = pytest.mark.anyio


def query(database: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    with sqlite3.connect(database) as conn:
        return conn.execute(sql, params).fetchall()


# --- connections -------------------------------------------------------------------------------


def test_needs_exactly_one_of_database_or_connection(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='exactly one of database='):
        SqliteStepStore()
    conn = sqlite3.connect(tmp_path / 'x.db', check_same_thread=False)
    with pytest.raises(ValueError, match='exactly one of database='):
        SqliteStepStore(database=tmp_path / 'x.db', connection=conn)
    conn.close()


def test_rejects_a_connection_bound_to_its_thread(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / 'x.db')
    with pytest.raises(ValueError, match=r'check_same_thread=False.*worker thread'):
        SqliteStepStore(connection=conn, media_store=None)
    conn.close()


async def test_shared_connection_gets_wal_and_commits_outside_a_caller_transaction(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / 'shared.db', check_same_thread=False)  # Python's default (legacy) isolation
    store = SqliteStepStore(connection=conn, media_store=None)
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    await store.save_snapshot(snap('r', history(1)))
    assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    assert not conn.in_transaction
    # Another connection sees the rows: the store committed its own writes.
    assert query(tmp_path / 'shared.db', 'SELECT run_id FROM runs') == [('r',)]
    assert len(query(tmp_path / 'shared.db', 'SELECT seq FROM snapshots')) == 1
    conn.close()


async def test_a_failed_write_inside_a_caller_transaction_undoes_only_its_own_rows(tmp_path: Path) -> None:
    """The write goes in a savepoint: refused halfway (its run registered, then an event of a run
    the store does not hold), it takes back its own rows and leaves the caller's transaction as it was."""
    conn = sqlite3.connect(tmp_path / 'shared.db', check_same_thread=False, isolation_level=None)
    store = SqliteStepStore(connection=conn, media_store=None)
    await store.register_run(RunRecord(run_id='kept', started_at=T0))
    conn.execute('CREATE TABLE caller (value TEXT)')
    conn.execute('BEGIN')
    conn.execute("INSERT INTO caller VALUES ('mine')")
    with pytest.raises(RunNotFoundError, match='missing'):
        await store.write_records(
            run=RunRecord(run_id='new', started_at=T0),
            events=[StepEvent(run_id='missing', kind='model_request_started', step_index=1, timestamp=T0)],
        )
    assert conn.in_transaction
    assert conn.execute('SELECT run_id FROM runs').fetchall() == [('kept',)]
    await store.append_event(StepEvent(run_id='kept', kind='model_request_started', step_index=1, timestamp=T0))
    conn.execute('ROLLBACK')  # the caller changes its mind: the store's write inside goes with it
    assert conn.execute('SELECT count(*) FROM caller').fetchone() == (0,)
    assert await store.list_events(run_id='kept') == []
    conn.execute('BEGIN')
    conn.execute("INSERT INTO caller VALUES ('mine')")
    await store.append_event(StepEvent(run_id='kept', kind='model_request_started', step_index=2, timestamp=T0))
    conn.execute('COMMIT')
    assert query(tmp_path / 'shared.db', 'SELECT value FROM caller') == [('mine',)]
    assert [event.step_index for event in await store.list_events(run_id='kept')] == [2]
    conn.close()


@pytest.mark.parametrize('store_kind', ['step', 'media'])
async def test_a_write_in_a_caller_transaction_that_read_before_another_commit_says_so(
    tmp_path: Path, store_kind: str
) -> None:
    """SQLite refuses at once to make such a transaction a write (waiting cannot help): the error
    names the database and the remedy, not a bare `database is locked`."""
    path = tmp_path / 'shared.db'
    other = SqliteStepStore(database=path)
    await other.register_run(RunRecord(run_id='a'))
    await other.media_store.put(b'first')
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    step_store = SqliteStepStore(connection=conn, media_store=None)
    media_store = SqliteMediaStore(connection=conn)
    conn.execute('BEGIN')
    assert [run.run_id for run in await step_store.list_runs()] == ['a']  # the transaction has read
    await other.register_run(RunRecord(run_id='b'))  # another connection commits meanwhile
    write = step_store.register_run(RunRecord(run_id='c')) if store_kind == 'step' else media_store.put(b'second')
    with pytest.raises(DatabaseLockedError, match='end it \\(commit or roll back\\) and write again') as caught:
        await write
    assert repr(str(path)) in str(caught.value) and caught.value.sqlite_errorname == 'SQLITE_BUSY_SNAPSHOT'
    conn.execute('ROLLBACK')
    await step_store.register_run(RunRecord(run_id='c'))  # the transaction ended, it writes
    assert [run.run_id for run in await other.list_runs()] == ['a', 'b', 'c']
    conn.close()
    other.close()


async def test_one_connection_serves_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_connect = sqlite3.connect

    def counting_connect(database: object, *args: object, **kwargs: object) -> sqlite3.Connection:
        opened.append(str(database))
        return real_connect(database, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_module.sqlite3, 'connect', counting_connect)
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for step in range(1, 20):
        await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=step))
        await store.save_snapshot(snap('r', history(step), step))
    assert len(await store.list_events(run_id='r')) == 19
    assert opened == [str(tmp_path / 's.db')]
    await store.aclose()
    assert (await store.latest_snapshot(run_id='r')) is not None  # reopens after close
    assert len(opened) == 2
    store.close()


async def test_memory_database_keeps_its_data_between_calls() -> None:
    store = SqliteStepStore(database=':memory:', media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(2)))
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history(2))
    store.close()


@pytest.mark.parametrize(('durable', 'level'), [(False, 1), (True, 2)])
async def test_durable_chooses_the_synchronous_level(tmp_path: Path, durable: bool, level: int) -> None:
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None, durable=durable)
    await store.register_run(RunRecord(run_id='r'))
    conn = store.backend._connection  # type: ignore[attr-defined]  # pyright: ignore
    assert conn is not None
    assert conn.execute('PRAGMA synchronous').fetchone()[0] == level
    assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    store.close()


async def test_reading_a_database_leaves_its_journal_mode_and_the_first_write_switches_it(tmp_path: Path) -> None:
    """Inspecting a database another program keeps in rollback mode (the upstream package's, say)
    changes nothing in it; only a write puts it in WAL mode, which the store's writers rely on."""
    database = tmp_path / 'steps.db'
    async with SqliteStepStore(database=database) as writer:
        await writer.register_run(RunRecord(run_id='r', started_at=T0))
        await writer.save_snapshot(snap('r', history(1)))
    query(database, 'PRAGMA journal_mode=DELETE')
    before = database.read_bytes()
    async with SqliteStepStore(database=database) as reader:
        assert [run.run_id for run in await reader.list_runs()] == ['r']
        latest = await reader.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(history(1))
        assert reader.media_store is not None and not await reader.media_store.exists('media+sha256://' + '0' * 64)
        assert query(database, 'PRAGMA journal_mode') == [('delete',)]
        assert database.read_bytes() == before and not Path(f'{database}-wal').exists()
        await reader.append_event(StepEvent(run_id='r', kind='run_completed', step_index=2))  # on the loop
        assert query(database, 'PRAGMA journal_mode') == [('wal',)]


@pytest.mark.parametrize(('limit', 'waits_ms'), [(10.0, 0), (0.0, 30_000)], ids=['fast disk', 'slow disk'])
async def test_a_durable_store_sets_no_busy_timeout_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: float, waits_ms: int
) -> None:
    """Its calls stay on the loop (timeout 0) or on workers (30 s): no two PRAGMAs a call to switch."""
    monkeypatch.setattr(offload_module.FlushTimer, 'LIMIT', limit)
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None, durable=True)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))  # a slow disk: the first commit measured
    conn = store.backend._connection  # type: ignore[attr-defined]  # pyright: ignore
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    for step in (2, 3, 4):
        await store.save_snapshot(snap('r', history(step), step))
    assert statements and not [text for text in statements if 'busy_timeout' in text]
    assert conn.execute('PRAGMA busy_timeout').fetchone()[0] == waits_ms
    store.close()


async def test_a_write_held_up_past_the_busy_timeout_names_the_database_and_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the write lock all along: the error says where and how long, not a bare `locked`."""
    monkeypatch.setattr(sqlite_module, '_BUSY_TIMEOUT_MS', 200)
    path = tmp_path / 'held.db'
    store = SqliteStepStore(database=path, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute('BEGIN IMMEDIATE')
        with pytest.raises(DatabaseLockedError) as caught:
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        other.execute('ROLLBACK')
    message = str(caught.value)
    assert repr(str(path)) in message and 'the 0.2 s busy timeout' in message and 'another connection' in message
    assert isinstance(caught.value, sqlite3.OperationalError)  # `except sqlite3.OperationalError` still catches it
    assert (
        isinstance(caught.value.__cause__, sqlite3.OperationalError) and caught.value.sqlite_errorname == 'SQLITE_BUSY'
    )
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))  # the lock gone, it writes
    assert len(await store.list_events(run_id='r')) == 1
    store.close()


async def test_a_relative_path_keeps_naming_the_same_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection opens lazily and reopens after `close()`, the checkpoint thread connects anew:
    all of them must reach the file the path named when the store was made."""
    monkeypatch.setattr(sqlite_module, '_CHECKPOINT_EVERY', 2)
    made_in, moved_to = tmp_path / 'made-in', tmp_path / 'moved-to'
    made_in.mkdir()
    moved_to.mkdir()
    monkeypatch.chdir(made_in)
    store = SqliteStepStore(database='runs.db')
    media = SqliteMediaStore(database='media.db')
    await store.register_run(RunRecord(run_id='r0'))
    uri = await media.put(b'blob')
    monkeypatch.chdir(moved_to)
    for index in range(1, 4):  # the second and fourth commits have the WAL checkpointed
        await store.register_run(RunRecord(run_id=f'r{index}'))
    store.close()
    media.close()  # both wait for their checkpoint threads; the next call opens the file again
    assert [run.run_id for run in await store.list_runs()] == ['r0', 'r1', 'r2', 'r3']
    assert await media.get(uri) == b'blob'
    assert list(moved_to.iterdir()) == []
    store.close()
    media.close()


@pytest.mark.parametrize('named_by', ['link', 'uri'])
async def test_a_database_reached_through_a_link_or_a_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_by: str
) -> None:
    """SQLite follows a link to the database and keeps the WAL beside its target: a link to a file not
    made yet gets it made, owner-only, and the store measures the WAL where it is, as for a `file:` URI."""
    monkeypatch.setattr(sqlite_module, 'WAL_LIMIT_BYTES', 0)  # any WAL is too long: the next write truncates it
    (tmp_path / 'real').mkdir()
    real = tmp_path / 'real' / 'runs.db'
    link = tmp_path / 'runs.db'
    link.symlink_to(real)
    database = str(link) if named_by == 'link' else f'file:{real}?cache=private'
    store = SqliteStepStore(database=database, media_store=None)
    backend: Any = store.backend
    await store.register_run(RunRecord(run_id='r'))
    if named_by == 'link':
        assert real.stat().st_mode & 0o777 == 0o600
    written = 0
    while not backend._wal_too_long:  # a checkpoint check finds the WAL beside the link's target
        assert written < 2 * sqlite_module._CHECKPOINT_EVERY  # pyright: ignore[reportPrivateUsage]
        await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=written))
        written += 1
    assert len(await store.list_events(run_id='r')) == written
    store.close()


async def test_reading_a_database_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    """A read finds nothing, and leaves no file (nor folder) behind; once another store creates the
    database, the same store reads what it holds."""
    path = tmp_path / 'not-yet' / 'runs.db'
    reader = SqliteStepStore(database=path)
    assert await reader.list_runs() == []
    assert await reader.get_run(run_id='a') is None
    assert await reader.list_events(run_id='a') == []
    assert await reader.latest_snapshot(run_id='a') is None
    assert not path.parent.exists()
    async with SqliteStepStore(database=path) as writer:
        await writer.register_run(RunRecord(run_id='a'))
        await writer.save_snapshot(snap('a', history(1)))
    assert [run.run_id for run in await reader.list_runs()] == ['a']
    latest = await reader.latest_snapshot(run_id='a')
    assert latest is not None and dump(latest.messages) == dump(history(1))
    await reader.register_run(RunRecord(run_id='b'))
    assert len(await reader.list_runs()) == 2
    reader.close()


async def test_concurrent_calls_from_many_tasks_share_the_connection(tmp_path: Path) -> None:
    import anyio

    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    threads: set[int] = set()

    async def one_run(index: int) -> None:
        run_id = f'run-{index}'
        await store.register_run(RunRecord(run_id=run_id, conversation_id='c'))
        for step in range(1, 6):
            threads.add(threading.get_ident())
            await store.append_event(StepEvent(run_id=run_id, kind='model_request_started', step_index=step))
            await store.save_snapshot(snap(run_id, history(step), step))

    async with anyio.create_task_group() as group:
        for index in range(8):
            group.start_soon(one_run, index)
    assert len(await store.list_runs(conversation_id='c')) == 8
    for index in range(8):
        latest = await store.latest_snapshot(run_id=f'run-{index}')
        assert latest is not None and dump(latest.messages) == dump(history(5))
    store.close()


# --- statements ----------------------------------------------------------------------------------


class BindingConnection(sqlite3.Connection):
    """A connection that keeps every parameter its INSERT statements bind."""

    bound: list[object]

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if sql.startswith('INSERT'):
            self.bound += list(parameters)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        rows = [list(row) for row in seq_of_parameters]
        if sql.startswith('INSERT'):
            self.bound += [value for row in rows for value in row]
        return super().executemany(sql, rows)


async def test_empty_fields_are_written_as_null_not_bound_and_rows_keep_their_order(tmp_path: Path) -> None:
    """A `None` bound as a parameter costs CPython's sqlite3 an adapter lookup that raises and drops
    an error, so inserts spell `NULL` instead; rows whose blanks differ still go in their order."""
    conn = sqlite3.connect(tmp_path / 'nulls.db', factory=BindingConnection, check_same_thread=False)
    conn.bound = []
    store = SqliteStepStore(connection=conn, media_store=None)
    events = [
        StepEvent(run_id='r', kind='model_request_started', step_index=1),
        StepEvent(run_id='r', kind='model_request_completed', step_index=1),
        StepEvent(run_id='r', kind='tool_call_started', step_index=1, tool_call_id='c', tool_name='t', tool_args='{}'),
        StepEvent(run_id='r', kind='tool_call_failed', step_index=1, tool_call_id='c', tool_name='t', error='boom'),
        StepEvent(run_id='r', kind='model_request_started', step_index=2),
    ]
    started = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status='started', started_at=T0)
    await store.write_records(run=RunRecord(run_id='r', started_at=T0), tool_effects=[started], events=events)
    failed = ToolEffectRecord(
        run_id='r', tool_call_id='c', tool_name='t', status='failed', started_at=T0, ended_at=T0, effect_summary='boom'
    )
    await store.write_records(snapshot=snap('r', history(1)), tool_effects=[failed])
    assert conn.bound and None not in conn.bound
    planned = ToolEffectRecord(
        run_id='r', tool_call_id='d', tool_name='t', status='started', started_at=T0, effect_summary='planned'
    )
    await store.write_records(tool_effects=[planned])
    await store.write_records(tool_effects=[replace(planned, effect_summary=None)])  # a stored value upserted to NULL
    stored = await store.list_events(run_id='r')
    assert [(event.kind, event.tool_call_id, event.error) for event in stored] == [
        (event.kind, event.tool_call_id, event.error) for event in events
    ]
    effects = await store.list_tool_effects(run_id='r')
    assert [(effect.status, effect.effect_summary, effect.resolution) for effect in effects] == [
        ('failed', 'boom', None),
        ('started', None, None),
    ]
    first = 'SELECT typeof(parent_run_id), typeof(error) FROM events ORDER BY seq LIMIT 1'
    assert query(tmp_path / 'nulls.db', first) == [('null', 'null')]
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.parent_run_id is None and dump(latest.messages) == dump(history(1))
    store.close()
    conn.close()


def test_an_insert_refuses_a_row_of_another_width_and_writes_every_pattern_of_nulls() -> None:
    conn = sqlite3.connect(':memory:')
    conn.execute('CREATE TABLE t (c0, c1, c2, c3, c4, c5, c6, c7)')
    insert = Insert('t', [f'c{index}' for index in range(8)])
    with pytest.raises(sqlite3.ProgrammingError, match='3 values given for the 8 columns of an insert into t'):
        insert.execute(conn, (1, 2, 3))
    with pytest.raises(sqlite3.ProgrammingError, match='9 values given'):
        insert.executemany(conn, [tuple(range(9))])
    rows = [tuple(None if pattern >> index & 1 else index for index in range(8)) for pattern in range(256)]
    insert.executemany(conn, rows)  # more patterns than an insert keeps statements for
    insert.execute(conn, rows[5])
    assert conn.execute('SELECT * FROM t ORDER BY rowid').fetchall() == [*rows, rows[5]]
    conn.close()


# --- schema versions and older layouts ---------------------------------------------------------


OLD_SCHEMA = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, conversation_id TEXT, parent_run_id TEXT, agent_name TEXT,
                   metadata TEXT NOT NULL, started_at TEXT NOT NULL);
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, kind TEXT NOT NULL,
                     step_index INTEGER NOT NULL, timestamp TEXT NOT NULL, conversation_id TEXT, parent_run_id TEXT,
                     agent_name TEXT, tool_call_id TEXT, tool_name TEXT, error TEXT, metadata TEXT NOT NULL);
CREATE TABLE snapshots (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, step_index INTEGER NOT NULL,
                        conversation_id TEXT, parent_run_id TEXT, agent_name TEXT, timestamp TEXT NOT NULL,
                        messages TEXT NOT NULL);
CREATE TABLE tool_effects (run_id TEXT NOT NULL, tool_call_id TEXT NOT NULL, tool_name TEXT NOT NULL,
                           status TEXT NOT NULL, started_at TEXT NOT NULL, ended_at TEXT, idempotency_key TEXT,
                           effect_summary TEXT, PRIMARY KEY (run_id, tool_call_id));
"""


def make_old_database(path: Path) -> None:
    """A database as a release from before snapshot states wrote it: no `state` column."""
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute(
            'INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)', ('old', 'conv', None, 'lib', '{"k": "v"}', T0.isoformat())
        )
        conn.execute(
            'INSERT INTO events (run_id, kind, step_index, timestamp, metadata) VALUES (?, ?, ?, ?, ?)',
            ('old', 'run_started', 0, T0.isoformat(), '{}'),
        )
        for step in (1, 2):
            conn.execute(
                'INSERT INTO snapshots (run_id, step_index, timestamp, messages) VALUES (?, ?, ?, ?)',
                ('old', step, T0.isoformat(), ModelMessagesTypeAdapter.dump_json(history(step)).decode()),
            )


async def test_old_database_gains_the_state_column_and_old_rows_read_complete(tmp_path: Path) -> None:
    database = tmp_path / 'old.db'
    make_old_database(database)
    store = SqliteStepStore(database=database, media_store=None)
    assert await store.get_run(run_id='old') == RunRecord(
        run_id='old', conversation_id='conv', agent_name='lib', metadata={'k': 'v'}, started_at=T0
    )
    assert [e.kind for e in await store.list_events(run_id='old')] == ['run_started']
    latest = await store.latest_snapshot(run_id='old')
    assert latest is not None and latest.state == 'complete' and latest.step_index == 2
    assert dump(latest.messages) == dump(history(2))
    # Reading changed nothing: a database is migrated by its first write, never by a read.
    columns = {row[1] for row in query(database, 'PRAGMA table_info(snapshots)')}
    assert 'state' not in columns
    assert ('schema_version',) not in query(database, "SELECT name FROM sqlite_master WHERE type = 'table'")
    # The first write migrates; the migrated database takes new writes, message-once, after the old rows.
    await store.save_snapshot(snap('old', history(3), 3, state='interrupted', idempotency_key='k3'))
    columns = {row[1] for row in query(database, 'PRAGMA table_info(snapshots)')}
    assert {'state', 'idempotency_key', 'message_count', 'log_size'} <= columns
    assert query(database, 'SELECT state FROM snapshots WHERE seq <= 2 ORDER BY seq') == [('complete',), ('complete',)]
    assert query(database, 'SELECT MAX(version) FROM schema_version') == [(sqlite_module.SCHEMA_VERSION,)]
    await store.save_snapshot(snap('old', history(3), 4, idempotency_key='k3'))  # replay: dropped
    newest = await store.latest_snapshot(run_id='old', include_interrupted=True)
    assert newest is not None and newest.state == 'interrupted' and dump(newest.messages) == dump(history(3))
    assert [s.step_index for s in await store.list_snapshots(run_id='old', include_interrupted=True)] == [1, 2, 3]
    store.close()
    # Opening again does not migrate again.
    reopened = SqliteStepStore(database=database, media_store=None)
    assert len(await reopened.list_snapshots(run_id='old', include_interrupted=True)) == 3
    assert query(database, 'SELECT COUNT(*) FROM schema_version') == [(sqlite_module.SCHEMA_VERSION,)]
    reopened.close()


async def test_reads_the_upstream_deduplicated_layout(tmp_path: Path) -> None:
    """Rows of the upstream package: `{"stored_messages": N}` plus its message and reference tables."""
    database = tmp_path / 'upstream.db'
    with sqlite3.connect(database) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.executescript(
            """
            ALTER TABLE snapshots ADD COLUMN state TEXT NOT NULL DEFAULT 'complete';
            ALTER TABLE snapshots ADD COLUMN idempotency_key TEXT;
            CREATE TABLE snapshot_idempotency_keys (run_id TEXT NOT NULL, idempotency_key TEXT NOT NULL,
                                                    PRIMARY KEY (run_id, idempotency_key));
            CREATE TABLE snapshot_messages (sha256 TEXT PRIMARY KEY, message TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE snapshot_message_refs (snapshot_seq INTEGER NOT NULL, position INTEGER NOT NULL,
                                                sha256 TEXT NOT NULL, PRIMARY KEY (snapshot_seq, position))
                                                WITHOUT ROWID;
            CREATE TRIGGER snapshots_idempotency_ignore BEFORE INSERT ON snapshots
              WHEN NEW.idempotency_key IS NOT NULL AND EXISTS (SELECT 1 FROM snapshot_idempotency_keys
                WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key)
              BEGIN SELECT RAISE(IGNORE); END;
            """
        )
        texts = [
            json.dumps(item, separators=(',', ':'))
            for item in json.loads(ModelMessagesTypeAdapter.dump_json(history(1)))
        ]
        conn.execute(
            'INSERT INTO snapshots (run_id, step_index, timestamp, messages, idempotency_key) VALUES (?, ?, ?, ?, ?)',
            ('up', 1, T0.isoformat(), json.dumps({'stored_messages': len(texts)}), '0:1:complete'),
        )
        for position, text in enumerate(texts):
            digest = f'{position:064x}'
            conn.execute('INSERT INTO snapshot_messages VALUES (?, ?)', (digest, text))
            conn.execute('INSERT INTO snapshot_message_refs VALUES (?, ?, ?)', (1, position, digest))
        conn.execute("INSERT INTO snapshot_idempotency_keys VALUES ('up', '0:1:complete')")
        conn.execute('INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)', ('up', None, None, None, '{}', T0.isoformat()))
    store = SqliteStepStore(database=database, media_store=None)
    latest = await store.latest_snapshot(run_id='up')
    assert latest is not None and dump(latest.messages) == dump(history(1))
    await store.save_snapshot(snap('up', history(2), 2, idempotency_key='0:1:complete'))  # an upstream key
    await store.save_snapshot(snap('up', history(2), 2, idempotency_key='1:2:complete'))
    assert [s.step_index for s in await store.list_snapshots(run_id='up')] == [1, 2]
    # What the upstream package relies on stays in place, so an upstream process can keep writing.
    triggers = query(database, "SELECT name FROM sqlite_master WHERE type = 'trigger'")
    assert ('snapshots_idempotency_ignore',) in triggers
    assert query(database, "SELECT idempotency_key FROM snapshot_idempotency_keys WHERE run_id = 'up' ORDER BY 1") == [
        ('0:1:complete',),
        ('1:2:complete',),
    ]
    store.close()


def indexes(database: Path, table: str) -> set[str]:
    rows = query(
        database, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", table
    )
    return {str(name) for (name,) in rows}


async def test_version_2_database_keeps_its_rows_with_fewer_indexes(tmp_path: Path) -> None:
    """Version 3 writes one index of `events` (its keys, NULL keys included) and one of `snapshots`."""
    database = tmp_path / 'v2.db'
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for index in range(12):  # keys that sort apart from the order the events were written in
        await store.append_event(
            StepEvent(run_id='r', kind='model_request_started', step_index=index, idempotency_key=str(index))
        )
    await store.append_event(StepEvent(run_id='r', kind='model_request_completed', step_index=12))
    await store.save_snapshot(snap('r', history(1), 1, state='interrupted'))
    await store.save_snapshot(snap('r', history(2), 2))
    # A run's events keep their order when the newest events of another run are deleted and their
    # numbers come back: events are numbered by rowid, which no insert reads from `sqlite_sequence`.
    await store.register_run(RunRecord(run_id='gone'))
    await store.append_event(StepEvent(run_id='gone', kind='run_started', step_index=0))
    assert await store.delete_run(run_id='gone')
    assert query(database, 'SELECT name FROM sqlite_sequence') == [('snapshots',)]
    store.close()
    with sqlite3.connect(database) as conn:  # the indexes version 2 had, and its version
        conn.execute('DROP INDEX idx_events_run_keys')
        conn.execute('CREATE INDEX idx_events_run_seq ON events(run_id, seq)')
        conn.execute(
            'CREATE UNIQUE INDEX idx_events_run_key ON events(run_id, idempotency_key) '
            'WHERE idempotency_key IS NOT NULL'
        )
        conn.execute('CREATE INDEX idx_snapshots_run_state_seq ON snapshots(run_id, state, seq)')
        conn.execute('DELETE FROM schema_version WHERE version = 3')
    reopened = SqliteStepStore(database=database, media_store=None)
    await reopened.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=0, idempotency_key='0'))
    await reopened.append_event(StepEvent(run_id='r', kind='run_completed', step_index=13, idempotency_key='13'))
    assert indexes(database, 'events') == {'idx_events_run_keys'}
    assert indexes(database, 'snapshots') == {'idx_snapshots_run_seq'}
    assert query(database, 'SELECT MAX(version) FROM schema_version') == [(3,)]
    events = await reopened.list_events(run_id='r')
    assert [event.step_index for event in events] == list(range(14))  # in the order written; the replay dropped
    await reopened.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=14))
    await reopened.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=15))
    assert [event.step_index for event in await reopened.list_events(run_id='r')][-2:] == [14, 15]  # no key, both kept
    for other in ('a', 'b'):
        await reopened.register_run(RunRecord(run_id=other))
        for index in range(16):
            await reopened.append_event(StepEvent(run_id=other, kind='model_request_started', step_index=index))
    reopened.close()
    # The reads of a run's events and snapshots search an index, also once statistics show each run
    # holding a third of the rows (where walking the whole table in `seq` order would spare the sort).
    async with reads_searching_an_index(database, least=3) as traced:
        await traced.list_events(run_id='r')
        latest = await traced.latest_snapshot(run_id='r')
        assert latest is not None and latest.step_index == 2 and dump(latest.messages) == dump(history(2))
        newest = await traced.latest_snapshot(run_id='r', include_interrupted=True)
        assert newest is not None and newest.step_index == 2


@contextlib.asynccontextmanager
async def reads_searching_an_index(database: Path, *, least: int) -> AsyncGenerator[SqliteStepStore]:
    """A store over `database` once `ANALYZE` has run: the block's reads of events and snapshots (at
    least `least` of them) must each search an index by run."""
    with sqlite3.connect(database) as conn:
        conn.execute('ANALYZE')
    statements: list[str] = []
    connection = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
    connection.set_trace_callback(statements.append)
    traced = SqliteStepStore(connection=connection, media_store=None)
    try:
        yield traced
        reads = [
            text
            for text in statements
            if text.startswith('SELECT') and ('FROM events' in text or 'FROM snapshots' in text)
        ]
        assert len(reads) >= least
        for text in reads:
            plan = [str(row[-1]) for row in connection.execute(f'EXPLAIN QUERY PLAN {text}')]
            assert plan[0].startswith('SEARCH') and '(run_id=?' in plan[0], (text, plan)
    finally:
        traced.close()
        connection.close()


UPSTREAM_INDEXES = """
ALTER TABLE events ADD COLUMN idempotency_key TEXT;
CREATE INDEX idx_events_run ON events(run_id, seq);
CREATE INDEX idx_snapshots_run ON snapshots(run_id, seq);
CREATE UNIQUE INDEX idx_events_idempotency ON events(run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
"""
"""The indexes the upstream package creates on the tables a step writes to."""


UPSTREAM = {'idx_events_run', 'idx_events_idempotency', 'idx_snapshots_run'}


@pytest.mark.parametrize(
    ('changes', 'expected'),
    [
        ('', UPSTREAM),  # the upstream package's own: the event insert names its partial key
        (  # a unique key compared case-blind does not hold our keys unique
            'DROP INDEX idx_events_idempotency; '
            'CREATE UNIQUE INDEX events_keys_nocase ON events(run_id, idempotency_key COLLATE NOCASE);',
            {'idx_events_run', 'events_keys_nocase', 'idx_snapshots_run', 'idx_events_run_keys'},
        ),
        (  # a partial key no ON CONFLICT target can name, whatever its text says in a comment
            'DROP INDEX idx_events_idempotency; '
            "CREATE UNIQUE INDEX events_started_keys ON events(run_id, idempotency_key) WHERE kind = 'run_started' "
            '-- where idempotency_key is not null\n;',
            {'idx_events_run', 'events_started_keys', 'idx_snapshots_run', 'idx_events_run_keys'},
        ),
        (  # an index of some snapshots only does not find a run's
            'DROP INDEX idx_snapshots_run; CREATE INDEX snapshots_later ON snapshots(run_id, seq) WHERE step_index > 0',
            {'idx_events_run', 'idx_events_idempotency', 'snapshots_later', 'idx_snapshots_run_seq'},
        ),
        (  # the key alone does not find a run's events (it leaves unkeyed ones out)
            'DROP INDEX idx_events_run; DROP INDEX idx_snapshots_run;',
            {'idx_events_idempotency', 'idx_events_run_keys', 'idx_snapshots_run_seq'},
        ),
    ],
)
async def test_upstream_database_writes_through_its_own_indexes(
    tmp_path: Path, changes: str, expected: set[str]
) -> None:
    """A database the upstream package created keeps its indexes (an upstream process writes through
    them), and gets ours only where its own do not do their work."""
    database = tmp_path / 'upstream.db'
    with sqlite3.connect(database) as conn:
        conn.executescript(OLD_SCHEMA + UPSTREAM_INDEXES + changes)
    await _write_and_read_through_an_index(database, expected)


async def test_upstream_database_migrated_to_version_2_loses_our_indexes_beside_its_own(tmp_path: Path) -> None:
    """An upstream database an earlier release of ours brought to version 2 (with that version's
    indexes) ends with the upstream package's three."""
    database = tmp_path / 'upstream.db'
    with sqlite3.connect(database) as conn:
        conn.executescript(OLD_SCHEMA + UPSTREAM_INDEXES)
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='first'))
    store.close()
    with sqlite3.connect(database) as conn:  # as version 2 left it
        conn.executescript(
            """
            CREATE INDEX idx_events_run_seq ON events(run_id, seq);
            CREATE UNIQUE INDEX idx_events_run_key ON events(run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
            CREATE INDEX idx_snapshots_run_state_seq ON snapshots(run_id, state, seq);
            CREATE INDEX idx_snapshots_run_seq ON snapshots(run_id, seq);
            CREATE UNIQUE INDEX idx_events_run_keys ON events(run_id, idempotency_key);
            DELETE FROM schema_version WHERE version = 3;
            """
        )
    await _write_and_read_through_an_index(database, UPSTREAM)


async def _write_and_read_through_an_index(database: Path, expected: set[str]) -> None:
    """Write a run through our store; the database then has the `expected` indexes on `events` and
    `snapshots`, a replayed key is dropped and unkeyed events kept, and a run's reads search an
    index, also once statistics exist."""
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for index in range(6):
        await store.append_event(
            StepEvent(run_id='r', kind='model_request_started', step_index=index, idempotency_key=str(5 - index))
        )
    await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=9, idempotency_key='2'))
    await store.append_event(StepEvent(run_id='r', kind='model_request_completed', step_index=6))
    await store.append_event(StepEvent(run_id='r', kind='model_request_completed', step_index=7))
    await store.save_snapshot(snap('r', history(1), 1))
    await store.save_snapshot(snap('r', history(2), 2, state='interrupted'))
    for other in ('a', 'b'):
        await store.register_run(RunRecord(run_id=other))
        for index in range(8):
            await store.append_event(StepEvent(run_id=other, kind='model_request_started', step_index=index))
    assert indexes(database, 'events') | indexes(database, 'snapshots') == expected
    assert query(database, 'SELECT MAX(version) FROM schema_version') == [(3,)]
    events = await store.list_events(run_id='r')
    assert [event.step_index for event in events] == list(range(8))  # the replayed key dropped, unkeyed ones kept
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(history(1))
    store.close()
    async with reads_searching_an_index(database, least=2) as traced:
        assert len(await traced.list_events(run_id='r')) == 8
        assert await traced.latest_snapshot(run_id='r', include_interrupted=True) is not None


async def test_a_database_shared_with_tables_of_any_name_is_read_and_written(tmp_path: Path) -> None:
    """Another application's tables beside the store's, named as SQL needs quoting for."""
    database = tmp_path / 'shared.db'
    with contextlib.closing(sqlite3.connect(database)) as conn, conn:
        conn.execute('CREATE TABLE "order items" (id INTEGER)')
        conn.execute('CREATE TABLE "it""s" (id INTEGER)')
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    assert [run.run_id for run in await store.list_runs()] == ['r']
    store.close()


FOREIGN_LAYOUTS = {
    'runs table': (
        'CREATE TABLE runs (id INTEGER, name TEXT)',
        'its runs table has no column(s) metadata, run_id, started_at',
    ),
    'version table': (
        'CREATE TABLE schema_version (version INTEGER, name TEXT)',
        'it has a schema_version table but no runs table',
    ),
}


@pytest.mark.parametrize('layout', FOREIGN_LAYOUTS)
@pytest.mark.parametrize('opened', ['database=', 'url', 'connection='])
async def test_another_applications_database_is_refused_before_anything_in_it_changes(
    tmp_path: Path, layout: str, opened: str
) -> None:
    database = tmp_path / 'app.db'
    create, problem = FOREIGN_LAYOUTS[layout]
    table = create.split()[2]
    with contextlib.closing(sqlite3.connect(database)) as conn, conn:
        conn.execute(create)
        conn.executemany(f'INSERT INTO {table} VALUES (?, ?)', [(1, 'nightly'), (2, 'weekly')])
    before = database.read_bytes()
    shared = sqlite3.connect(database, check_same_thread=False)
    if opened == 'database=':
        store: Any = SqliteStepStore(database=database)
    elif opened == 'url':
        store = open_step_store(f'sqlite:///{database}')
    else:
        store = SqliteStepStore(connection=shared)
    expected = re.escape(f"SQLite database '{database}' holds tables that are not a step store's ({problem}")
    with pytest.raises(NotAStoreError, match=expected) as caught:  # its payload goes to the media store first
        await store.save_snapshot(snap('r', history(1, 'x' * 70_000), 1))
    assert isinstance(caught.value, ValueError)
    with pytest.raises(NotAStoreError, match=expected):
        await store.register_run(RunRecord(run_id='r'))
    with pytest.raises(NotAStoreError, match=expected):
        await store.list_runs()
    await store.aclose()
    shared.close()
    assert query(database, 'PRAGMA journal_mode') == [('delete',)]
    assert query(database, f'SELECT * FROM {table}') == [(1, 'nightly'), (2, 'weekly')]
    assert database.read_bytes() == before


async def test_refuses_a_database_from_a_newer_release(tmp_path: Path) -> None:
    database = tmp_path / 'new.db'
    with sqlite3.connect(database) as conn:
        conn.execute('CREATE TABLE schema_version (version INTEGER NOT NULL)')
        conn.execute('INSERT INTO schema_version VALUES (99)')
    store = SqliteStepStore(database=database, media_store=None)
    with pytest.raises(RuntimeError, match='schema version 99 is newer'):
        await store.get_run(run_id='r')
    store.close()


# --- damaged rows ------------------------------------------------------------------------------


async def test_damaged_snapshot_rows_fall_back_to_the_newest_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for step in (1, 2, 3, 4):
        await store.save_snapshot(snap('r', history(step), step))
    store.close()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE snapshots SET state = 'sideways' WHERE step_index = 4")
        conn.execute("UPDATE snapshots SET message_count = NULL, log_size = NULL, messages = '[{' WHERE step_index = 3")
        conn.execute('UPDATE messages SET message = \'{"parts": 7}\' WHERE log_index = 4')  # read by steps 2 to 4
    reader = SqliteStepStore(database=database, media_store=None)
    with caplog.at_level(logging.WARNING):
        latest = await reader.latest_snapshot(run_id='r', include_interrupted=True)
        snapshots = await reader.list_snapshots(run_id='r', include_interrupted=True)
    assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(history(1))
    assert [s.step_index for s in snapshots] == [1]
    assert 'skipping unreadable snapshot' in caplog.text
    reader.close()


async def test_retention_keeps_a_snapshot_whose_state_it_cannot_read_and_goes_on(tmp_path: Path) -> None:
    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for step in (1, 2):
        await store.save_snapshot(snap('r', history(step), step))
    store.close()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE snapshots SET state = 'sideways' WHERE step_index = 1")
    store = SqliteStepStore(database=database, media_store=None, max_snapshots_per_run=1)
    for step in (3, 4):
        await store.save_snapshot(snap('r', history(step), step))  # retention runs after each
    with sqlite3.connect(database) as conn:
        steps = [row[0] for row in conn.execute("SELECT step_index FROM snapshots WHERE run_id = 'r' ORDER BY seq")]
    assert steps == [1, 4]  # the unreadable one stays; the rule keeps the newest of the rest
    store.close()


async def test_snapshot_with_missing_log_rows_is_skipped(tmp_path: Path) -> None:
    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    await store.save_snapshot(snap('r', history(2), 2))
    with sqlite3.connect(database) as conn:
        conn.execute('DELETE FROM messages WHERE log_index = 5')
    latest = await SqliteStepStore(database=database, media_store=None).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1
    # The writer notices the log changed under it and writes the next history in full.
    await store.save_snapshot(snap('r', history(3), 3))
    latest = await SqliteStepStore(database=database, media_store=None).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 3 and dump(latest.messages) == dump(history(3))
    store.close()


async def test_damaged_run_event_and_effect_rows_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    for name in ('good', 'bad'):
        await store.register_run(RunRecord(run_id=name, conversation_id='c', started_at=T0))
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=T0))
        await store.record_tool_effect(
            ToolEffectRecord(tool_call_id=name, tool_name='t', run_id='r', status='started', started_at=T0)
        )
    store.close()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE runs SET metadata = '{not json' WHERE run_id = 'bad'")
        conn.execute("UPDATE events SET kind = 'exploded' WHERE seq = 2")
        conn.execute("UPDATE tool_effects SET started_at = 'yesterday' WHERE tool_call_id = 'bad'")
    reader = SqliteStepStore(database=database, media_store=None)
    with caplog.at_level(logging.WARNING):
        assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['good']
        assert await reader.get_run(run_id='bad') is None
        assert len(await reader.list_events(run_id='r')) == 1
        assert [r.tool_call_id for r in await reader.list_unresolved_tool_effects(run_id='r')] == ['good']
        assert await reader.get_tool_effect(run_id='r', tool_call_id='bad') is None
    assert caplog.text.count('skipping unreadable') >= 5
    reader.close()


async def test_unreadable_run_records_are_listed_apart(tmp_path: Path) -> None:
    """What `list_runs` skips, `list_unreadable_runs` names: a caller deleting "every run" can tell."""
    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    for name in ('good', 'bad'):
        await store.register_run(RunRecord(run_id=name, started_at=T0))
    assert await store.list_unreadable_runs() == []
    store.close()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE runs SET metadata = 'not json{' WHERE run_id = 'bad'")
    reader = SqliteStepStore(database=database, media_store=None)
    assert [run.run_id for run in await reader.list_runs()] == ['good']
    (unreadable,) = await reader.list_unreadable_runs()
    assert unreadable.startswith("run 'bad': run record metadata is not valid JSON")
    reader.close()


# --- two writers of one run --------------------------------------------------------------------


async def test_two_stores_writing_one_run_stay_exact(tmp_path: Path) -> None:
    first = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    second = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    await first.register_run(RunRecord(run_id='r'))
    expected: list[bytes] = []
    for step in range(1, 7):
        writer = first if step % 3 else second
        messages = history(step)[3:] if step == 4 else history(step)
        await writer.save_snapshot(snap('r', messages, step))
        expected.append(dump(messages))
    for reader in (first, second):
        assert [dump(s.messages) for s in await reader.list_snapshots(run_id='r')] == expected
        reader.close()


@pytest.mark.parametrize('where', ['file', 'memory'])
async def test_shared_connection_with_media_under_concurrent_runs(tmp_path: Path, where: str) -> None:
    """Large payloads go to the `media` table of the same database while several runs write at once."""
    import anyio
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    target = str(tmp_path / 'shared.db') if where == 'file' else ':memory:'
    conn = sqlite3.connect(target, check_same_thread=False)
    store = SqliteStepStore(connection=conn)

    def big(run: int, step: int) -> list:  # type: ignore[type-arg]
        prompt = f'run {run} step {step} ' + 'z' * 70_000
        return [*history(step), ModelRequest(parts=[UserPromptPart(prompt, timestamp=T0)], timestamp=T0)]

    async def one_run(run: int) -> None:
        await store.register_run(RunRecord(run_id=f'r{run}'))
        for step in range(1, 5):
            await store.save_snapshot(snap(f'r{run}', big(run, step), step))

    async with anyio.create_task_group() as group:
        for run in range(6):
            group.start_soon(one_run, run)
    for run in range(6):
        latest = await store.latest_snapshot(run_id=f'r{run}')
        assert latest is not None and dump(latest.messages) == dump(big(run, 4))
    assert conn.execute('SELECT COUNT(*) FROM media').fetchone()[0] == 24
    assert not conn.in_transaction
    store.close()
    conn.close()


# --- disk that comes back -------------------------------------------------------------------------


async def test_deleting_half_the_runs_gives_their_space_back(tmp_path: Path) -> None:
    import os

    database = tmp_path / 's.db'
    store = SqliteStepStore(database=database, media_store=None)
    for index in range(60):
        await store.register_run(RunRecord(run_id=f'r{index}'))
        for step in range(1, 6):
            await store.save_snapshot(snap(f'r{index}', history(step, payload='x' * 3000), step))
    await store.aclose()

    def size() -> int:
        return sum(os.path.getsize(path) for path in tmp_path.iterdir() if not path.name.endswith('-shm'))

    before = size()
    assert query(database, 'PRAGMA auto_vacuum') == [(2,)]  # incremental, chosen when the file was made
    reopened = SqliteStepStore(database=database, media_store=None)
    for index in range(30):
        await reopened.delete_run(f'r{index}')
    await reopened.aclose()
    assert size() <= 0.6 * before
    assert query(database, 'PRAGMA freelist_count') == [(0,)]


def test_times_encode_as_their_own_utc_text_when_objects_are_reused_and_their_ids_are_recycled() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from pydantic_ai_steps.store.codec import TEXT

    paris = timezone(timedelta(hours=1))
    kept = datetime(2026, 1, 1, 12, tzinfo=paris)
    for second in range(200):  # each time freed at once: later ones often get its id
        moment = datetime(2026, 1, 1, 0, 0, second % 60, second, tzinfo=UTC if second % 2 else paris)
        assert TEXT.time(moment) == moment.astimezone(UTC).isoformat()
        assert TEXT.time(kept) == '2026-01-01T11:00:00+00:00'
    assert TEXT.time(datetime(2026, 1, 1)) == '2026-01-01T00:00:00'  # naive: as given
