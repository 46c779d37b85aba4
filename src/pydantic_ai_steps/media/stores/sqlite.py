"""`SqliteMediaStore`: blobs in a SQLite table, one row per blob keyed by the SHA-256 digest.

Connection handling, chosen for simplicity and speed: with `database=` the store opens **one**
connection, lazily, inside a worker thread (`check_same_thread=False`, autocommit, WAL,
`timeout=30`), keeps it for its lifetime and serializes every call on it with a lock. Reopening
per call would pay a connect and a `PRAGMA journal_mode` round trip each time for no gain:
`sqlite3` runs one statement at a time per connection anyway, and blob calls are few and large.
`close()` / `aclose()` (or leaving `async with store:`) release it; closing twice is a no-op,
and a later call reopens it. With `connection=` the caller's connection is used as it is and
never closed; calls through this store are serialized with the store's own lock, so coordinate
with other users of that connection yourself.

Every blocking call runs through `anyio.to_thread.run_sync`, which is why a caller's connection
must have been opened with `check_same_thread=False`; the constructor checks and says so.

Writes are `INSERT OR IGNORE`: the first put of a payload fixes its `media_type` and metadata.
A put commits only when the connection had no transaction open before it, so a caller's own
transaction (or a Python 3.12 `autocommit=False` connection) decides when the row lands.

Each row's `stored_at` (REAL, seconds since the epoch) says when its blob was last put: a put of
bytes already stored writes nothing but an `UPDATE` of that column, so garbage collection never
takes a blob that a writer has just put again. A row without one (an older table's, or a put of
the upstream package, which sets none even in a widened table) lists as just put, and a
collection dates it (`prepare_collection`, which widens an older table first): it becomes
collectable one grace period later, never while the writer that put it may be about to
reference it. `delete(uri, stored_before=t)` removes the row, and its chunk rows, in one write
transaction (a savepoint inside a caller's), with `DELETE ... WHERE sha256 = ? AND stored_at <
?`: a put committed before it keeps the blob, a put after it stores the blob again, and a row
without a put time is kept, as the listing and MongoDB's manifests have it. `list_blobs` reads
the table in pages of `sha256` order, releasing the lock between pages.

Large payloads are stored in chunks. A payload's digest names its row, and hashing costs about
as much as writing, so a payload larger than `chunk_bytes` (1 MiB) is written as 1 MiB rows of
`<table>_chunks` under a fresh `blob_id` while a helper thread hashes it (both release the GIL),
and the blob's row, added in the same transaction, holds an empty `bytes` and that `blob_id`. If
the digest turns out to be stored already, the chunks are rolled back (to a savepoint) and the
stored row only gets its `stored_at` refreshed, in the same transaction. Chunks also write faster
than one huge row: SQLite copies a bound value whole and builds the record in memory before it
writes a page. Rows with a NULL `blob_id` (every row of older layouts) hold their bytes inline.

`get` checks what it read against the URI's digest, after releasing the lock, and raises
`MediaIntegrityError` (a `FileNotFoundError`) when they differ: a damaged row or chunk reads as a
missing blob. A chunked blob's chunks are hashed on a helper thread as SQLite reads them.
`exists` only looks for the row.

Durability: on its own connection the store writes with `synchronous=NORMAL` in WAL mode, like
`SqliteStepStore`: a put that returned survives a process crash, and power loss may roll back
the last puts but never corrupts the database. `durable=True` uses `synchronous=FULL` (each commit
flushed to disk before `put` returns); `SqliteStepStore(durable=True)` passes that on.

Large puts and the WAL checkpoint: a committed row sits in the `-wal` file until a checkpoint
copies it into the database file, and SQLite runs that checkpoint on the committing connection
once the WAL passes `wal_autocheckpoint` pages (1000 by default), i.e. inside the put that
crossed it. A large blob always crosses it, and copying (and syncing) it a second time would
cost a put about as much again. So when the store owns a file connection and commits a payload
of `deferred_checkpoint_bytes` (4 MiB) or more itself, that commit runs with the automatic
checkpoint off and a `PRAGMA wal_checkpoint(PASSIVE)` follows on a background thread through a
short-lived connection of its own (it never blocks writers or readers). `close()` waits for a
pending checkpoint. A caller's `connection=` is left with its own settings, except that
`durable=True` sets `synchronous=FULL` on it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Mapping
from datetime import datetime

import anyio.to_thread

from ..._sqlite import WriteTransaction
from ...store.maintenance import BlobInfo
from .._context import EMPTY_CONTEXT, MediaContext
from .._errors import MediaIntegrityError
from .._protocol import (
    PublicUrlResolver,
    check_stored_before,
    decode_metadata,
    encode_metadata,
    resolve_public_url,
    utc_from_timestamp,
)
from .._uri import parse_media_uri, uri_for_digest
from ._sha256 import Sha256Feed, Sha256Thread
from ._sqlite_connection import COLUMNS, SqliteMediaConnection

__all__ = ['SqliteMediaStore']

_SAVEPOINT = 'pydantic_ai_steps_media_put'
_CHUNKS_SAVEPOINT = 'pydantic_ai_steps_media_chunks'
_DELETE_SAVEPOINT = 'pydantic_ai_steps_media_delete'
_DATE_SAVEPOINT = 'pydantic_ai_steps_media_date'
_DIGEST = re.compile(r'[0-9a-f]{64}')
_LIST_BATCH = 1000
"""`list_blobs` reads this many rows per turn of the lock."""


class SqliteMediaStore(SqliteMediaConnection):
    """A `MediaStore` keeping blobs in a SQLite table keyed by SHA-256, large ones in chunk rows.

    Give exactly one of `database=` (a path; the store owns the connection) or `connection=` (a
    `sqlite3.Connection` opened with `check_same_thread=False`; the caller owns it). `table` must
    be a plain identifier. The table (and `<table>_chunks` for large blobs) is created on first
    use; a table from an older layout gets its missing `media_type` / `metadata` / `blob_id` /
    `stored_at` columns added. `durable=True` flushes every put to disk before it returns.
    `lock=` is for a store sharing a connection with another user of it (`SqliteStepStore` on an
    in-memory database): both then take turns on it.

    `list_blobs()` and `delete()` serve media garbage collection (see the module docs). Rows whose
    `sha256` is not a 64-lowercase-hex digest (written by other code) are not listed.
    """

    chunk_bytes: int = 1 << 20
    """Payloads larger than this are stored as rows of this size in `<table>_chunks`, written while a
    helper thread hashes them (see the module docs)."""

    def __init__(
        self,
        *,
        database: str | os.PathLike[str] | None = None,
        connection: sqlite3.Connection | None = None,
        table: str = 'media',
        public_url: PublicUrlResolver | None = None,
        durable: bool = False,
        lock: threading.Lock | None = None,
    ) -> None:
        super().__init__(database=database, connection=connection, table=table, durable=durable, lock=lock)
        self._public_url = public_url

    def __repr__(self) -> str:
        where = f'database={self._database!r}' if self._database is not None else 'connection=<caller-owned>'
        return f'{type(self).__name__}({where}, table={self._table!r})'

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        return await self._run(lambda conn: self._put_sync(conn, data, context))

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = parse_media_uri(uri)
        return await anyio.to_thread.run_sync(self._get_verified, digest, uri)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        digest = parse_media_uri(uri)
        return await self._read(lambda conn, columns: self._exists_sync(conn, digest, columns))

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        digest = parse_media_uri(uri)
        return await self._read(lambda conn, columns: self._metadata_sync(conn, digest, uri, columns))

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob in the table, with its size and when it was last put (`stored_at`, UTC)."""
        after: object = ''  # other code's rows may hold a BLOB there, which sorts after every text
        while True:
            rows = await self._read(lambda conn, columns, after=after: self._page_sync(conn, after, columns))
            for digest, size, stored_at in rows:
                if isinstance(digest, str) and _DIGEST.fullmatch(digest):
                    yield BlobInfo(uri=uri_for_digest(digest), size=size, stored_at=utc_from_timestamp(stored_at))
            if len(rows) < _LIST_BATCH:
                return
            after = rows[-1][0]

    async def prepare_collection(self) -> None:
        """Date the rows that have no put time now (see the module docs), widening an older table
        (a collection writes anyway): otherwise its rows would list as just put for good."""
        if await self._read(_has_table):
            await self._run(self._date_sync)

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """Remove the blob and its chunks; with `stored_before`, only if it was not put at or after it.

        `True` if a blob was removed; `False` if there was none, or it was put since. Inside a
        caller's transaction on `connection=`, the removal lands (or not) with its commit.
        """
        digest = parse_media_uri(uri)
        cutoff = check_stored_before(stored_before)
        before = None if cutoff is None else cutoff.timestamp()
        return await self._read(lambda conn, columns: self._delete_sync(conn, digest, before, columns))

    # -- blocking bodies, run on a worker thread under the lock -------------------------------------

    def _put_sync(self, conn: sqlite3.Connection, data: bytes, context: MediaContext) -> str:
        if len(data) > self.chunk_bytes:
            return uri_for_digest(self._put_chunked(conn, data, context))
        digest = hashlib.sha256(data).hexdigest()
        had_transaction = conn.in_transaction
        now = time.time()
        # Refreshing first spares binding (and copying) a payload that is already stored;
        # INSERT OR IGNORE still settles a race with another writer of the same bytes.
        if self._refresh_sync(conn, digest, now):
            if not had_transaction and conn.in_transaction:
                conn.commit()
        else:
            with self._checkpoint_deferred(conn, len(data)):
                conn.execute(
                    f'INSERT OR IGNORE INTO "{self._table}" '
                    '(sha256, media_type, bytes, size_bytes, metadata, stored_at) VALUES (?, ?, ?, ?, ?, ?)',
                    (digest, context.media_type, data, len(data), encode_metadata(context.metadata), now),
                )
                if not had_transaction and conn.in_transaction:
                    conn.commit()
        return uri_for_digest(digest)

    def _put_chunked(self, conn: sqlite3.Connection, data: bytes, context: MediaContext) -> str:
        """Write `data` as chunk rows while a helper thread hashes it, then add the blob's row.

        The digest names the row, so the chunks go under a fresh `blob_id` that the row then
        points to; if a row of that digest exists by then, the chunks are rolled back and the
        stored blob is left as it is (first put wins), its `stored_at` refreshed.
        """
        hashing = Sha256Thread(data)
        try:
            with self._checkpoint_deferred(conn, len(data)), WriteTransaction(conn, _SAVEPOINT):
                conn.execute(f'SAVEPOINT {_CHUNKS_SAVEPOINT}')
                (blob_id,) = conn.execute(f'SELECT coalesce(max(blob_id), 0) + 1 FROM "{self._chunks}"').fetchone()
                view, step = memoryview(data), self.chunk_bytes
                conn.executemany(
                    f'INSERT INTO "{self._chunks}" (blob_id, idx, data) VALUES (?, ?, ?)',
                    (
                        (blob_id, index, view[offset : offset + step])
                        for index, offset in enumerate(range(0, len(data), step))
                    ),
                )
                digest = hashing.hexdigest()
                # The chunks took the write lock: nothing can delete or add this row until the commit.
                if self._exists_sync(conn, digest, COLUMNS):
                    conn.execute(f'ROLLBACK TO {_CHUNKS_SAVEPOINT}')
                    conn.execute(f'RELEASE {_CHUNKS_SAVEPOINT}')
                    self._refresh_sync(conn, digest, time.time())
                else:
                    conn.execute(f'RELEASE {_CHUNKS_SAVEPOINT}')
                    conn.execute(
                        f'INSERT INTO "{self._table}" '
                        '(sha256, media_type, bytes, size_bytes, metadata, blob_id, stored_at) '
                        'VALUES (?, ?, ?, ?, ?, ?, ?)',
                        (
                            digest,
                            context.media_type,
                            b'',
                            len(data),
                            encode_metadata(context.metadata),
                            blob_id,
                            time.time(),
                        ),
                    )
        finally:
            hashing.join()
        return hashing.hexdigest()

    def _get_verified(self, digest: str, uri: str) -> bytes:
        """Read the blob under the lock, then check it against `digest` once the lock is released."""
        with self._lock, self._lock_waits_named():
            conn = self._open()
            stored = self._get_sync(conn, digest, uri, self._columns(conn))
        if isinstance(stored, bytes):
            data, actual, detail = stored, hashlib.sha256(stored).hexdigest(), ''
        else:
            chunks, feed, size = stored
            data, actual = b''.join(chunks), feed.hexdigest()
            detail = f'its chunks hold {len(data)} of {size} bytes' if len(data) != size else ''
        if actual != digest:
            raise MediaIntegrityError.damaged(uri, len(data), f'in table {self._table!r}', detail)
        return data

    def _get_sync(
        self, conn: sqlite3.Connection, digest: str, uri: str, columns: frozenset[str]
    ) -> bytes | tuple[list[bytes], Sha256Feed, int]:
        """An inline row's bytes, or a chunked blob's chunks with their digest being computed and the row's size."""
        row = None
        if columns:
            query = f'SELECT bytes, {_column(columns, "blob_id")}, size_bytes FROM "{self._table}" WHERE sha256 = ?'
            row = conn.execute(query, (digest,)).fetchone()
        if row is None:
            raise FileNotFoundError(f'media not found: {uri}')
        value: object = row[0]
        if not isinstance(value, bytes):
            raise ValueError(f'media row for {uri} has wrong types: bytes column holds {type(value).__name__}')
        blob_id, size = row[1], row[2]
        if blob_id is None:
            return value
        # Each chunk is hashed on a helper thread while SQLite reads the next one: verifying a
        # chunked read costs little more than the read (measured: 70 ms instead of 100 for 64 MiB).
        feed = Sha256Feed()
        chunks: list[bytes] = []
        try:
            query = f'SELECT data FROM "{self._chunks}" WHERE blob_id = ? ORDER BY idx'
            for (chunk,) in conn.execute(query, (blob_id,)):
                feed.update(chunk)
                chunks.append(chunk)
        except BaseException:
            feed.close()
            raise
        return chunks, feed, size

    def _refresh_sync(self, conn: sqlite3.Connection, digest: str, now: float) -> bool:
        """Mark a stored blob as put `now`; `False` if there is no such row."""
        query = f'UPDATE "{self._table}" SET stored_at = ? WHERE sha256 = ?'
        return conn.execute(query, (now, digest)).rowcount > 0

    def _page_sync(
        self, conn: sqlite3.Connection, after: object, columns: frozenset[str]
    ) -> list[tuple[object, int, float]]:
        """`(sha256, size, stored_at)` of the next rows after `after`; a row without a put time reads as put now."""
        rows: list[tuple[object, int, float]] = []
        if not columns:
            return rows
        stored = _column(columns, 'stored_at')
        query = f'SELECT sha256, size_bytes, {stored} FROM "{self._table}" WHERE sha256 > ? ORDER BY sha256 LIMIT ?'
        for digest, size, stored_at in conn.execute(query, (after, _LIST_BATCH)):
            put_at = stored_at if isinstance(stored_at, int | float) else time.time()
            rows.append((digest, size if isinstance(size, int) else 0, float(put_at)))
        return rows

    def _date_sync(self, conn: sqlite3.Connection) -> None:
        with WriteTransaction(conn, _DATE_SAVEPOINT):
            conn.execute(f'UPDATE "{self._table}" SET stored_at = ? WHERE stored_at IS NULL', (time.time(),))

    def _delete_sync(
        self, conn: sqlite3.Connection, digest: str, before: float | None, columns: frozenset[str]
    ) -> bool:
        if not columns:
            return False
        stored = _column(columns, 'stored_at')
        condition, parameters = ('', (digest,)) if before is None else (f' AND {stored} < ?', (digest, before))
        with WriteTransaction(conn, _DELETE_SAVEPOINT):
            row = conn.execute(
                f'SELECT {_column(columns, "blob_id")} FROM "{self._table}" WHERE sha256 = ?{condition}', parameters
            ).fetchone()
            if row is None:
                return False
            conn.execute(f'DELETE FROM "{self._table}" WHERE sha256 = ?{condition}', parameters)
            if row[0] is not None:
                conn.execute(f'DELETE FROM "{self._chunks}" WHERE blob_id = ?', (row[0],))
        return True

    def _exists_sync(self, conn: sqlite3.Connection, digest: str, columns: frozenset[str]) -> bool:
        return (
            bool(columns)
            and conn.execute(f'SELECT 1 FROM "{self._table}" WHERE sha256 = ?', (digest,)).fetchone() is not None
        )

    def _metadata_sync(
        self, conn: sqlite3.Connection, digest: str, uri: str, columns: frozenset[str]
    ) -> dict[str, str]:
        row = None
        if columns:
            query = f'SELECT {_column(columns, "metadata")} FROM "{self._table}" WHERE sha256 = ?'
            row = conn.execute(query, (digest,)).fetchone()
        if row is None:
            raise FileNotFoundError(f'media not found: {uri}')
        raw: object = row[0]
        if raw is None:  # rows written by other code may leave it NULL: no metadata
            return {}
        try:
            return decode_metadata(raw)
        except ValueError as exc:
            raise ValueError(f'unreadable metadata for {uri} in table {self._table!r}: {exc}') from exc


def _column(columns: frozenset[str], name: str) -> str:
    """`name`, or `NULL` in a table from before that column (a read never adds it)."""
    return name if name in columns else 'NULL'


def _has_table(conn: sqlite3.Connection, columns: frozenset[str]) -> bool:
    del conn
    return bool(columns)
