"""`SqliteMediaStore` specifics: constructor checks, schema, WAL, transactions, shared connections."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.media import MediaContext, MediaIntegrityError, SqliteMediaStore, media_uri_for
from pydantic_ai_steps.media.stores import _sqlite_connection as sqlite_connection_module
from pydantic_ai_steps.step_persistence import DatabaseLockedError, RunRecord, SqliteStepStore

pytestmark = pytest.mark.anyio


def test_exactly_one_of_database_or_connection(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='exactly one of database='):
        SqliteMediaStore()
    connection = sqlite3.connect(':memory:', check_same_thread=False)
    with pytest.raises(ValueError, match='exactly one of database='):
        SqliteMediaStore(database=tmp_path / 'x.db', connection=connection)
    connection.close()


@pytest.mark.parametrize('table', ['', '1media', 'media; DROP TABLE x', 'me-dia', 'mé'])
def test_table_name_is_validated(tmp_path: Path, table: str) -> None:
    with pytest.raises(ValueError, match='invalid table name'):
        SqliteMediaStore(database=tmp_path / 'x.db', table=table)


def test_connection_must_allow_other_threads(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'x.db')
    with pytest.raises(ValueError, match='check_same_thread=False') as caught:
        SqliteMediaStore(connection=connection)
    assert 'worker thread' in str(caught.value)
    connection.close()


def test_connection_owned_by_another_live_thread_is_rejected_too(tmp_path: Path) -> None:
    holder: list[sqlite3.Connection] = []
    opened, release = threading.Event(), threading.Event()

    def owner() -> None:
        holder.append(sqlite3.connect(tmp_path / 'x.db'))
        opened.set()
        release.wait()

    thread = threading.Thread(target=owner)
    thread.start()
    opened.wait()
    try:
        with pytest.raises(ValueError, match='check_same_thread=False'):
            SqliteMediaStore(connection=holder[0])
    finally:
        release.set()
        thread.join()


async def test_database_mode_layout_wal_and_columns(tmp_path: Path) -> None:
    path = tmp_path / 'sub' / 'media.db'
    store = SqliteMediaStore(database=path)
    uri = await store.put(b'png', context=MediaContext(media_type='image/png', metadata={'k': 'v'}))
    store.close()
    with sqlite3.connect(path) as check:
        assert check.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
        row = check.execute('SELECT sha256, media_type, bytes, size_bytes, metadata FROM media').fetchone()
    assert row[0] == uri.removeprefix('media+sha256://')
    assert row[1:4] == ('image/png', b'png', 3)
    assert row[4] == '{"k":"v"}'
    reopened = SqliteMediaStore(database=path)  # closed stores reopen; data persisted
    assert await reopened.get(uri) == b'png'
    await reopened.aclose()


async def test_a_put_held_up_past_the_busy_timeout_names_the_database_and_the_wait(tmp_path: Path) -> None:
    path = tmp_path / 'held.db'
    connection = sqlite3.connect(path, timeout=0.2, check_same_thread=False)
    store = SqliteMediaStore(connection=connection)
    await store.put(b'first')
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute('BEGIN IMMEDIATE')
        with pytest.raises(DatabaseLockedError) as caught:
            await store.put(b'second')
        other.execute('ROLLBACK')
    message = str(caught.value)
    assert repr(str(path)) in message and 'the 0.2 s busy timeout' in message and 'another connection' in message
    assert isinstance(caught.value, sqlite3.OperationalError)
    assert await store.put(b'second') == media_uri_for(b'second')
    connection.close()


async def test_a_lock_held_while_the_store_opens_its_database_names_the_database_and_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The own connection is opened by the first call: a write lock held across that open is the same
    named error, not a failed assertion about a connection that is not there yet."""
    monkeypatch.setattr(sqlite_connection_module, 'BUSY_TIMEOUT_MS', 200)
    path = tmp_path / 'held.db'
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute('CREATE TABLE unrelated (x)')  # an existing file, so the open reads it
        other.execute('BEGIN EXCLUSIVE')
        store = SqliteMediaStore(database=path)
        for call in (lambda: store.exists(media_uri_for(b'x')), lambda: store.put(b'x')):
            with pytest.raises(DatabaseLockedError, match=r'the 0\.2 s busy timeout'):
                await call()
        other.execute('ROLLBACK')
    assert await store.put(b'x') == media_uri_for(b'x')
    store.close()


async def test_first_put_fixes_media_type_and_metadata(tmp_path: Path) -> None:
    store = SqliteMediaStore(database=tmp_path / 'm.db')
    uri = await store.put(b'x', context=MediaContext(media_type='image/png', metadata={'a': '1'}))
    await store.put(b'x', context=MediaContext(media_type='image/gif', metadata={'a': '2'}))
    assert await store.get_metadata(uri) == {'a': '1'}
    store.close()


async def test_caller_transaction_decides_when_the_row_lands(tmp_path: Path) -> None:
    path = tmp_path / 'tx.db'
    connection = sqlite3.connect(path, check_same_thread=False)
    store = SqliteMediaStore(connection=connection)
    await store.put(b'warm-up')  # creates the table outside any transaction
    connection.execute('BEGIN')
    uri = await store.put(b'inside a transaction')
    assert connection.in_transaction
    with sqlite3.connect(path) as other:
        assert other.execute('SELECT count(*) FROM media').fetchone()[0] == 1
    connection.rollback()
    assert await store.exists(uri) is False
    uri = await store.put(b'autocommitted')
    with sqlite3.connect(path) as other:
        assert other.execute('SELECT count(*) FROM media').fetchone()[0] == 2
    assert await store.exists(uri)
    connection.close()


async def test_older_table_without_metadata_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / 'old.db'
    with sqlite3.connect(path) as old:
        old.execute('CREATE TABLE media (sha256 TEXT PRIMARY KEY, bytes BLOB NOT NULL, size_bytes INTEGER NOT NULL)')
        old.execute('INSERT INTO media VALUES (?, ?, ?)', (media_uri_for(b'old')[-64:], b'old', 3))
    old.close()
    store = SqliteMediaStore(database=path)
    assert await store.get(media_uri_for(b'old')) == b'old'
    assert await store.get_metadata(media_uri_for(b'old')) == {}  # NULL metadata reads as none
    uri = await store.put(b'new', context=MediaContext(media_type='text/plain', metadata={'x': 'y'}))
    assert await store.get_metadata(uri) == {'x': 'y'}
    store.close()


async def test_a_table_that_is_not_a_media_table_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / 'steps.db'
    async with SqliteStepStore(database=path) as steps:
        await steps.register_run(RunRecord(run_id='kept'))

    def layout() -> tuple[list[str], list[tuple[object, ...]]]:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            tables = sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            return tables, conn.execute('PRAGMA table_info(runs)').fetchall()

    before = layout()
    store = SqliteMediaStore(database=path, table='runs')
    with pytest.raises(ValueError, match=r"table 'runs' is not a media table .*sha256") as caught:
        await store.put(b'payload')
    assert 'nothing was changed' in str(caught.value)
    with pytest.raises(ValueError, match='not a media table'):
        await store.get(media_uri_for(b'payload'))
    store.close()
    assert layout() == before  # no column added to `runs`, no `runs_chunks` created
    async with SqliteStepStore(database=path) as steps:
        assert [run.run_id for run in await steps.list_runs()] == ['kept']


async def test_another_applications_table_of_the_name_is_refused_before_anything_in_the_file_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / 'app.db'
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute('CREATE TABLE media (id INTEGER, name TEXT)')
        conn.executemany('INSERT INTO media VALUES (?, ?)', [(1, 'poster'), (2, 'trailer')])
    before = path.read_bytes()
    store = SqliteMediaStore(database=path)
    expected = re.escape(f"table 'media' is not a media table in SQLite database '{path}' (it has no bytes")
    with pytest.raises(ValueError, match=expected):
        await store.put(b'payload')
    with pytest.raises(ValueError, match=expected):
        await store.exists(media_uri_for(b'payload'))
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'delete'
        assert conn.execute('SELECT * FROM media').fetchall() == [(1, 'poster'), (2, 'trailer')]
    assert path.read_bytes() == before


async def test_foreign_rows_of_the_wrong_type_are_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / 'f.db'
    store = SqliteMediaStore(database=path)
    await store.put(b'seed')
    store.close()
    digest = media_uri_for(b'text row')[-64:]
    with sqlite3.connect(path) as other:
        other.execute(
            'INSERT INTO media (sha256, media_type, bytes, size_bytes, metadata) VALUES (?, NULL, ?, 1, ?)',
            (digest, 'not bytes', '[1]'),
        )
    other.close()
    with pytest.raises(ValueError, match='wrong types'):
        await store.get(media_uri_for(b'text row'))
    with pytest.raises(ValueError, match='must be a JSON object'):
        await store.get_metadata(media_uri_for(b'text row'))
    store.close()


async def test_memory_database_keeps_its_data_for_the_store_lifetime() -> None:
    store = SqliteMediaStore(database=':memory:')
    uri = await store.put(b'in memory')
    assert await store.get(uri) == b'in memory'
    store.close()


# -- large puts: the WAL checkpoint runs on a background thread ------------------------------------


def _big(size: int = 2 << 20, seed: int = 0) -> bytes:
    return bytes((seed + index * 7) % 251 for index in range(251)) * (size // 251) + b'tail'


@pytest.mark.parametrize('chunked', [True, False], ids=['chunked', 'one-row'])
async def test_large_put_round_trips_and_is_checkpointed_off_the_put(tmp_path: Path, chunked: bool) -> None:
    path = tmp_path / 'big.db'
    store = SqliteMediaStore(database=path)
    store.deferred_checkpoint_bytes = 1 << 20
    store.chunk_bytes = (1 << 20) if chunked else (8 << 20)
    payload = _big()
    uri = await store.put(payload, context=MediaContext(media_type='application/octet-stream', metadata={'a': 'b'}))
    assert uri == media_uri_for(payload)
    checkpointer = store._checkpointer  # pyright: ignore[reportPrivateUsage]
    assert checkpointer is not None
    checkpointer.wait()
    # The store's connection is still open, so only the background checkpoint can have copied the
    # row from the WAL into the database file; its own automatic checkpoint is back on.
    assert path.stat().st_size > len(payload)
    connection = store._connection  # pyright: ignore[reportPrivateUsage]
    assert connection is not None
    assert connection.execute('PRAGMA wal_autocheckpoint').fetchone()[0] == 1000
    assert await store.get(uri) == payload
    assert await store.get_metadata(uri) == {'a': 'b'}
    await store.aclose()
    assert not store._checkpointer.running  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess]
    with sqlite3.connect(path) as check:
        row = check.execute('SELECT bytes, size_bytes, blob_id FROM media').fetchone()
    check.close()
    assert row == ((b'', len(payload), 1) if chunked else (payload, len(payload), None))
    assert _stored_chunks(path) == ({1: payload} if chunked else {})


async def test_failed_large_put_leaves_nothing_and_restores_the_checkpoint_setting(tmp_path: Path) -> None:
    path = tmp_path / 'fail.db'
    store = SqliteMediaStore(database=path)
    store.deferred_checkpoint_bytes = 1 << 20
    await store.put(b'seed')
    with sqlite3.connect(path) as other:
        other.execute(
            'CREATE TRIGGER refuse BEFORE INSERT ON media WHEN NEW.size_bytes > 100 '
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    other.close()
    payload = _big()
    with pytest.raises(sqlite3.IntegrityError, match='refused'):
        await store.put(payload)
    assert await store.exists(media_uri_for(payload)) is False
    connection = store._connection  # pyright: ignore[reportPrivateUsage]
    assert connection is not None
    assert not connection.in_transaction
    assert connection.execute('PRAGMA wal_autocheckpoint').fetchone()[0] == 1000
    assert not store._checkpointer.running  # pyright: ignore[reportPrivateUsage, reportOptionalMemberAccess]
    store.close()
    assert _stored_chunks(path) == {}  # the chunks written before the refusal were rolled back


async def test_large_puts_of_the_same_payload_racing_on_two_connections_store_one_row(tmp_path: Path) -> None:
    path = tmp_path / 'race.db'
    stores = [SqliteMediaStore(database=path) for _ in range(2)]
    for store in stores:
        store.deferred_checkpoint_bytes = 1 << 20
    await stores[0].put(b'create the table first')
    payload = _big(seed=3)
    uris: list[str] = []

    async def put(store: SqliteMediaStore) -> None:
        uris.append(await store.put(payload, context=MediaContext(metadata={'by': str(id(store))})))

    async with anyio.create_task_group() as group:
        for store in stores:
            group.start_soon(put, store)
    assert uris == [media_uri_for(payload)] * 2
    for store in stores:
        assert await store.get(uris[0]) == payload
        await store.aclose()
    with sqlite3.connect(path) as check:
        assert check.execute('SELECT count(*) FROM media WHERE size_bytes = ?', (len(payload),)).fetchone()[0] == 1
    check.close()
    assert list(_stored_chunks(path).values()) == [payload]  # the loser's chunks were rolled back


async def test_large_put_on_a_caller_connection_keeps_its_checkpoint_settings(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'caller.db', check_same_thread=False, isolation_level=None)
    connection.execute('PRAGMA journal_mode=WAL')
    connection.execute('PRAGMA wal_autocheckpoint=50')
    store = SqliteMediaStore(connection=connection)
    store.deferred_checkpoint_bytes = 1 << 20
    payload = _big(seed=5)
    uri = await store.put(payload)
    assert await store.get(uri) == payload
    assert connection.execute('PRAGMA wal_autocheckpoint').fetchone()[0] == 50
    assert store._checkpointer is None  # pyright: ignore[reportPrivateUsage]
    connection.close()


# -- large payloads are stored in chunks, hashed while they are written ----------------------------


def _stored_chunks(path: Path) -> dict[int, bytes]:
    """`blob_id -> bytes` of every chunked blob in `media_chunks`, read straight from the database."""
    with sqlite3.connect(path) as check:
        rows = check.execute('SELECT blob_id, data FROM media_chunks ORDER BY blob_id, idx').fetchall()
    check.close()
    blobs: dict[int, bytes] = {}
    for blob_id, data in rows:
        blobs[blob_id] = blobs.get(blob_id, b'') + data
    return blobs


async def test_payload_over_chunk_bytes_is_stored_in_chunks_and_read_back_exact(tmp_path: Path) -> None:
    path = tmp_path / 'chunks.db'
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = 1000
    inline, chunked = b'i' * 1000, bytes(range(256)) * 10 + b'end'
    inline_uri = await store.put(inline)
    chunked_uri = await store.put(chunked, context=MediaContext(media_type='image/png', metadata={'k': 'v'}))
    assert chunked_uri == media_uri_for(chunked)
    assert await store.get(inline_uri) == inline
    assert await store.get(chunked_uri) == chunked
    assert await store.get_metadata(chunked_uri) == {'k': 'v'}
    store.close()
    with sqlite3.connect(path) as check:
        by_digest = {
            row[0]: row[1:] for row in check.execute('SELECT sha256, bytes, size_bytes, blob_id, media_type FROM media')
        }
        sizes = [len(data) for (data,) in check.execute('SELECT data FROM media_chunks ORDER BY idx')]
    check.close()
    assert by_digest[inline_uri[-64:]] == (inline, 1000, None, None)
    assert by_digest[chunked_uri[-64:]] == (b'', len(chunked), 1, 'image/png')
    assert sizes == [1000, 1000, 563]
    assert _stored_chunks(path) == {1: chunked}


async def test_repeated_large_put_keeps_the_first_blob_and_leaves_no_chunks_behind(tmp_path: Path) -> None:
    path = tmp_path / 'repeat.db'
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = 100
    payload = b'x' * 1234
    first = await store.put(payload, context=MediaContext(metadata={'n': '1'}))
    second = await store.put(payload, context=MediaContext(metadata={'n': '2'}))
    other = await store.put(b'y' * 1234)
    assert first == second
    assert await store.get_metadata(first) == {'n': '1'}
    assert await store.get(other) == b'y' * 1234
    store.close()
    assert _stored_chunks(path) == {1: payload, 2: b'y' * 1234}


async def test_damaged_chunks_are_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / 'damaged.db'
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = 100
    uri = await store.put(b'z' * 250)
    with sqlite3.connect(path) as other:
        other.execute('DELETE FROM media_chunks WHERE idx = 1')
    other.close()
    with pytest.raises(MediaIntegrityError, match=re.escape(f'media {uri} is damaged: the 150 bytes')) as caught:
        await store.get(uri)
    assert 'its chunks hold 150 of 250 bytes' in str(caught.value)
    store.close()


async def test_large_put_inside_a_caller_transaction_lands_only_with_its_commit(tmp_path: Path) -> None:
    path = tmp_path / 'caller-chunks.db'
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    store = SqliteMediaStore(connection=connection)
    store.chunk_bytes = 100
    await store.put(b'warm-up')
    connection.execute('BEGIN')
    uri = await store.put(b'r' * 500)
    assert connection.in_transaction
    connection.execute('ROLLBACK')
    assert await store.exists(uri) is False
    connection.execute('BEGIN')
    uri = await store.put(b'c' * 500)
    connection.execute('COMMIT')
    assert await store.get(uri) == b'c' * 500
    connection.close()
    assert _stored_chunks(path) == {1: b'c' * 500}


async def test_table_of_an_older_layout_gets_blob_id_and_takes_chunked_blobs(tmp_path: Path) -> None:
    path = tmp_path / 'old-chunks.db'
    with sqlite3.connect(path) as old:
        old.execute(
            'CREATE TABLE media (sha256 TEXT PRIMARY KEY, media_type TEXT, bytes BLOB NOT NULL, '
            'size_bytes INTEGER NOT NULL, metadata TEXT)'
        )
        old.execute('INSERT INTO media VALUES (?, NULL, ?, 3, NULL)', (media_uri_for(b'old')[-64:], b'old'))
    old.close()
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = 10
    uri = await store.put(b'n' * 35)
    assert await store.get(media_uri_for(b'old')) == b'old'
    assert await store.get(uri) == b'n' * 35
    store.close()


@pytest.mark.parametrize('flag', ['yes', 1, None], ids=['str', 'int', 'none'])
def test_durable_must_be_a_real_boolean(tmp_path: Path, flag: object) -> None:
    """`durable='no'` would be truthy and ask for FULL sync: refused, like the step stores refuse it."""
    with pytest.raises(ValueError, match=rf'^durable must be True or False, got {re.escape(repr(flag))}$'):
        SqliteMediaStore(database=tmp_path / 'm.db', durable=flag)  # pyright: ignore[reportArgumentType]
    connection = sqlite3.connect(':memory:', check_same_thread=False)
    with contextlib.closing(connection), pytest.raises(ValueError, match='durable must be True or False'):
        SqliteMediaStore(connection=connection, durable=flag)  # pyright: ignore[reportArgumentType]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(('durable', 'level'), [(False, 1), (True, 2)])
async def test_synchronous_is_normal_unless_durable(tmp_path: Path, durable: bool, level: int) -> None:
    store = SqliteMediaStore(database=tmp_path / 'sync.db', durable=durable)
    await store.put(b'payload')
    connection = store._connection  # pyright: ignore[reportPrivateUsage]
    assert connection is not None
    assert connection.execute('PRAGMA synchronous').fetchone()[0] == level  # 1 NORMAL, 2 FULL
    store.close()


_PUT_AND_REPORT = """
import asyncio, sys
from pydantic_ai_steps.media import SqliteMediaStore

async def main() -> None:
    store = SqliteMediaStore(database=sys.argv[1])
    await store.put(b'seed')
    print('ready', flush=True)
    await store.put(bytes(range(256)) * (96 * 4096))  # 96 MiB: 96 chunk rows
    print('stored', flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_chunked_put_killed_midway_leaves_no_row_and_no_chunks(tmp_path: Path) -> None:
    """SIGKILL at random moments of a 96 MiB put: the blob is whole or absent, never partial."""
    import random
    import signal
    import subprocess
    import sys
    import time

    payload_uri = media_uri_for(bytes(range(256)) * (96 * 4096))
    rng = random.Random('chunked-put')
    outcomes: set[str] = set()
    for attempt in range(6):
        path = tmp_path / f'killed-{attempt}.db'
        child = subprocess.Popen([sys.executable, '-c', _PUT_AND_REPORT, str(path)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == 'ready\n'
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait()
        store = SqliteMediaStore(database=path)
        stored = anyio.run(store.exists, payload_uri)
        chunks = _stored_chunks(path)
        if stored:
            assert anyio.run(store.get, payload_uri) == bytes(range(256)) * (96 * 4096)
            assert len(chunks) == 1
            outcomes.add('stored')
        else:
            assert chunks == {}, 'chunks of an uncommitted put are visible'
            outcomes.add('absent')
        assert anyio.run(store.get, media_uri_for(b'seed')) == b'seed'
        store.close()
    assert 'absent' in outcomes, outcomes  # at least one kill landed inside the put
