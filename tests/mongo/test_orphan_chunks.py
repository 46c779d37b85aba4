"""`MongoMediaStore.prepare_collection` (a real collection's first step) removes the chunk sets killed
puts and deletes left, once they are an hour old; never a set a manifest names, a put in flight's,
or the upstream package's chunks."""

from __future__ import annotations

import hashlib
import os
import struct
import time
from typing import Any

import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient

from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.media.stores import mongo as mongo_media

pytestmark = pytest.mark.anyio
Client = AsyncMongoClient[dict[str, Any]]


def set_id(age_seconds: float) -> ObjectId:
    """A chunk set id drawn `age_seconds` ago (an ObjectId carries the time it was made)."""
    return ObjectId(struct.pack('>I', int(time.time() - age_seconds)) + os.urandom(8))


async def put_under(media: MongoMediaStore, data: bytes, chunk_set: ObjectId, monkeypatch: pytest.MonkeyPatch) -> str:
    """`media.put(data)`, its chunk set drawn as `chunk_set`: a put that began when that id was made."""
    with monkeypatch.context() as patched:
        patched.setattr(mongo_media, 'ObjectId', lambda: chunk_set)
        return await media.put(data)


async def chunk_sets(client: Client, database: str) -> dict[str, list[object]]:
    """Each digest's chunk sets, sorted (`None`: chunks without a set)."""
    found: dict[str, set[object]] = {}
    async for chunk in client[database].media_chunks.find({}, projection={'files_id': 1, 'chunk_set': 1}):
        found.setdefault(chunk['files_id'], set()).add(chunk.get('chunk_set'))
    return {digest: sorted(sets, key=str) for digest, sets in found.items()}


@pytest.mark.parametrize('per_lookup', [500, 1], ids=['one manifest lookup', 'a lookup per digest'])
async def test_old_chunk_sets_no_manifest_names_are_removed_and_nothing_else(
    client: Client, database_name: str, monkeypatch: pytest.MonkeyPatch, per_lookup: int
) -> None:
    monkeypatch.setattr(mongo_media, '_DIGESTS_PER_LOOKUP', per_lookup)
    hour_and_more, minutes = 3600 + 120, 10 * 60
    database = client[database_name]
    media = MongoMediaStore(client, database=database_name, chunk_size_bytes=4)
    # A blob put two hours ago, still named by its manifest; the loser of a race for the same bytes
    # was killed before it removed its spare chunks.
    kept_set, spare_set = set_id(hour_and_more), set_id(hour_and_more)
    kept = await put_under(media, b'kept blob', kept_set, monkeypatch)
    kept_digest = kept.rpartition('/')[2]
    spares = await database.media_chunks.find({'chunk_set': str(kept_set)}).to_list()
    await database.media_chunks.insert_many(
        [
            {**chunk, '_id': chunk['_id'].replace(str(kept_set), str(spare_set)), 'chunk_set': str(spare_set)}
            for chunk in spares
        ]
    )
    # A put cut short after its chunks (no manifest), and a delete killed after removing its manifest.
    cut = await put_under(media, b'cut short put', set_id(hour_and_more), monkeypatch)
    deleted = await put_under(media, b'half deleted', set_id(hour_and_more), monkeypatch)
    for uri in (cut, deleted):
        await database.media.delete_one({'_id': uri.rpartition('/')[2]})
    # A put in flight: its chunks written ten minutes ago, its manifest not yet.
    flight = await put_under(media, b'put in flight', set_id(minutes), monkeypatch)
    flight_digest = flight.rpartition('/')[2]
    flight_set = (await database.media.find_one_and_delete({'_id': flight_digest}) or {})['chunk_set']
    # The upstream package's chunks (no chunk set), even without a manifest, are not this tidy's.
    upstream = hashlib.sha256(b'upstream').hexdigest()
    await database.media_chunks.insert_one(
        {'_id': f'{upstream}:4:0', 'files_id': upstream, 'chunk_size': 4, 'n': 0, 'data': b'upst'}
    )

    await media.prepare_collection()

    assert await chunk_sets(client, database_name) == {
        kept_digest: [str(kept_set)],
        flight_digest: [flight_set],
        upstream: [None],
    }
    assert await media.get(kept) == b'kept blob'
    assert await database.media_chunks.count_documents({'files_id': kept_digest}) == 3  # 9 bytes, 4 a chunk
