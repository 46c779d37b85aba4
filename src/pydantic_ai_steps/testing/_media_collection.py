"""Conformance: a media store lists and deletes its blobs, as media garbage collection needs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import anyio
import pytest

from ..media import MediaContext, MediaStore, media_uri_for
from ..store.maintenance import BlobInfo, CollectableMediaStore

MALFORMED_URIS = (
    '',
    'sha256://' + 'a' * 64,
    'media+sha256://',
    'media+sha256://' + 'a' * 63,
    'media+sha256://' + 'a' * 65,
    'media+sha256://' + 'A' * 64,
    'media+sha256://' + 'g' * 64,
    'MEDIA+SHA256://' + 'a' * 64,
    'media+sha256://../' + 'a' * 61,
)
NEVER_STORED = media_uri_for(b'pydantic-ai-steps conformance: never stored')
FIRST = {'source': 'camera-1', 'label': 'first put'}
SECOND = {'source': 'camera-2', 'kind': 'second'}


class CollectionConformance:
    """`list_blobs()` and `delete(uri, stored_before=)` (`CollectableMediaStore`), for any media store."""

    collectable: ClassVar[bool] = True
    """Whether the store lists and deletes its blobs; `False` skips those tests (no garbage collection then)."""

    stored_at_resolution: ClassVar[timedelta] = timedelta(0)
    """How coarse the store's `stored_at` is: it may read up to this much before the put (S3: one second)."""

    clock_tolerance: ClassVar[timedelta] = timedelta(seconds=2)
    """How far a server's clock, which stamps `stored_at`, may be from this machine's."""

    # -- listing and deleting, for garbage collection ------------------------------------------

    def _collectable(self, media_store: MediaStore) -> CollectableMediaStore:
        if not self.collectable:
            pytest.skip(f'{type(self).__name__} declares collectable = False')
        if not isinstance(media_store, CollectableMediaStore):
            pytest.fail(
                f'{type(media_store).__name__} must define list_blobs() and delete(uri, stored_before=) '
                '(see pydantic_ai_steps.store.CollectableMediaStore), or the conformance class must set '
                'collectable = False'
            )
        return media_store

    async def _listed(self, store: CollectableMediaStore) -> dict[str, BlobInfo]:
        blobs = [blob async for blob in store.list_blobs()]
        by_uri = {blob.uri: blob for blob in blobs}
        assert len(by_uri) == len(blobs), f'a blob was listed twice: {sorted(blob.uri for blob in blobs)}'
        return by_uri

    def test_satisfies_the_collectable_protocol(self, media_store: MediaStore) -> None:
        self._collectable(media_store)

    @pytest.mark.anyio
    async def test_an_empty_store_lists_nothing(self, media_store: MediaStore) -> None:
        store = self._collectable(media_store)
        assert await self._listed(store) == {}
        assert await store.delete(NEVER_STORED) is False

    @pytest.mark.anyio
    async def test_list_blobs_shows_exactly_the_stored_blobs(self, media_store: MediaStore) -> None:
        store = self._collectable(media_store)
        payloads = [b'', b'1', bytes(range(256)) * 4, b'chunked? ' * 400]
        before = datetime.now(UTC)
        uris = [await store.put(data) for data in payloads]
        uris.append(await store.put(b'with metadata', context=MediaContext(metadata=FIRST)))
        payloads.append(b'with metadata')
        await store.put(payloads[2])  # stored once, listed once
        after = datetime.now(UTC)
        blobs = await self._listed(store)
        assert sorted(blobs) == sorted(uris)
        earliest = before - self.stored_at_resolution - self.clock_tolerance
        for uri, data in zip(uris, payloads, strict=True):
            blob = blobs[uri]
            assert blob.size == len(data), (uri, blob.size, len(data))
            assert blob.stored_at.utcoffset() == timedelta(0), f'stored_at must be aware UTC, got {blob.stored_at!r}'
            assert earliest <= blob.stored_at <= after + self.clock_tolerance, (blob.stored_at, before, after)

    @pytest.mark.anyio
    async def test_delete_removes_the_blob_and_its_metadata(self, media_store: MediaStore) -> None:
        store = self._collectable(media_store)
        doomed = await store.put(b'doomed', context=MediaContext(metadata=FIRST))
        kept = await store.put(b'kept', context=MediaContext(metadata=SECOND))
        assert await store.delete(doomed) is True
        with pytest.raises(FileNotFoundError):
            await store.get(doomed)
        with pytest.raises(FileNotFoundError):
            await store.get_metadata(doomed)
        assert await store.exists(doomed) is False
        assert sorted(await self._listed(store)) == [kept]
        assert await store.delete(doomed) is False  # nothing left to remove
        assert await store.get(kept) == b'kept'
        assert dict(await store.get_metadata(kept)) == SECOND
        await store.put(b'doomed')  # stored again: nothing of the deleted blob comes back
        assert dict(await store.get_metadata(doomed)) == {}
        assert await store.get(doomed) == b'doomed'

    @pytest.mark.anyio
    async def test_delete_with_stored_before_removes_only_a_blob_put_before_it(self, media_store: MediaStore) -> None:
        store = self._collectable(media_store)
        uri = await store.put(b'put a while ago', context=MediaContext(metadata=FIRST))
        long_ago = datetime.now(UTC) - timedelta(hours=1)
        assert await store.delete(uri, stored_before=long_ago) is False  # put after the cutoff: kept
        assert await store.get(uri) == b'put a while ago'
        assert dict(await store.get_metadata(uri)) == FIRST
        later = datetime.now(UTC) + self.stored_at_resolution + self.clock_tolerance
        assert await store.delete(uri, stored_before=later) is True
        assert await store.exists(uri) is False
        assert await store.delete(uri, stored_before=later) is False

    @pytest.mark.anyio
    async def test_a_repeat_put_refreshes_the_blob_against_a_delete(self, media_store: MediaStore) -> None:
        """Put, note a time `t`, put the same bytes again: `delete(stored_before=t)` must keep the blob."""
        store = self._collectable(media_store)
        pause = self.stored_at_resolution.total_seconds() + 0.05
        refreshed = await store.put(b'put twice')
        control = await store.put(b'put once')
        await anyio.sleep(pause)
        cutoff = datetime.now(UTC)
        await anyio.sleep(pause)
        assert await store.put(b'put twice') == refreshed
        assert await store.delete(refreshed, stored_before=cutoff) is False, 'a put after the cutoff must keep it'
        assert await store.get(refreshed) == b'put twice'
        blobs = await self._listed(store)
        assert blobs[refreshed].stored_at >= cutoff - self.stored_at_resolution - self.clock_tolerance
        assert await store.delete(control, stored_before=cutoff) is True  # the cutoff is after the first puts
        assert sorted(await self._listed(store)) == [refreshed]

    @pytest.mark.anyio
    async def test_delete_rejects_a_naive_cutoff_and_a_malformed_uri(self, media_store: MediaStore) -> None:
        store = self._collectable(media_store)
        uri = await store.put(b'still here')
        naive = datetime.fromtimestamp(time.time() + 3600, UTC).replace(tzinfo=None)
        with pytest.raises(ValueError):
            await store.delete(uri, stored_before=naive)
        for malformed in MALFORMED_URIS:
            with pytest.raises(ValueError):
                await store.delete(malformed)
        assert await store.get(uri) == b'still here'
