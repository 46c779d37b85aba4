"""`PostgresMediaStore`: blobs in a PostgreSQL table keyed by SHA-256, large ones as chunk rows.

The table is upstream's (`sha256 text PRIMARY KEY, media_type, bytes bytea, size_bytes, metadata`)
plus `stored_at` (when the blob was last put, for garbage collection) and `chunks`. A payload of
up to `chunk_bytes` (1 MiB) is one row, written by one `INSERT ... ON CONFLICT (sha256)` that only
refreshes `stored_at` when the bytes are stored already, so the first put's media type and
metadata win. A larger payload is written as `chunk_bytes` rows of `<table>_chunks`, one
statement each, inside one transaction that adds the blob's row first (`chunks` = their count,
`bytes` empty): a blob is never bound whole into one statement, is not bounded by one `bytea`
value, and a put that fails half-way leaves nothing. The row comes first because it decides which
writer's chunks are stored: two first puts of one blob at once wait on its key, and the second
finds it taken and writes no chunk, so writers cut at different `chunk_bytes` never mix their
rows. Before sending a large payload the store refreshes an existing row instead, so a repeat
put sends no bytes. Rows with a NULL `chunks`
(every row upstream wrote) hold their bytes inline and read as before.

`get` checks what it read against the URI's digest and raises `MediaIntegrityError` (a
`FileNotFoundError`) when they differ. `list_blobs` and `delete(uri, stored_before=)` serve
garbage collection: the delete re-checks `stored_at < stored_before` in the same statement that
removes the row and its chunks, and a put refreshing the blob waits for (or wins against) that
row lock, so a blob put again during collection is never lost.

Connections: like `PostgresStepStore`, exactly one of a caller's `pool` or `dsn=`; each call uses
one connection and returns it. The table is created (or an upstream one given its extra columns,
additively, under an advisory lock) by the first write (a put, a delete): reads create nothing, find
nothing in a table that does not exist, and read upstream's table as it is (its blobs list as just
stored, so garbage collection keeps them until the table is widened).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import cast

import anyio.to_thread

from ..._closing import AsyncClosing
from ...store.backends.postgres._pool import DEFAULT_ACQUIRE_TIMEOUT, Connections, PostgresConnection
from ...store.maintenance import BlobInfo
from .._context import EMPTY_CONTEXT, MediaContext
from .._errors import MediaIntegrityError, check_blob_table
from .._protocol import (
    PublicUrlResolver,
    check_stored_before,
    decode_metadata,
    encode_metadata,
    resolve_public_url,
)
from .._uri import parse_media_uri, uri_for_digest

__all__ = ['PostgresMediaStore']

_TABLE = re.compile(r'[a-z_][a-z0-9_]{0,55}')
"""Upstream's rule for the name (lowercase), short enough that `<table>_chunks` stays under 63 bytes."""
_HASH_IN_THREAD = 1 << 20
_LIST_PAGE = 1000


class PostgresMediaStore(AsyncClosing):
    """A `MediaStore` in PostgreSQL. Give exactly one of `pool` (yours; never closed) or `dsn=`."""

    chunk_bytes: int = 1 << 20
    """Payloads larger than this are stored as rows of this size in `<table>_chunks`."""

    def __init__(
        self,
        pool: object | None = None,
        *,
        dsn: str | None = None,
        table: str = 'media',
        public_url: PublicUrlResolver | None = None,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
    ) -> None:
        self._setup(
            Connections(pool, dsn, acquire_timeout=acquire_timeout, owner='PostgresMediaStore'), table, public_url
        )
        self._owns = True

    @classmethod
    def _over(cls, connections: Connections, *, table: str) -> PostgresMediaStore:
        """A media store on a step store's connections (which the step store closes)."""
        store = cls.__new__(cls)
        store._setup(connections, table, None)
        store._owns = False
        return store

    def _setup(self, connections: Connections, table: str, public_url: PublicUrlResolver | None) -> None:
        if not isinstance(table, str) or not _TABLE.fullmatch(table):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'invalid table name: {table!r}; expected [a-z_][a-z0-9_]{{0,55}}')
        self._connections = connections
        self._table = table
        self._chunks = f'{table}_chunks'
        self._public_url = public_url
        self._ready = False
        """The table exists with every column this release uses."""
        self._legacy = False
        """The table is upstream's, not widened yet: reads do without `chunks` and `stored_at`."""

    @property
    def table(self) -> str:
        return self._table

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self._connections.describe()}, table={self._table!r})'

    # -- the MediaStore protocol --------------------------------------------------------------------

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        if context.media_type is not None and '\x00' in context.media_type:
            # Metadata is stored as JSON text, which escapes it; the media type column holds it raw.
            raise ValueError(
                f'media_type {context.media_type!r} holds a NUL character (U+0000), which PostgreSQL text cannot store'
            )
        data = bytes(data)
        if len(data) >= _HASH_IN_THREAD:
            digest = await anyio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest())
        else:
            digest = hashlib.sha256(data).hexdigest()
        metadata = encode_metadata(context.metadata)
        t = self._table

        async def put(conn: PostgresConnection) -> None:
            await self._ensure(conn, create=True)
            if len(data) <= self.chunk_bytes:
                await conn.execute(
                    f'INSERT INTO {t} (sha256, media_type, bytes, size_bytes, metadata) VALUES ($1, $2, $3, $4, $5) '
                    'ON CONFLICT (sha256) DO UPDATE SET stored_at = now()',
                    digest,
                    context.media_type,
                    data,
                    len(data),
                    metadata,
                )
                return
            if await conn.fetchval(f'UPDATE {t} SET stored_at = now() WHERE sha256 = $1 RETURNING 1', digest):
                return  # stored already: no bytes sent
            view, step = memoryview(data), self.chunk_bytes
            async with conn.transaction():
                if not await conn.fetchval(
                    f'INSERT INTO {t} (sha256, media_type, bytes, size_bytes, metadata, chunks) '
                    "VALUES ($1, $2, '\\x'::bytea, $3, $4, $5) ON CONFLICT (sha256) DO NOTHING RETURNING 1",
                    digest,
                    context.media_type,
                    len(data),
                    metadata,
                    -(-len(data) // step),
                ):
                    await conn.execute(f'UPDATE {t} SET stored_at = now() WHERE sha256 = $1', digest)
                    return  # another put stored it meanwhile, chunks and all
                for index, offset in enumerate(range(0, len(data), step)):
                    await conn.execute(
                        f'INSERT INTO {self._chunks} (sha256, idx, data) VALUES ($1, $2, $3) '
                        'ON CONFLICT (sha256, idx) DO UPDATE SET data = excluded.data',
                        digest,
                        index,
                        view[offset : offset + step].tobytes(),
                    )

        await self._connections.run(put, replay_safe=True)  # content-addressed: a second put changes nothing
        return uri_for_digest(digest)

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = parse_media_uri(uri)
        t = self._table

        async def read(conn: PostgresConnection) -> tuple[bytes, int | None, int]:
            if not await self._ensure(conn, create=False):
                raise FileNotFoundError(f'media not found: {uri}')
            chunks_column = 'NULL' if self._legacy else 'chunks'
            row = await conn.fetchrow(f'SELECT bytes, {chunks_column}, size_bytes FROM {t} WHERE sha256 = $1', digest)
            if row is None:
                raise FileNotFoundError(f'media not found: {uri}')
            value, chunks, size = row[0], row[1], row[2]
            if not isinstance(value, bytes):
                raise ValueError(f'media row for {uri} has wrong types: bytes column holds {type(value).__name__}')
            if chunks is None:
                return value, None, int(size) if isinstance(size, int) else len(value)
            rows = await conn.fetch(
                f'SELECT data FROM {self._chunks} WHERE sha256 = $1 AND idx < $2 ORDER BY idx', digest, chunks
            )
            parts = [part for (part,) in rows if isinstance(part, bytes)]
            return b''.join(parts), len(rows), int(size) if isinstance(size, int) else -1

        data, chunks, size = await self._connections.read(read)
        if len(data) >= _HASH_IN_THREAD:
            actual = await anyio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest())
        else:
            actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            detail = f'its {chunks} chunks hold {len(data)} of {size} bytes' if chunks is not None else ''
            raise MediaIntegrityError.damaged(uri, len(data), f'in table {t!r}', detail)
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        digest = parse_media_uri(uri)

        async def look(conn: PostgresConnection) -> bool:
            if not await self._ensure(conn, create=False):
                return False
            return await conn.fetchval(f'SELECT 1 FROM {self._table} WHERE sha256 = $1', digest) is not None

        return await self._connections.read(look)

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        digest = parse_media_uri(uri)

        async def read(conn: PostgresConnection) -> tuple[object] | None:
            if not await self._ensure(conn, create=False):
                return None
            row = await conn.fetchrow(f'SELECT metadata FROM {self._table} WHERE sha256 = $1', digest)
            return (row[0],) if row is not None else None

        found = await self._connections.read(read)
        if found is None:
            raise FileNotFoundError(f'media not found: {uri}')
        if found[0] is None:  # rows written by other code may leave it NULL: no metadata
            return {}
        try:
            return decode_metadata(found[0])
        except ValueError as exc:
            raise ValueError(f'unreadable metadata for {uri} in table {self._table!r}: {exc}') from exc

    # -- garbage collection -------------------------------------------------------------------------

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob, in digest order, with its size and when it was last put."""
        after = ''
        while True:

            async def page(conn: PostgresConnection, after: str = after) -> list[tuple[str, int, datetime]]:
                if not await self._ensure(conn, create=False):
                    return []
                stored_at = 'now()' if self._legacy else 'stored_at'  # never collected before it is widened
                rows = await conn.fetch(
                    f'SELECT sha256, size_bytes, {stored_at} FROM {self._table} WHERE sha256 > $1 '
                    f'ORDER BY sha256 LIMIT {_LIST_PAGE}',
                    after,
                )
                return [(str(row[0]), int(row[1]), cast(datetime, row[2])) for row in rows]  # pyright: ignore[reportArgumentType]

            rows = await self._connections.read(page)
            for digest, size, stored_at in rows:
                yield BlobInfo(uri=uri_for_digest(digest), size=size, stored_at=stored_at)
            if len(rows) < _LIST_PAGE:
                return
            after = rows[-1][0]

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """Remove the blob and its chunks; with `stored_before`, only if it was last put before then."""
        digest = parse_media_uri(uri)
        cutoff = check_stored_before(stored_before)

        async def delete(conn: PostgresConnection) -> bool:
            if not await self._ensure(conn, create=False):
                return False
            if self._legacy:
                await self._ensure(conn, create=True)
            removed = await conn.fetchval(
                f'WITH gone AS (DELETE FROM {self._table} WHERE sha256 = $1 '
                'AND ($2::timestamptz IS NULL OR stored_at < $2::timestamptz) RETURNING sha256), '
                f'chunks AS (DELETE FROM {self._chunks} WHERE sha256 IN (SELECT sha256 FROM gone)) '
                'SELECT count(*) FROM gone',
                digest,
                cutoff,
            )
            return bool(removed)

        return await self._connections.run(delete, replay_safe=True)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the pool this store opened from `dsn=` (a caller's pool is left alone). Idempotent."""
        if self._owns:
            await self._connections.aclose()

    # -- schema -------------------------------------------------------------------------------------

    async def _ensure(self, conn: PostgresConnection, *, create: bool) -> bool:
        """Whether the table exists (with this release's columns, added if missing); created if asked."""
        if self._ready or (self._legacy and not create):
            return True
        columns = await self._columns(conn)
        if not columns and not create:
            return False
        check_blob_table(self._table, columns)
        if columns >= {'stored_at', 'chunks'}:
            self._ready, self._legacy = True, False
            return True
        if not create:  # upstream's table: read it as it is, widen it on the first write
            self._legacy = True
            return True
        t = self._table
        async with conn.transaction():
            await conn.execute('SELECT pg_advisory_xact_lock(hashtext($1))', f'pydantic_ai_steps:media:{t}')
            await conn.execute(
                f'CREATE TABLE IF NOT EXISTS {t} (sha256 text PRIMARY KEY, media_type text, bytes bytea NOT NULL, '
                'size_bytes bigint NOT NULL, metadata text, stored_at timestamptz NOT NULL DEFAULT now(), '
                'chunks integer);\n'
                f'ALTER TABLE {t} ADD COLUMN IF NOT EXISTS stored_at timestamptz NOT NULL DEFAULT now();\n'
                f'ALTER TABLE {t} ADD COLUMN IF NOT EXISTS chunks integer;\n'
                f'CREATE TABLE IF NOT EXISTS {self._chunks} (sha256 text NOT NULL, idx integer NOT NULL, '
                'data bytea NOT NULL, PRIMARY KEY (sha256, idx))'
            )
        self._ready, self._legacy = True, False
        return True

    async def _columns(self, conn: PostgresConnection) -> set[str]:
        rows = await conn.fetch(
            'SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid '
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = $1 AND c.relkind IN ('r', 'p') "
            'AND a.attnum > 0 AND NOT a.attisdropped',
            self._table,
        )
        return {str(row[0]) for row in rows}
