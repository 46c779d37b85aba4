"""`S3MediaStore.list_blobs` and `delete` against the in-memory S3 that checks every signature with botocore."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from pydantic_ai_steps.media import MediaContext, S3MediaStore, media_uri_for
from pydantic_ai_steps.media.stores.s3 import S3AuthError, S3Error, S3RequestError, S3ServerError
from pydantic_ai_steps.media.stores.s3 import _collection as s3_collection
from pydantic_ai_steps.media.stores.s3 import _transport as s3_transport
from pydantic_ai_steps.store import CollectableMediaStore
from pydantic_ai_steps.testing.media_store import MediaStoreConformance

from .fake_s3 import LONG_AGO, SECRET_KEY, SESSION_TOKEN, FakeS3, error_response
from .test_store import FAILURES, _failure_of, fail_first, make_store, texts_reachable_from

pytestmark = pytest.mark.anyio
NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def fake() -> FakeS3:
    return FakeS3(clock=lambda: NOW)


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []

    async def record(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(s3_transport, '_sleep', record)
    return recorded


def key(uri: str, prefix: str = '') -> str:
    return f'{prefix}{uri[-64:]}.bin'


async def listed(store: S3MediaStore) -> dict[str, tuple[int, datetime]]:
    return {blob.uri: (blob.size, blob.stored_at) async for blob in store.list_blobs()}


class TestS3MediaStoreOnTheFakeServer(MediaStoreConformance):
    """The whole suite offline; the live servers run it too (`test_conformance_live.py`)."""

    metadata_on_repeat_put = 'last'
    stored_at_resolution = timedelta(seconds=1)

    @pytest.fixture
    def media_store(self) -> S3MediaStore:
        return make_store(FakeS3(), key_prefix='conformance/')


# ----------------------------------------------------------------------------- listing


async def test_lists_every_page_under_the_prefix_with_size_and_last_modified(
    fake: FakeS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_collection, 'LIST_PAGE_KEYS', 2)
    async with make_store(fake, key_prefix='media/') as store:
        assert isinstance(store, CollectableMediaStore)
        uris = [await store.put(f'blob {index}'.encode() * (index + 1)) for index in range(5)]
        fake.objects['elsewhere/' + key(uris[0])] = (b'not under the prefix', {})
        assert await listed(store) == {uri: (6 * (index + 1), NOW) for index, uri in enumerate(uris)}
    pages = [call for call in fake.calls if call.method == 'GET']
    assert [call.raw_path for call in pages] == ['/bkt'] * 3  # the bucket itself, path-style
    ordered = sorted(key(uri, 'media/') for uri in uris)
    assert [call.query.get('continuation-token') for call in pages] == [
        None,
        f'after:{ordered[1]}',
        f'after:{ordered[3]}',
    ]
    assert all(call.query == call.query | {'list-type': '2', 'prefix': 'media/', 'max-keys': '2'} for call in pages)


async def test_only_keys_the_key_strategy_gives_are_listed(fake: FakeS3) -> None:
    """A bucket holds other objects too: without a digest, under another prefix, or not at their key."""
    uri = media_uri_for(b'ours')
    digest = uri[-64:]
    fake.objects.update(
        {
            f'media/{digest}.bin': (b'ours', {}),
            'media/report.pdf': (b'not a blob', {}),
            f'media/{digest}.bin.bak': (b'ours', {}),
            f'media/sub/{digest}.bin': (b'ours', {}),
            f'other/{digest}.bin': (b'ours', {}),
            f'{digest}.bin': (b'ours', {}),
        }
    )
    async with make_store(fake, key_prefix='media/') as store:
        assert await listed(store) == {uri: (4, LONG_AGO)}
    async with make_store(fake) as store:  # no prefix: the whole bucket, still only keys the strategy gives
        assert await listed(store) == {uri: (4, LONG_AGO)}


async def test_keys_with_reserved_characters_list_and_delete(fake: FakeS3) -> None:
    prefix = 'dir with space/ü+=,;@~%!$&()*:/'
    async with make_store(fake, key_prefix=prefix) as store:
        uri = await store.put(b'odd <&> key')
        assert list(await listed(store)) == [uri]
        assert await store.delete(uri) is True
        assert await listed(store) == {}


@pytest.mark.parametrize(
    'body',
    [
        b'<Error><Code>Weird</Code></Error>',
        b'not xml at all',
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "boom">]><ListBucketResult>&e;</ListBucketResult>',
    ],
    ids=['another-document', 'not-xml', 'with-a-dtd'],
)
async def test_an_answer_that_is_no_listing_is_a_clear_error(fake: FakeS3, body: bytes) -> None:
    fake.fail_when(lambda request: httpx.Response(200, content=body) if request.method == 'GET' else None)
    async with make_store(fake, key_prefix='p/') as store:
        with pytest.raises(
            S3RequestError, match=r'S3 LIST s3://bkt/p/ answered with something other than a ListBucketResult'
        ):
            await listed(store)


async def test_a_truncated_listing_without_a_new_token_stops_with_an_error(fake: FakeS3) -> None:
    xml = (
        b'<ListBucketResult><IsTruncated>true</IsTruncated>'
        b'<NextContinuationToken>same</NextContinuationToken></ListBucketResult>'
    )
    fake.fail_when(lambda request: httpx.Response(200, content=xml) if request.method == 'GET' else None)
    async with make_store(fake) as store:
        with pytest.raises(S3RequestError, match='gave no new continuation token'):
            await listed(store)
    assert fake.count('GET') == 2


async def test_a_listing_refused_is_an_auth_error_and_not_retried(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(100, error_response(403, 'AccessDenied', 'Access Denied'), method='GET'))
    async with make_store(fake) as store:
        with pytest.raises(S3AuthError, match='S3 LIST s3://bkt/ was refused: 403 AccessDenied'):
            await listed(store)
    assert fake.count('GET') == 1 and delays == []


async def test_a_listing_page_failing_on_the_server_is_retried(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(1, error_response(503, 'ServiceUnavailable'), method='GET'))
    async with make_store(fake) as store:
        uri = await store.put(b'x')
        assert list(await listed(store)) == [uri]
    assert len(delays) == 1


# ----------------------------------------------------------------------------- deleting


async def test_delete_heads_then_deletes_and_a_second_delete_finds_nothing(fake: FakeS3) -> None:
    async with make_store(fake, key_prefix='m/') as store:
        uri = await store.put(b'doomed')
        fake.calls.clear()
        assert await store.delete(uri) is True
        assert [(call.method, call.raw_path) for call in fake.calls] == [
            ('HEAD', f'/bkt/{key(uri, "m/")}'),
            ('DELETE', f'/bkt/{key(uri, "m/")}'),
        ]
        assert await store.delete(uri) is False  # S3 answers 204 for a missing key: the HEAD tells
        assert fake.count('DELETE') == 1
        assert await store.exists(uri) is False


async def test_delete_keeps_an_object_modified_within_a_second_of_the_cutoff(fake: FakeS3) -> None:
    """S3 keeps modification times to the second: 12:00:00 may be a put at 12:00:00.999."""
    async with make_store(fake) as store:
        uri = await store.put(b'recent')
        assert await store.delete(uri, stored_before=NOW + timedelta(milliseconds=999)) is False
        assert await store.delete(uri, stored_before=NOW) is False
        assert fake.count('DELETE') == 0
        assert await store.delete(uri, stored_before=NOW + timedelta(seconds=1)) is True


async def test_a_retried_delete_checks_again_that_the_object_was_not_put_meanwhile(
    fake: FakeS3, delays: list[float]
) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'contested')

        def fail_and_put_again(request: httpx.Request) -> httpx.Response | None:
            if request.method != 'DELETE':
                return None
            fake.modified[key(uri)] = NOW + timedelta(hours=1)  # a writer put it again meanwhile
            return error_response(503, 'ServiceUnavailable')

        fake.fail_when(fail_and_put_again)
        assert await store.delete(uri, stored_before=NOW + timedelta(minutes=5)) is False
        assert await store.get(uri) == b'contested'
    assert fake.count('DELETE') == 1 and fake.count('HEAD') == 2 and len(delays) == 1


async def test_a_delete_whose_answer_was_lost_counts_as_removed(fake: FakeS3, delays: list[float]) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'gone')

        def delete_then_drop_the_answer(request: httpx.Request) -> httpx.Response | None:
            if request.method == 'DELETE' and key(uri) in fake.objects:
                del fake.objects[key(uri)]
                raise httpx.ReadError('connection reset', request=request)
            return None

        fake.fail_when(delete_then_drop_the_answer)
        assert await store.delete(uri, stored_before=NOW + timedelta(minutes=5)) is True
    assert fake.count('DELETE') == 1 and fake.count('HEAD') == 2


async def test_an_unconditional_delete_is_retried_like_any_request(fake: FakeS3, delays: list[float]) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'x')
        fake.fail_when(fail_first(2, error_response(500, 'InternalError'), method='DELETE'))
        assert await store.delete(uri) is True
    assert fake.count('DELETE') == 3 and fake.count('HEAD') == 1 and len(delays) == 2


async def test_a_delete_failing_on_every_attempt_gives_up(fake: FakeS3, delays: list[float]) -> None:
    async with make_store(fake, max_retries=2) as store:
        uri = await store.put(b'x')
        fake.fail_when(fail_first(100, error_response(500, 'InternalError'), method='DELETE'))
        with pytest.raises(S3ServerError, match='gave up after 3 attempts'):
            await store.delete(uri, stored_before=NOW + timedelta(minutes=5))
        assert await store.exists(uri)
    assert fake.count('DELETE') == 3 and fake.count('HEAD') == 1 + 2 + 1  # first, before each retry, exists()


@pytest.mark.parametrize(
    ('response', 'result'),
    [
        (error_response(403, 'AccessDenied', 'Access Denied'), S3AuthError),
        (error_response(404, 'NoSuchKey', 'The specified key does not exist.'), False),
    ],
    ids=['403', '404'],
)
async def test_403_and_404_on_delete_are_never_retried(
    fake: FakeS3, delays: list[float], response: httpx.Response, result: Any
) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'x')
        fake.fail_when(fail_first(100, response, method='DELETE'))
        if result is False:
            assert await store.delete(uri) is False
        else:
            with pytest.raises(result, match=r'S3 DELETE s3://bkt/\w+\.bin was refused'):
                await store.delete(uri)
    assert fake.count('DELETE') == 1 and delays == []


async def test_a_head_without_a_readable_last_modified_keeps_the_object(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'when?')

        def no_date(request: httpx.Request) -> httpx.Response | None:
            return httpx.Response(200, headers={'last-modified': 'yesterday'}) if request.method == 'HEAD' else None

        fake.fail_when(no_date)
        assert await store.delete(uri, stored_before=NOW + timedelta(days=1)) is False
        assert await store.delete(uri) is True  # without a cutoff the time does not matter


async def test_a_cutoff_must_be_aware(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'x')
        with pytest.raises(ValueError, match='stored_before must be timezone-aware'):
            await store.delete(uri, stored_before=datetime(2030, 1, 1))
        with pytest.raises(ValueError, match='not a media URI'):
            await store.delete('x.bin')
    assert fake.count('HEAD') == 0


async def test_a_context_dependent_key_strategy_is_not_collected(fake: FakeS3) -> None:
    def by_type(uri: str, context: MediaContext) -> str:
        return uri[-64:] + ('.png' if context.media_type == 'image/png' else '.bin')

    async with make_store(fake, key_strategy=by_type) as store:
        png = await store.put(b'png', context=MediaContext(media_type='image/png'))
        assert await listed(store) == {}
        assert await store.delete(png) is False
        assert await store.get(png, context=MediaContext(media_type='image/png')) == b'png'


# ----------------------------------------------------------------------------- credentials


@pytest.mark.parametrize('operation', ['list', 'delete', 'delete-request'])
@pytest.mark.parametrize('failure', FAILURES)
async def test_no_credential_is_reachable_from_a_failure(delays: list[float], failure: str, operation: str) -> None:
    """The listing and both requests of a delete go through the same redacting path as every other request."""
    fake = FakeS3(session_token=SESSION_TOKEN)
    async with make_store(fake, session_token=SESSION_TOKEN, max_retries=1) as store:
        uri = await store.put(b'stored')
        if operation == 'delete-request':  # the HEAD passes, the DELETE fails
            original = FAILURES[failure]
            fake.fail_when(lambda request: original(request) if request.method == 'DELETE' else None)
        else:
            fake.fail_when(FAILURES[failure])
        cutoff = datetime.now(UTC) + timedelta(minutes=5)
        error = await _failure_of(listed(store) if operation == 'list' else store.delete(uri, stored_before=cutoff))
    assert isinstance(error, S3Error), repr(error)
    signatures = [call.headers['authorization'].rsplit('Signature=', 1)[1] for call in fake.calls]
    texts = texts_reachable_from(error)
    assert any('s3://bkt/' in text for text in texts)
    for text in texts:
        assert SECRET_KEY not in text and SESSION_TOKEN not in text, text
        assert not any(signature in text for signature in signatures), text
    assert SESSION_TOKEN.encode() not in pickle.dumps(error) and SECRET_KEY.encode() not in pickle.dumps(error)
