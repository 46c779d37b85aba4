"""The `MediaStore` contract as reusable tests.

Subclass `MediaStoreConformance`, provide a `media_store` fixture and say which rule your store
follows for metadata on a repeated put; every contract test then runs against your store::

    import pytest
    from pydantic_ai_steps.testing.media_store import MediaStoreConformance


    class TestMyStore(MediaStoreConformance):
        metadata_on_repeat_put = 'first'

        @pytest.fixture
        def media_store(self, tmp_path):
            return MyMediaStore(tmp_path / 'media')

The fixture must return a fresh, empty store built without a `public_url` resolver. It may be an
async fixture (it runs under anyio) and may `yield` to clean up. Metadata used by the suite keeps
to lowercase ASCII letters, digits and dashes in keys and plain ASCII in values, so stores with
header-based metadata (S3) pass too.

The store must also list and delete its blobs (`CollectableMediaStore`: `list_blobs()` and
`delete(uri, stored_before=)`), as media garbage collection needs; every shipped store does. A
store that cannot sets `collectable = False`, and step stores then cannot collect its garbage. A
store whose `stored_at` times are coarse (S3 keeps seconds) sets `stored_at_resolution`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import ClassVar, Literal, Protocol, cast

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..media import MediaContext, MediaStore, media_uri_for
from ._media_collection import FIRST, MALFORMED_URIS, NEVER_STORED, SECOND, CollectionConformance

__all__ = ['MediaStoreConformance', 'MetadataRule']

MetadataRule = Literal['first', 'last_non_empty', 'last']
"""What `get_metadata` returns after the same bytes were put more than once:

- `'first'`: the first put's metadata stays (insert-or-ignore stores: SQLite, Postgres, Mongo).
- `'last_non_empty'`: a later put with non-empty metadata replaces it; one without leaves it (Disk).
- `'last'`: the last put wins, and a put without metadata clears it (S3, which re-uploads every time).

These are the only places the shipped stores are allowed to differ.
"""


class _Closable(Protocol):
    async def __aenter__(self) -> object: ...

    async def __aexit__(self, *exc_info: object) -> bool | None: ...

    async def aclose(self) -> None: ...


class MediaStoreConformance(CollectionConformance):
    """Every behaviour `externalize_media`, `restore_media` and the step stores rely on, for any `MediaStore`.

    Subclasses provide the `media_store` fixture and set `metadata_on_repeat_put` (see
    `MetadataRule`); example in the module docstring.
    """

    metadata_on_repeat_put: ClassVar[MetadataRule | None] = None

    @pytest.fixture
    def anyio_backend(self) -> str:
        return 'asyncio'

    # -- round trips ------------------------------------------------------------------------------

    @pytest.mark.anyio
    @pytest.mark.parametrize('size', [0, 1, 1000, 1024 * 1024], ids=['empty', 'one-byte', 'small', '1MiB'])
    async def test_put_get_round_trip(self, media_store: MediaStore, size: int) -> None:
        data = bytes((index * 31 + 7) % 256 for index in range(size))
        uri = await media_store.put(data)
        assert uri == media_uri_for(data)
        got = await media_store.get(uri)
        assert type(got) is bytes
        assert got == data

    @pytest.mark.anyio
    async def test_put_returns_the_canonical_uri_whatever_the_context(self, media_store: MediaStore) -> None:
        data = b'\x89PNG\r\n\x1a\n' + bytes(range(256))
        context = MediaContext(media_type='image/png', filename='x.png', metadata={'tag': 'a'})
        assert await media_store.put(data, context=context) == media_uri_for(data)
        assert await media_store.get(media_uri_for(data), context=context) == data

    @pytest.mark.anyio
    async def test_same_bytes_twice_give_one_uri(self, media_store: MediaStore) -> None:
        data = b'the same payload'
        first = await media_store.put(data)
        second = await media_store.put(data)
        assert first == second == media_uri_for(data)
        assert await media_store.get(first) == data

    @pytest.mark.anyio
    async def test_different_bytes_stay_apart(self, media_store: MediaStore) -> None:
        one = await media_store.put(b'one')
        two = await media_store.put(b'two')
        assert one != two
        assert await media_store.get(one) == b'one'
        assert await media_store.get(two) == b'two'

    # -- exists / missing / malformed -------------------------------------------------------------

    @pytest.mark.anyio
    async def test_exists_false_then_true(self, media_store: MediaStore) -> None:
        data = b'exists?'
        uri = media_uri_for(data)
        assert await media_store.exists(uri) is False
        await media_store.put(data)
        assert await media_store.exists(uri) is True

    @pytest.mark.anyio
    async def test_get_of_unknown_uri_raises_file_not_found(self, media_store: MediaStore) -> None:
        with pytest.raises(FileNotFoundError):
            await media_store.get(NEVER_STORED)

    @pytest.mark.anyio
    async def test_get_metadata_of_unknown_uri_raises_file_not_found(self, media_store: MediaStore) -> None:
        with pytest.raises(FileNotFoundError):
            await media_store.get_metadata(NEVER_STORED)

    @pytest.mark.anyio
    @pytest.mark.parametrize('uri', MALFORMED_URIS)
    async def test_malformed_uri_raises_value_error(self, media_store: MediaStore, uri: str) -> None:
        with pytest.raises(ValueError):
            await media_store.get(uri)
        with pytest.raises(ValueError):
            await media_store.exists(uri)
        with pytest.raises(ValueError):
            await media_store.get_metadata(uri)

    # -- metadata ---------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_metadata_round_trip(self, media_store: MediaStore) -> None:
        uri = await media_store.put(b'tagged', context=MediaContext(metadata=FIRST))
        assert dict(await media_store.get_metadata(uri)) == FIRST

    @pytest.mark.anyio
    async def test_no_metadata_reads_as_empty(self, media_store: MediaStore) -> None:
        uri = await media_store.put(b'untagged')
        assert dict(await media_store.get_metadata(uri)) == {}

    @pytest.mark.anyio
    async def test_media_type_is_not_reported_as_metadata(self, media_store: MediaStore) -> None:
        context = MediaContext(media_type='image/png', filename='a.png')
        uri = await media_store.put(b'typed', context=context)
        assert dict(await media_store.get_metadata(uri, context=context)) == {}

    @pytest.mark.anyio
    @pytest.mark.parametrize(
        'context',
        [
            MediaContext(media_type='text/pl\x00ain'),
            MediaContext(metadata={'note': 'a\x00b'}),
            MediaContext(metadata={'a\x00b': 'note'}),
        ],
        ids=['media-type', 'metadata-value', 'metadata-key'],
    )
    async def test_a_nul_character_is_stored_or_refused_with_a_value_error(
        self, media_store: MediaStore, context: MediaContext
    ) -> None:
        """Some stores cannot hold U+0000 (PostgreSQL text, HTTP headers): they say so, before writing."""
        data = b'payload with a NUL in its context'
        refusal: ValueError | None = None
        try:
            uri = await media_store.put(data, context=context)
        except ValueError as error:
            refusal = error
            uri = None
        if uri is None:
            assert '\\x00' in str(refusal)  # the message names the value (its repr)
            assert not await media_store.exists(media_uri_for(data))
        else:
            assert await media_store.get(uri) == data
            assert dict(await media_store.get_metadata(uri, context=context)) == dict(context.metadata)
        assert await media_store.get(await media_store.put(b'the store carries on')) == b'the store carries on'

    @pytest.mark.anyio
    async def test_metadata_on_repeated_put_follows_the_declared_rule(self, media_store: MediaStore) -> None:
        rule = self.metadata_on_repeat_put
        if rule is None:
            pytest.fail(
                f'{type(self).__name__} must set metadata_on_repeat_put to one of '
                "'first', 'last_non_empty', 'last' (see pydantic_ai_steps.testing.media_store.MetadataRule)"
            )
        data = b'put three times'
        uri = await media_store.put(data, context=MediaContext(metadata=FIRST))
        await media_store.put(data, context=MediaContext(metadata=SECOND))
        after_second = dict(await media_store.get_metadata(uri))
        await media_store.put(data)
        after_third = dict(await media_store.get_metadata(uri))
        nothing: dict[str, str] = {}
        expected = {
            'first': (FIRST, FIRST),
            'last_non_empty': (SECOND, SECOND),
            'last': (SECOND, nothing),
        }[rule]
        assert (after_second, after_third) == expected
        assert await media_store.get(uri) == data

    # -- public URLs ------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_public_url_is_none_without_a_resolver(self, media_store: MediaStore) -> None:
        uri = await media_store.put(b'public?')
        assert await media_store.public_url(uri) is None
        assert await media_store.public_url(uri, context=MediaContext(media_type='image/png')) is None

    # -- protocol and concurrency -----------------------------------------------------------------

    def test_satisfies_the_protocol(self, media_store: MediaStore) -> None:
        assert isinstance(media_store, MediaStore)

    @pytest.mark.anyio
    async def test_is_an_async_context_manager_with_an_idempotent_aclose(self, media_store: MediaStore) -> None:
        uri = await media_store.put(b'closing time')
        name = type(media_store).__name__
        assert isinstance(media_store, AbstractAsyncContextManager), f'{name} must define __aenter__ and __aexit__'
        assert callable(getattr(media_store, 'aclose', None)), f'{name} must define an async aclose()'
        store = cast(_Closable, media_store)
        async with store as entered:
            assert entered is media_store
            assert await media_store.get(uri) == b'closing time'
        await store.aclose()  # closing a closed store is a no-op
        await store.aclose()
        with pytest.raises(LookupError, match='raised inside'):
            async with store:
                raise LookupError('raised inside async with')  # __aexit__ does not swallow it

    @pytest.mark.anyio
    async def test_concurrent_puts_of_the_same_bytes(self, media_store: MediaStore) -> None:
        data = bytes(range(256)) * 64
        uris: list[str] = []

        async def put() -> None:
            uris.append(await media_store.put(data, context=MediaContext(metadata=FIRST)))

        async with anyio.create_task_group() as group:
            for _ in range(20):
                group.start_soon(put)
        assert uris == [media_uri_for(data)] * 20
        assert await media_store.get(uris[0]) == data
        assert dict(await media_store.get_metadata(uris[0])) == FIRST

    @pytest.mark.anyio
    async def test_concurrent_puts_of_different_bytes(self, media_store: MediaStore) -> None:
        payloads = [f'payload {index}'.encode() * (index + 1) for index in range(20)]
        results: dict[int, str] = {}

        async def put(index: int) -> None:
            results[index] = await media_store.put(payloads[index])

        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(put, index)
        for index, data in enumerate(payloads):
            assert results[index] == media_uri_for(data)
            assert await media_store.get(results[index]) == data

    @pytest.mark.anyio
    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.binary(max_size=4096))
    async def test_arbitrary_bytes_round_trip(self, media_store: MediaStore, data: bytes) -> None:
        uri = await media_store.put(data)
        assert uri == media_uri_for(data)
        assert await media_store.exists(uri)
        assert await media_store.get(uri) == data
