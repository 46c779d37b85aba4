"""`SqliteMediaStore.list_blobs` and `delete`: the `stored_at` column, its migration, chunks and transactions."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pydantic_ai_steps.media import MediaContext, SqliteMediaStore, media_uri_for
from pydantic_ai_steps.media.stores import sqlite as sqlite_module
from pydantic_ai_steps.store import CollectableMediaStore

pytestmark = pytest.mark.anyio
EPOCH = datetime.fromtimestamp(0, UTC)


def query(path: Path, sql: str, *parameters: object) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute(sql, parameters).fetchall()
    connection.close()
    return rows


def stored_at(path: Path, uri: str) -> object:
    return query(path, 'SELECT stored_at FROM media WHERE sha256 = ?', uri[-64:])[0][0]


async def listed(store: SqliteMediaStore) -> dict[str, tuple[int, datetime]]:
    return {blob.uri: (blob.size, blob.stored_at) async for blob in store.list_blobs()}


async def test_is_collectable_and_sets_stored_at_on_insert(tmp_path: Path) -> None:
    path = tmp_path / 'm.db'
    async with SqliteMediaStore(database=path) as store:
        assert isinstance(store, CollectableMediaStore)
        before = time.time()
        uri = await store.put(b'new')
    value = stored_at(path, uri)
    assert isinstance(value, float) and before <= value <= time.time()


@pytest.mark.parametrize('chunk_bytes', [1 << 20, 100], ids=['inline', 'chunked'])
async def test_a_repeat_put_only_refreshes_stored_at(tmp_path: Path, chunk_bytes: int) -> None:
    path = tmp_path / 'm.db'
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = chunk_bytes
    payload = bytes(range(256)) * 2
    uri = await store.put(payload, context=MediaContext(metadata={'n': '1'}))
    chunks = query(path, 'SELECT blob_id, idx FROM media_chunks')
    await store.put(b'unrelated')
    query(path, 'UPDATE media SET stored_at = 5')
    before = time.time()
    await store.put(payload, context=MediaContext(metadata={'n': '2'}))
    blobs = await listed(store)
    store.close()
    assert blobs[uri][1] >= datetime.fromtimestamp(before, UTC)
    assert blobs[media_uri_for(b'unrelated')][1] == EPOCH + timedelta(seconds=5)
    assert query(path, 'SELECT blob_id, idx FROM media_chunks') == chunks  # no chunks written a second time
    store = SqliteMediaStore(database=path)
    assert await store.get(uri) == payload and await store.get_metadata(uri) == {'n': '1'}
    store.close()


async def test_an_older_table_lists_as_just_put_and_gets_stored_at_at_the_first_put(tmp_path: Path) -> None:
    path = tmp_path / 'old.db'
    with sqlite3.connect(path) as old:
        old.execute(
            'CREATE TABLE media (sha256 TEXT PRIMARY KEY, media_type TEXT, bytes BLOB NOT NULL, '
            'size_bytes INTEGER NOT NULL, metadata TEXT, blob_id INTEGER)'
        )
        for payload in (b'old one', b'old two'):
            old.execute(
                'INSERT INTO media VALUES (?, NULL, ?, ?, NULL, NULL)', (media_uri_for(payload)[-64:], payload, 7)
            )
    old.close()
    store = SqliteMediaStore(database=path)
    before = datetime.now(UTC)
    blobs = await listed(store)
    assert sorted(blobs) == sorted([media_uri_for(b'old one'), media_uri_for(b'old two')])
    assert all(size == 7 and put_at >= before for size, put_at in blobs.values())  # undated: never collectable yet
    await listed(store)
    assert 'stored_at' not in {row[1] for row in query(path, 'PRAGMA table_info(media)')}  # reads never migrate
    await store.put(b'old two')  # put again: no longer old
    assert 'stored_at' in {row[1] for row in query(path, 'PRAGMA table_info(media)')}
    assert stored_at(path, media_uri_for(b'old one')) is None
    # Undated, as the listing says: kept by a delete with a cutoff, taken by one without.
    assert not await store.delete(media_uri_for(b'old one'), stored_before=datetime.now(UTC) - timedelta(days=1))
    assert await store.delete(media_uri_for(b'old one'))
    assert not await store.delete(media_uri_for(b'old two'), stored_before=datetime.now(UTC) - timedelta(days=1))
    assert await store.get(media_uri_for(b'old two')) == b'old two'
    assert await store.exists(media_uri_for(b'old one')) is False
    store.close()


async def test_a_blob_put_without_a_put_time_is_collected_one_grace_period_after_it_was_dated(
    tmp_path: Path,
) -> None:
    """The upstream package puts blobs without `stored_at`, even in a widened table, then references
    them in its next write: a collection running in between must keep such a blob (as PostgreSQL's
    column default and MongoDB's dating do), and date it so that a later one can take it."""
    from pydantic_ai_steps.step_persistence import SqliteStepStore

    path = tmp_path / 'shared.db'
    store = SqliteStepStore(database=path)
    assert store.media_store is not None
    await store.media_store.put(b'this package put it')  # the table, widened
    upstream = b'put by an upstream writer' * 100
    query(
        path,
        'INSERT OR IGNORE INTO media (sha256, media_type, bytes, size_bytes, metadata) VALUES (?, ?, ?, ?, ?)',
        media_uri_for(upstream)[-64:],
        'image/png',
        upstream,
        len(upstream),
        '{}',
    )
    planned = await store.collect_garbage(grace=timedelta(0), writers_stopped=True, dry_run=True)
    assert planned.blobs == [media_uri_for(b'this package put it')]  # listed as just put, and left undated
    assert stored_at(path, media_uri_for(upstream)) is None
    assert (await store.collect_garbage()).blobs == []  # the default grace: its writer may reference it next
    assert isinstance(stored_at(path, media_uri_for(upstream)), float)  # dated by that collection
    query(path, 'UPDATE media SET stored_at = ?', time.time() - 7200)  # two hours later, still unreferenced
    assert sorted((await store.collect_garbage()).blobs) == sorted(
        [media_uri_for(upstream), media_uri_for(b'this package put it')]
    )
    await store.aclose()


async def test_an_older_table_only_ever_collected_is_widened_and_dated_by_a_collection(tmp_path: Path) -> None:
    """A table of an older release that no put of this one reached has no `stored_at`: its rows list
    as just put, so a collection widens it and dates them, or they would never be collectable."""
    from pydantic_ai_steps.step_persistence import SqliteStepStore

    path = tmp_path / 'old.db'
    old = b'an old unreferenced blob'
    with sqlite3.connect(path) as connection:
        connection.execute(
            'CREATE TABLE media (sha256 TEXT PRIMARY KEY, media_type TEXT, bytes BLOB NOT NULL, '
            'size_bytes INTEGER NOT NULL, metadata TEXT, blob_id INTEGER)'
        )
        connection.execute('INSERT INTO media VALUES (?, NULL, ?, ?, NULL, NULL)', (media_uri_for(old)[-64:], old, 24))
    connection.close()
    store = SqliteStepStore(database=path)
    assert (await store.collect_garbage()).blobs == []  # kept this time: dated now
    assert isinstance(stored_at(path, media_uri_for(old)), float)
    query(path, 'UPDATE media SET stored_at = ?', time.time() - 7200)  # two hours later
    assert (await store.collect_garbage()).blobs == [media_uri_for(old)]
    await store.aclose()


async def test_delete_removes_the_chunks_of_that_blob_only(tmp_path: Path) -> None:
    path = tmp_path / 'chunks.db'
    store = SqliteMediaStore(database=path)
    store.chunk_bytes = 100
    doomed = await store.put(b'd' * 350)
    kept = await store.put(b'k' * 250)
    inline = await store.put(b'small')
    assert await store.delete(doomed, stored_before=datetime.now(UTC) + timedelta(seconds=1)) is True
    assert await store.delete(inline) is True
    assert query(path, 'SELECT DISTINCT blob_id FROM media_chunks') == [(2,)]
    assert await store.get(kept) == b'k' * 250
    assert await listed(store) == {kept: (250, (await listed(store))[kept][1])}
    again = await store.put(b'd' * 350)  # stored again, in fresh chunks
    assert await store.get(again) == b'd' * 350
    store.close()


async def test_the_cutoff_is_checked_by_the_delete_statement_itself(tmp_path: Path) -> None:
    path = tmp_path / 'cutoff.db'
    store = SqliteMediaStore(database=path)
    uri = await store.put(b'blob')
    cutoff = datetime.now(UTC) - timedelta(minutes=1)
    query(path, 'UPDATE media SET stored_at = ?', cutoff.timestamp())  # put exactly at the cutoff: kept
    assert await store.delete(uri, stored_before=cutoff) is False
    query(path, 'UPDATE media SET stored_at = ?', cutoff.timestamp() - 0.001)
    assert await store.delete(uri, stored_before=cutoff) is True
    assert await store.delete(uri) is False
    store.close()


async def test_delete_inside_a_caller_transaction_lands_with_its_commit(tmp_path: Path) -> None:
    path = tmp_path / 'caller.db'
    connection = sqlite3.connect(path, check_same_thread=False)
    store = SqliteMediaStore(connection=connection)
    store.chunk_bytes = 100
    uri = await store.put(b'c' * 300)
    connection.execute('BEGIN')
    assert await store.delete(uri) is True
    assert connection.in_transaction
    assert len(query(path, 'SELECT * FROM media_chunks')) == 3  # not committed yet
    connection.rollback()
    assert await store.get(uri) == b'c' * 300
    connection.execute('BEGIN')
    assert await store.delete(uri) is True
    connection.commit()
    assert query(path, 'SELECT count(*) FROM media_chunks') == [(0,)]
    assert await store.delete(uri) is False
    assert not connection.in_transaction  # a delete outside a transaction commits its own
    connection.close()


async def test_listing_pages_through_the_table_and_skips_foreign_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, '_LIST_BATCH', 3)
    path = tmp_path / 'pages.db'
    store = SqliteMediaStore(database=path)
    uris = {await store.put(f'blob {index}'.encode()) for index in range(10)}
    with sqlite3.connect(path) as other:
        for foreign in ('not-a-digest', 'A' * 64, b'\xff' * 32, 42):
            other.execute(
                'INSERT INTO media (sha256, bytes, size_bytes, stored_at) VALUES (?, ?, 1, ?)', (foreign, b'x', 'when?')
            )
    other.close()
    assert sorted(await listed(store)) == sorted(uris)
    store.close()


async def test_listing_a_memory_database_shared_with_a_caller(tmp_path: Path) -> None:
    connection = sqlite3.connect(':memory:', check_same_thread=False)
    store = SqliteMediaStore(connection=connection, table='blobs')
    uri = await store.put(b'in memory')
    assert list(await listed(store)) == [uri]
    assert await store.delete(uri, stored_before=datetime.now(UTC) + timedelta(seconds=1)) is True
    assert await listed(store) == {}
    connection.close()


async def test_reads_of_a_database_without_the_table_create_nothing(tmp_path: Path) -> None:
    path = tmp_path / 'other.db'
    with sqlite3.connect(path) as other:
        other.execute('CREATE TABLE unrelated (x)')
    other.close()
    store = SqliteMediaStore(database=path)
    uri = media_uri_for(b'absent')
    assert await listed(store) == {}
    assert not await store.exists(uri) and not await store.delete(uri)
    with pytest.raises(FileNotFoundError):
        await store.get(uri)
    with pytest.raises(FileNotFoundError):
        await store.get_metadata(uri)
    store.close()
    assert query(path, "SELECT name FROM sqlite_master WHERE type = 'table'") == [('unrelated',)]


async def test_a_database_the_store_creates_is_owner_only_with_incremental_vacuum(tmp_path: Path) -> None:
    path = tmp_path / 'new' / 'media.db'
    async with SqliteMediaStore(database=path) as store:
        uri = await store.put(b'x' * 100_000)
        assert await store.delete(uri)
    assert path.stat().st_mode & 0o777 == 0o600
    assert query(path, 'PRAGMA auto_vacuum') == [(2,)]  # incremental
