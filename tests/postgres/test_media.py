"""`PostgresMediaStore`: the media conformance suite (inline and chunked, asyncpg and psycopg), chunks,
garbage-collection listing and deletion, and upstream's one-row table."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from pydantic_ai_steps.media import MediaContext, MediaIntegrityError, PostgresMediaStore, media_uri_for
from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord
from pydantic_ai_steps.store.maintenance import CollectableMediaStore
from pydantic_ai_steps.testing.media_store import MediaStoreConformance

pytestmark = pytest.mark.server

CHUNK_SIZES = [
    pytest.param(PostgresMediaStore.chunk_bytes, id='inline'),
    pytest.param(1000, id='chunked'),  # the whole suite again with payloads over 1,000 bytes in chunks
]


@pytest.fixture
async def asyncpg_pool(dsn: str, anyio_backend: str) -> AsyncIterator[Any]:
    import asyncpg

    del anyio_backend
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    yield pool
    await pool.close()


class TestPostgresMediaStoreAsyncpg(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture(params=CHUNK_SIZES)
    def media_store(self, asyncpg_pool: Any, prefix: str, request: pytest.FixtureRequest) -> PostgresMediaStore:
        store = PostgresMediaStore(asyncpg_pool, table=f'{prefix}_media')
        store.chunk_bytes = request.param
        return store


class TestPostgresMediaStorePsycopg(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    async def media_store(self, dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[PostgresMediaStore]:
        from psycopg_pool import AsyncConnectionPool

        del anyio_backend
        async with AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False) as pool:
            store = PostgresMediaStore(pool, table=f'{prefix}_media')
            store.chunk_bytes = 1000
            yield store


class TestPostgresMediaStoreDsn(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    async def media_store(self, dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[PostgresMediaStore]:
        del anyio_backend
        store = PostgresMediaStore(dsn=dsn, table=f'{prefix}_media')
        yield store
        await store.aclose()


@pytest.fixture
async def media(dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[PostgresMediaStore]:
    del anyio_backend
    store = PostgresMediaStore(dsn=dsn, table=f'{prefix}_media')
    yield store
    await store.aclose()


@pytest.mark.anyio
async def test_a_large_blob_is_stored_in_chunk_rows_and_checked_on_read(media: PostgresMediaStore, dsn: str) -> None:
    import asyncpg

    media.chunk_bytes = 64 * 1024
    data = bytes(range(256)) * 1024  # 256 KiB: four chunks
    uri = await media.put(data, context=MediaContext(media_type='application/octet-stream'))
    conn = await asyncpg.connect(dsn)
    try:
        count, inline = await conn.fetchrow(
            f'SELECT chunks, length(bytes) FROM {media.table} WHERE sha256 = $1', uri.rsplit('/', 1)[1]
        )
        assert (count, inline) == (4, 0)
        assert await conn.fetchval(f'SELECT count(*) FROM {media.table}_chunks') == 4
        assert await media.get(uri) == data
        # A damaged chunk reads as a missing blob, naming what was found.
        await conn.execute(f"UPDATE {media.table}_chunks SET data = '\\x00'::bytea WHERE idx = 2")
        with pytest.raises(MediaIntegrityError, match='chunks hold'):
            await media.get(uri)
    finally:
        await conn.close()


@pytest.mark.anyio
async def test_first_puts_of_one_blob_at_once_never_mix_their_chunks(dsn: str, prefix: str) -> None:
    """Two writers cut a payload at different `chunk_bytes` (a rolling upgrade that changed it, say):
    whichever stores the blob's row stores all of its chunks, so the blob reads back whole."""
    coarse = PostgresMediaStore(dsn=dsn, table=f'{prefix}_media')
    fine = PostgresMediaStore(dsn=dsn, table=f'{prefix}_media')
    coarse.chunk_bytes, fine.chunk_bytes = 4000, 1000
    try:
        await coarse.put(b'the tables exist')
        for attempt in range(20):
            data = bytes([attempt]) + bytes(range(256)) * 40  # 3 coarse chunks, 11 fine ones
            first, second = (coarse, fine) if attempt % 2 else (fine, coarse)
            uri, again = await asyncio.gather(first.put(data), second.put(data))
            assert uri == again
            assert await coarse.get(uri) == data, f'attempt {attempt}'
    finally:
        await coarse.aclose()
        await fine.aclose()


@pytest.mark.anyio
async def test_listing_and_deleting_for_garbage_collection(media: PostgresMediaStore) -> None:
    assert isinstance(media, CollectableMediaStore)
    assert [blob async for blob in media.list_blobs()] == []  # no table yet: nothing, and nothing created
    one, two = await media.put(b'one'), await media.put(b'two' * 1000)
    listed = {blob.uri: blob async for blob in media.list_blobs()}
    assert set(listed) == {one, two} and listed[two].size == 3000
    stamp = listed[one].stored_at
    # A repeat put refreshes stored_at, so a collection that listed the blob earlier leaves it.
    await media.put(b'one')
    assert not await media.delete(one, stored_before=stamp + timedelta(microseconds=1))
    assert await media.exists(one)
    assert await media.delete(one)
    assert not await media.exists(one)
    assert not await media.delete(one)
    assert {blob.uri async for blob in media.list_blobs()} == {two}


@pytest.mark.anyio
async def test_upstream_one_row_table_reads_and_gets_the_new_columns(media: PostgresMediaStore, dsn: str) -> None:
    import asyncpg

    data = b'written by the upstream package'
    digest = hashlib.sha256(data).hexdigest()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f'CREATE TABLE {media.table} (sha256 TEXT PRIMARY KEY, media_type TEXT, bytes BYTEA NOT NULL, '
            'size_bytes BIGINT NOT NULL, metadata TEXT)'
        )
        await conn.execute(
            f'INSERT INTO {media.table} VALUES ($1, $2, $3, $4, $5)', digest, 'text/plain', data, len(data), '{"a":"b"}'
        )
        assert await media.get(media_uri_for(data)) == data
        assert dict(await media.get_metadata(media_uri_for(data))) == {'a': 'b'}
        assert [blob.uri async for blob in media.list_blobs()] == [media_uri_for(data)]
        # Upstream's own insert (naming its five columns) still works on the widened table.
        other = b'a later upstream put'
        await conn.execute(
            f'INSERT INTO {media.table} (sha256, media_type, bytes, size_bytes, metadata) '
            'VALUES ($1, NULL, $2, $3, NULL)',
            hashlib.sha256(other).hexdigest(),
            other,
            len(other),
        )
        assert await media.get(media_uri_for(other)) == other
    finally:
        await conn.close()


@pytest.mark.anyio
async def test_a_table_that_is_not_a_media_table_is_refused_and_left_as_it_was(dsn: str, prefix: str) -> None:
    async with PostgresStepStore(dsn=dsn, table=prefix) as steps:
        await steps.register_run(RunRecord(run_id='kept'))
        runs_table = f'{prefix}_runs'
        columns_query = (
            'SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped '
            'ORDER BY attnum'
        )
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            before = [row[0] for row in await conn.fetch(columns_query, runs_table)]
            media = PostgresMediaStore(dsn=dsn, table=runs_table)
            try:
                with pytest.raises(ValueError, match=rf"table '{runs_table}' is not a media table .*sha256"):
                    await media.put(b'payload')
                with pytest.raises(ValueError, match='not a media table'):
                    await media.get(media_uri_for(b'payload'))
            finally:
                await media.aclose()
            assert [row[0] for row in await conn.fetch(columns_query, runs_table)] == before
            assert await conn.fetchval('SELECT to_regclass($1)', f'{runs_table}_chunks') is None
        finally:
            await conn.close()
        assert [run.run_id for run in await steps.list_runs()] == ['kept']
