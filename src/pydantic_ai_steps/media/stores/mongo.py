"""`MongoMediaStore`: blobs in MongoDB as a manifest document plus chunk documents, so any size fits.

Layout (the upstream package's, with one addition, `chunk_set`):

- Manifest, in `collection` (default `media`): `{_id: <sha256 hex>, media_type, size_bytes,
  chunk_count, chunk_size, chunk_set, metadata (JSON text), stored_at}`. Metadata is JSON text, not
  nested fields, so its keys follow no BSON field-name rule; keep it small (the manifest is one
  document, 16 MiB at most: a larger one is refused before anything is sent).
- Chunks, in `<collection>_chunks`: `{_id: "<hex>:<chunk_size>:<n>:<chunk_set>", files_id: <hex>,
  chunk_size, n, chunk_set, data}`, `n` from 0, `data` a BSON binary of at most `chunk_size_bytes`
  (8 MiB by default, 16 MiB - 64 KiB at most). Index `(files_id, n)`, created by the first put.

Why `chunk_set`: each put writes its chunks under a fresh set id and the manifest names the set.
Garbage collection deletes a manifest (only if nobody put the blob since, atomically) and then the
chunks of the set that manifest named, so a put of the same bytes racing the deletion writes a
set of its own and never loses its chunks to it. Manifests and chunks written by the upstream
package have no `chunk_set`: their chunks are found by `files_id` and `chunk_size` as it wrote them.

`put`: if a manifest exists, its `stored_at` is refreshed (one round trip; the first put's
media type and metadata stay). Otherwise the chunks, then the manifest (an upsert, so the first of
two concurrent puts wins and the other removes its own chunks), in one client-level `bulkWrite`
(MongoDB 8.0+; pymongo splits it in messages of 48 MB; older servers get one `insert_many` and
one `update_one`). A put cut short leaves chunks no manifest names: never read, never listed, and
removed by a collection an hour later (`tidy_orphan_chunks`), as are the spare chunks of a put that
lost the race and was killed before removing them, and those of a delete killed between its two steps.
`get` reads the manifest and the chunks, checks their number and sizes, and checks the bytes
against the digest: a mismatch raises `MediaIntegrityError` (a `FileNotFoundError`). The whole
blob is held in memory on both sides: chunking bounds documents, not memory.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeGuard

import anyio.to_thread
from bson import Binary, ObjectId
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection

from ..._closing import AsyncClosing
from ..._errors import RecordTooLargeError
from ..._files import STALE_TEMP_SECONDS
from ..._mongo import (
    MAX_DOCUMENT_BYTES,
    ClientHandle,
    Document,
    MongoClient,
    Write,
    Writer,
    check_database_name,
    checked_document,
    collection,
    reports_unreachable,
)
from ..._records import utc_now
from ...store.maintenance import BlobInfo
from .._context import EMPTY_CONTEXT, MediaContext
from .._errors import MediaIntegrityError
from .._protocol import (
    PublicUrlResolver,
    check_stored_before,
    decode_metadata,
    encode_metadata,
    resolve_public_url,
)
from .._uri import parse_media_uri, uri_for_digest

__all__ = ['MongoMediaStore']

_COLLECTION_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
MAX_CHUNK_BYTES = MAX_DOCUMENT_BYTES - 64 * 1024
_HASH_INLINE_BYTES = 1 << 20
"""Payloads up to this size are hashed on the event loop; larger ones on a worker thread."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DIGESTS_PER_LOOKUP = 500


@reports_unreachable('_handle')
class MongoMediaStore(AsyncClosing):
    """A `MediaStore` keeping each blob as a manifest and chunks in MongoDB (see the module docs).

    ```python
    from pydantic_ai_steps.media import MongoMediaStore

    media = MongoMediaStore(db_url='mongodb://localhost:27017', database='app')
    ```

    Give exactly one of `client=` (a pymongo `AsyncMongoClient` you own and close) or `db_url=`
    (the store opens its own client and `aclose()` closes it). `collection` names the manifest
    collection (chunks go to `<collection>_chunks`); `chunk_size_bytes` is the size of each chunk.
    """

    def __init__(
        self,
        client: MongoClient | None = None,
        *,
        db_url: str | None = None,
        database: str,
        collection: str = 'media',
        chunk_size_bytes: int = DEFAULT_CHUNK_BYTES,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        handle = ClientHandle(client, db_url, 'MongoMediaStore')
        self._init(handle, database, collection, chunk_size_bytes, public_url)

    @classmethod
    def sharing(cls, handle: ClientHandle, *, database: str) -> MongoMediaStore:
        """The default media store of a `MongoStepStore`: its client, which this store never closes."""
        store = cls.__new__(cls)
        store._init(handle, database, 'media', DEFAULT_CHUNK_BYTES, None)
        store._borrowed = True
        return store

    def _init(
        self,
        handle: ClientHandle,
        database: str,
        collection_name: str,
        chunk_size_bytes: int,
        public_url: PublicUrlResolver | None,
    ) -> None:
        self._database = check_database_name(database, 'MongoMediaStore')
        if not isinstance(collection_name, str) or not _COLLECTION_NAME.fullmatch(collection_name):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'invalid collection name: {collection_name!r}; expected [A-Za-z_][A-Za-z0-9_]*')
        if isinstance(chunk_size_bytes, bool) or not isinstance(chunk_size_bytes, int) or chunk_size_bytes < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'chunk_size_bytes must be a positive int, got {chunk_size_bytes!r}')
        if chunk_size_bytes > MAX_CHUNK_BYTES:
            raise ValueError(
                f'chunk_size_bytes must be at most {MAX_CHUNK_BYTES} (16 MiB - 64 KiB, so a chunk fits in a '
                f'BSON document), got {chunk_size_bytes}'
            )
        self._handle = handle
        self._borrowed = False
        self._collection = collection_name
        self._chunks = f'{collection_name}_chunks'
        self.chunk_size_bytes = chunk_size_bytes
        self._public_url = public_url
        self._writer = Writer(handle, self._database)
        self._indexed = False

    def __repr__(self) -> str:
        where = 'client=<shared with its step store>' if self._borrowed else self._handle.describe()
        return f'MongoMediaStore({where}, database={self._database!r}, collection={self._collection!r})'

    @property
    def database(self) -> str:
        return self._database

    @property
    def collection(self) -> str:
        return self._collection

    def _manifests(self) -> AsyncCollection[Document]:
        return collection(self._handle.database(self._database), self._collection)

    def _chunk_collection(self) -> AsyncCollection[Document]:
        return collection(self._handle.database(self._database), self._chunks)

    # --- the MediaStore protocol -------------------------------------------------------------

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        data = bytes(data)
        digest = await _sha256(data)
        uri = uri_for_digest(digest)
        now = _stamp()
        if (await self._manifests().update_one({'_id': digest}, {'$set': {'stored_at': now}})).matched_count:
            return uri  # stored already: refreshed for garbage collection, its first metadata kept
        manifest: Document = {
            'media_type': context.media_type,
            'size_bytes': len(data),
            'chunk_count': -(-len(data) // self.chunk_size_bytes),
            'chunk_size': self.chunk_size_bytes,
            'chunk_set': str(ObjectId()),
            'metadata': encode_metadata(context.metadata),
        }
        try:
            checked_document({'_id': digest, **manifest, 'stored_at': now}, f'the manifest of media {uri}')
        except RecordTooLargeError as error:
            raise RecordTooLargeError(f'{error}; keep MediaContext.metadata small') from None
        if not self._indexed:
            await self._chunk_collection().create_indexes([IndexModel([('files_id', ASCENDING), ('n', ASCENDING)])])
            self._indexed = True
        chunk_set, size = manifest['chunk_set'], self.chunk_size_bytes
        writes = [
            Write(
                self._chunks,
                'insert',
                {
                    '_id': f'{digest}:{size}:{n}:{chunk_set}',
                    'files_id': digest,
                    'chunk_size': size,
                    'n': n,
                    'chunk_set': chunk_set,
                    'data': Binary(data[offset : offset + size]),
                },
                role='chunk',
            )
            for n, offset in enumerate(range(0, len(data), size))
        ]
        writes.append(
            Write(
                self._collection,
                'update',
                {'_id': digest},
                {'$setOnInsert': manifest, '$set': {'stored_at': now}},
                upsert=True,
                role='manifest',
            )
        )
        await self._writer.apply(writes)
        if writes[:-1]:
            stored = await self._manifests().find_one({'_id': digest}, projection={'chunk_set': 1})
            if stored is not None and stored.get('chunk_set') != chunk_set:  # another put won: ours are spare
                await self._chunk_collection().delete_many({'files_id': digest, 'chunk_set': chunk_set})
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = parse_media_uri(uri)
        manifest = await self._manifests().find_one({'_id': digest})
        if manifest is None:
            raise FileNotFoundError(f'media not found: {uri}')
        count, size = manifest.get('chunk_count'), manifest.get('size_bytes')
        if not _is_int(count) or count < 0:
            raise ValueError(f'media manifest for {uri} has wrong types: chunk_count is {count!r}')
        chunks = (
            await self._chunk_collection()
            .find(_chunk_filter(digest, manifest, count), sort=[('n', ASCENDING)])
            .to_list()
        )
        parts: list[bytes] = []
        numbers: list[object] = []
        for chunk in chunks:
            piece = chunk.get('data')
            if not isinstance(piece, bytes):
                raise ValueError(
                    f'media chunk {chunk.get("_id")!r} of {uri} has wrong types: data is {type(piece).__name__}'
                )
            parts.append(piece)
            numbers.append(chunk.get('n'))
        data = b''.join(parts)
        details: list[str] = []
        if numbers != list(range(count)):
            details.append(f'it has {len(numbers)} of its {count} chunks')
        if _is_int(size) and size != len(data):
            details.append(f'its chunks hold {len(data)} of {size} bytes')
        if details or await _sha256(data) != digest:
            where = f'in collection {self._chunks!r}'
            raise MediaIntegrityError.damaged(uri, len(data), where, '; '.join(details))
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        digest = parse_media_uri(uri)
        return await self._manifests().find_one({'_id': digest}, projection={'_id': 1}) is not None

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        digest = parse_media_uri(uri)
        manifest = await self._manifests().find_one({'_id': digest}, projection={'metadata': 1})
        if manifest is None:
            raise FileNotFoundError(f'media not found: {uri}')
        raw = manifest.get('metadata', '{}')
        if not isinstance(raw, str):
            raise ValueError(f'media manifest for {uri} has wrong types: metadata is {type(raw).__name__}')
        try:
            return decode_metadata(raw)
        except ValueError as error:
            raise ValueError(f'unreadable metadata for {uri} in collection {self._collection!r}: {error}') from error

    # --- garbage collection (store.maintenance.CollectableMediaStore) ----------------------------

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob with its size and when it was last put; nothing is written.

        A manifest written by the upstream package has no `stored_at`: it is listed as put just now,
        never collectable, until a collection dates it (`prepare_collection`).
        """
        manifests = self._manifests()
        now = _stamp()
        async for manifest in manifests.find(
            {}, projection={'size_bytes': 1, 'stored_at': 1}, sort=[('_id', ASCENDING)]
        ):
            digest, size, stored_at = manifest['_id'], manifest.get('size_bytes'), manifest.get('stored_at')
            if isinstance(digest, str) and len(digest) == 64:
                yield BlobInfo(
                    uri=uri_for_digest(digest),
                    size=size if _is_int(size) else 0,
                    stored_at=stored_at if isinstance(stored_at, datetime) else now if stored_at is None else _EPOCH,
                )

    async def prepare_collection(self) -> None:
        """Stamp the upstream package's manifests (no `stored_at`) with the time now, as if put now:
        collectable one grace period later, never at once (an upstream writer may be about to reference one).
        Then remove the chunk sets killed puts and deletes left (`tidy_orphan_chunks`)."""
        await self._manifests().update_many({'stored_at': {'$exists': False}}, {'$set': {'stored_at': _stamp()}})
        await tidy_orphan_chunks(self._manifests(), self._chunk_collection())

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """Remove the blob; with `stored_before`, only if nobody put it since (checked as it is deleted)."""
        digest = parse_media_uri(uri)
        cutoff = check_stored_before(stored_before)
        selector: Document = {'_id': digest}
        if cutoff is not None:
            selector['stored_at'] = {'$lt': cutoff}
        manifest = await self._manifests().find_one_and_delete(selector)
        if manifest is None:
            return False
        await self._chunk_collection().delete_many(_chunk_filter(digest, manifest, None))
        return True

    # --- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the client this store opened (`db_url=`); a caller's or a step store's is left open."""
        if not self._borrowed:
            await self._handle.aclose()


async def tidy_orphan_chunks(manifests: AsyncCollection[Document], chunks: AsyncCollection[Document]) -> int:
    """Remove the chunk sets no manifest names that were made over an hour ago; how many sets went.

    Never a chunk that is or will be read: a set is removed only if no manifest names it, and the
    only manifest that can ever name a set is the one its own put writes (`$setOnInsert`, with the
    set id that put drew). The set id is an ObjectId, stamped when that put began: an hour later
    (`STALE_TEMP_SECONDS`, as for `DiskMediaStore`'s temporary files) its put has long written its
    manifest or died, so a put in flight is never touched. Chunks without a `chunk_set` (the
    upstream package's) are never looked at.

    Cost: one pass over the chunks' `_id` index, which names digest, chunk size, number and set
    (`{_id: 1}` only, so MongoDB answers from the index and reads no chunk's data: some 100 bytes a
    chunk), one manifest lookup by `_id` for each 500 digests, and one delete per orphan set.
    """
    stale_before = utc_now() - timedelta(seconds=STALE_TEMP_SECONDS)
    removed = 0
    pending: dict[str, set[str]] = {}

    async def settle() -> None:
        nonlocal removed
        named = {
            manifest['_id']: manifest.get('chunk_set')
            async for manifest in manifests.find({'_id': {'$in': list(pending)}}, projection={'chunk_set': 1})
        }
        for digest, sets in pending.items():
            for chunk_set in sets - {named.get(digest)}:
                await chunks.delete_many({'files_id': digest, 'chunk_set': chunk_set})
                removed += 1
        pending.clear()

    ids = chunks.find({'_id': {'$type': 'string'}}, projection={'_id': 1}, sort=[('_id', ASCENDING)])
    async for chunk in ids:
        digest, _, rest = chunk['_id'].partition(':')
        chunk_set = rest.rpartition(':')[2]
        if len(digest) != 64 or rest.count(':') != 2 or not ObjectId.is_valid(chunk_set):
            continue  # not a chunk of a set (the upstream package's)
        if ObjectId(chunk_set).generation_time >= stale_before:
            continue  # its put may still be running
        if digest not in pending and len(pending) >= _DIGESTS_PER_LOOKUP:
            await settle()
        pending.setdefault(digest, set()).add(chunk_set)
    if pending:
        await settle()
    return removed


def _chunk_filter(digest: str, manifest: Mapping[str, Any], count: int | None) -> Document:
    selector: Document = {'files_id': digest}
    chunk_set = manifest.get('chunk_set')
    if chunk_set is not None:
        selector['chunk_set'] = chunk_set
    else:  # written by the upstream package: chunks keyed by the chunk size, or (older) without it
        size = manifest.get('chunk_size')
        selector['chunk_size'] = size if size is not None else {'$exists': False}
        selector['chunk_set'] = {'$exists': False}
    if count is not None:
        selector['n'] = {'$lt': count}
    return selector


def _stamp() -> datetime:
    """Now, rounded up to BSON's millisecond: a stored `stored_at` is never earlier than the put it records,
    so a collection cutoff taken in the same millisecond cannot find a blob just put older than itself."""
    now = utc_now()
    rest = now.microsecond % 1000
    return now + timedelta(microseconds=1000 - rest) if rest else now


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


async def _sha256(data: bytes) -> str:
    if len(data) <= _HASH_INLINE_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await anyio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest())
