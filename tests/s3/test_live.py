"""S3MediaStore against real servers: moto (every signature recomputed by botocore) and SeaweedFS.

Each test runs on both; see `conftest.py` for how the servers are found and the buckets made.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from pydantic_ai_steps.media import MediaContext, media_uri_for
from pydantic_ai_steps.media.stores.s3 import S3AuthError, S3ConnectionError, S3NotFound, S3RequestError
from pydantic_ai_steps.media.stores.s3 import _collection as s3_collection
from tests.conftest import require_env

from .conftest import S3Admin, Server

pytestmark = [pytest.mark.anyio, pytest.mark.server]
MiB = 1024 * 1024
MISSING = 'media+sha256://' + 'f' * 64
ODD_PREFIX = 'dir with space/ü+=,;@~%!$&()*:/'


async def test_round_trip_with_media_type_and_metadata(make_store: Any, admin: S3Admin, bucket: str) -> None:
    store = make_store()
    metadata = {'Source': 'camera-1', 'note': '  two  spaces\tand tab ', 'name': 'résumé ✓', 'looks': '=?UTF-8?B?x?='}
    uri = await store.put(b'hello world', context=MediaContext(media_type='image/png', metadata=metadata))
    assert uri == media_uri_for(b'hello world')
    assert await store.get(uri) == b'hello world'
    assert await store.exists(uri) is True
    assert await store.get_metadata(uri) == {key.lower(): value for key, value in metadata.items()}
    headers = admin.head(bucket, f'{store.key_prefix}{uri[-64:]}.bin')
    assert headers['content-type'] == 'image/png'
    assert headers['x-amz-meta-source'] == 'camera-1'  # plain values are stored as-is


async def test_keys_with_reserved_and_unicode_characters(make_store: Any, admin: S3Admin, bucket: str) -> None:
    store = make_store(key_prefix=ODD_PREFIX)
    uri = await store.put(b'odd key', context=MediaContext(metadata={'k': 'v'}))
    assert await store.get(uri) == b'odd key'
    assert await store.exists(uri)
    assert await store.get_metadata(uri) == {'k': 'v'}
    assert f'{ODD_PREFIX}{uri[-64:]}.bin' in admin.keys(bucket)


async def test_empty_payload(make_store: Any) -> None:
    store = make_store()
    uri = await store.put(b'')
    assert await store.get(uri) == b''
    assert await store.get_metadata(uri) == {}


async def test_put_again_replaces_metadata(make_store: Any) -> None:
    store = make_store()
    uri = await store.put(b'same', context=MediaContext(metadata={'first': '1'}))
    await store.put(b'same', context=MediaContext(metadata={'second': '2'}))
    assert await store.get_metadata(uri) == {'second': '2'}


async def test_missing_object(make_store: Any) -> None:
    store = make_store()
    assert await store.exists(MISSING) is False
    with pytest.raises(FileNotFoundError, match='media not found') as info:
        await store.get(MISSING)
    assert isinstance(info.value, S3NotFound) and MISSING in str(info.value)
    with pytest.raises(S3NotFound):
        await store.get_metadata(MISSING)


async def test_missing_bucket_is_reported_as_such(make_store: Any) -> None:
    store = make_store(bucket=f'steps-absent-{os.urandom(4).hex()}')
    with pytest.raises(S3RequestError, match='NoSuchBucket') as info:
        await store.get(MISSING)
    assert not isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize('wrong', ['secret_access_key', 'access_key_id'])
async def test_wrong_credentials_are_an_auth_error_without_the_secret(
    make_store: Any, server: Server, wrong: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_store()
    uri = await good.put(b'guarded')
    bad_value = 'WRONG' + os.urandom(8).hex().upper()
    bad = make_store(key_prefix=good.key_prefix, max_retries=0, **{wrong: bad_value})
    with caplog.at_level(logging.DEBUG):
        calls = (bad.put(b'guarded'), bad.get(uri), bad.exists(uri), bad.get_metadata(uri), bad.delete(uri))
        for call in (*calls, _first(bad.list_blobs())):
            with pytest.raises(S3AuthError) as info:
                await call
            message = str(info.value)
            assert info.value.bucket == good.bucket and 's3://' in message
            assert server.secret_key not in message and bad_value not in message
    for record in caplog.records:
        assert server.secret_key not in record.getMessage() and bad_value not in record.getMessage()


@pytest.mark.parametrize('server', ['seaweedfs'], indirect=True)  # moto does not check the request time
async def test_clock_skew_is_an_auth_error(make_store: Any) -> None:
    store = make_store(max_retries=0)
    store._clock = lambda: datetime.now(UTC) - timedelta(hours=1)
    with pytest.raises(S3AuthError, match='RequestTimeTooSkewed'):
        await store.put(b'late')


async def test_multipart_upload_round_trip(make_store: Any, admin: S3Admin, bucket: str) -> None:
    store = make_store(multipart_threshold_bytes=6 * MiB, multipart_part_size_bytes=5 * MiB, key_prefix=ODD_PREFIX)
    data = os.urandom(13 * MiB)  # three parts: 5 + 5 + 3 MiB
    context = MediaContext(media_type='video/mp4', metadata={'Camera': 'front door', 'name': 'été'})
    uri = await store.put(data, context=context)
    assert await store.get(uri) == data
    assert await store.get_metadata(uri) == {'camera': 'front door', 'name': 'été'}
    assert admin.head(bucket, f'{ODD_PREFIX}{uri[-64:]}.bin')['content-type'] == 'video/mp4'
    assert [key for key, _ in admin.pending_uploads(bucket) if key.startswith(ODD_PREFIX)] == []


class _FailSecondPart(httpx.AsyncBaseTransport):
    """Real network, except that uploading part 2 fails as if the connection broke."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.upload_ids: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        if 'uploadId' in params:
            self.upload_ids.add(params['uploadId'])
        if params.get('partNumber') == '2':
            raise httpx.ConnectError('injected: connection refused', request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_failed_multipart_upload_leaves_no_parts(make_store: Any, admin: S3Admin, bucket: str) -> None:
    transport = _FailSecondPart()
    store = make_store(
        multipart_threshold_bytes=6 * MiB,
        multipart_part_size_bytes=5 * MiB,
        max_retries=0,
        transport=transport,
    )
    data = os.urandom(13 * MiB)
    with pytest.raises(S3ConnectionError, match='multipart part 2/3'):
        await store.put(data)
    (upload_id,) = transport.upload_ids
    assert [key for key, _ in admin.pending_uploads(bucket) if key.startswith(store.key_prefix)] == []
    parts = admin.request(
        'GET', f'/{bucket}/{store.key_prefix}{media_uri_for(data)[-64:]}.bin', {'uploadId': upload_id}
    )
    assert parts.status_code == 404 and b'NoSuchUpload' in parts.content
    assert await store.exists(media_uri_for(data)) is False


@pytest.mark.parametrize('server', ['moto'], indirect=True)  # SeaweedFS has no STS here
async def test_temporary_credentials_with_session_token(make_store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """moto checks the signed x-amz-security-token against the credentials STS issued."""
    env = require_env('TEST_S3_SESSION_ACCESS_KEY', 'TEST_S3_SESSION_SECRET_KEY', 'TEST_S3_SESSION_TOKEN')
    credentials = {
        'access_key_id': env['TEST_S3_SESSION_ACCESS_KEY'],
        'secret_access_key': env['TEST_S3_SESSION_SECRET_KEY'],
    }
    token = env['TEST_S3_SESSION_TOKEN']
    store = make_store(session_token=token, **credentials)
    uri = await store.put(b'temporary', context=MediaContext(metadata={'via': 'sts'}))
    assert await store.get(uri) == b'temporary'
    assert await store.get_metadata(uri) == {'via': 'sts'}

    forged = token[:-8] + 'AAAAAAAA'
    with caplog.at_level(logging.DEBUG):
        for session_token in (forged, None):
            bad = make_store(key_prefix=store.key_prefix, session_token=session_token, max_retries=0, **credentials)
            with pytest.raises(S3AuthError) as info:
                await bad.get(uri)
            assert token not in str(info.value) and forged not in str(info.value)
    assert all(token not in r.getMessage() and forged not in r.getMessage() for r in caplog.records)


async def _first(blobs: AsyncIterator[Any]) -> Any:
    return await anext(blobs, None)


def present(admin: S3Admin, bucket: str, key: str) -> bool:
    """Whether the server has `key`, as it answers botocore (not the code under test)."""
    status = admin.request('HEAD', f'/{bucket}/{key}').status_code
    assert status in (200, 404), status
    return status == 200


async def test_list_pages_and_delete_on_the_server(
    make_store: Any, admin: S3Admin, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_collection, 'LIST_PAGE_KEYS', 2)  # five blobs and a foreign object: three pages
    prefix = f'{ODD_PREFIX}{uuid.uuid4().hex[:8]}/'
    transport = _CountingLists()
    store = make_store(key_prefix=prefix, transport=transport)
    before = datetime.now(UTC) - timedelta(seconds=2)
    uris = [await store.put(f'blob {index} '.encode() * (index + 1)) for index in range(5)]
    assert admin.request('PUT', f'/{bucket}/{prefix}notes.txt').status_code == 200  # not a blob
    blobs = {blob.uri: blob async for blob in store.list_blobs()}
    assert sorted(blobs) == sorted(uris)
    assert transport.tokens == [None, transport.tokens[1], transport.tokens[2]] and None not in transport.tokens[1:]
    for index, uri in enumerate(uris):
        assert blobs[uri].size == 7 * (index + 1)
        assert before <= blobs[uri].stored_at <= datetime.now(UTC) + timedelta(seconds=2)
    doomed = uris[0]
    assert await store.delete(doomed) is True
    assert not present(admin, bucket, f'{prefix}{doomed[-64:]}.bin')
    assert await store.delete(doomed) is False
    assert await store.exists(doomed) is False
    assert present(admin, bucket, f'{prefix}notes.txt')
    assert all(present(admin, bucket, f'{prefix}{uri[-64:]}.bin') for uri in uris[1:])
    assert sorted([blob.uri async for blob in store.list_blobs()]) == sorted(uris[1:])


async def test_delete_with_a_cutoff_on_the_server(make_store: Any) -> None:
    store = make_store()
    uri = await store.put(b'cut off')
    assert await store.delete(uri, stored_before=datetime.now(UTC) - timedelta(minutes=10)) is False
    assert await store.get(uri) == b'cut off'
    assert await store.delete(uri, stored_before=datetime.now(UTC) + timedelta(seconds=5)) is True
    assert await store.exists(uri) is False


class _CountingLists(httpx.AsyncBaseTransport):
    """Real network; records the continuation token of every listing request."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.tokens: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == 'GET' and 'list-type' in request.url.params:
            self.tokens.append(request.url.params.get('continuation-token'))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _TamperedDelete(httpx.AsyncBaseTransport):
    """Real network, except that a DELETE's signature has one hex digit changed."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == 'DELETE':
            auth = request.headers['authorization']
            request.headers['authorization'] = auth[:-1] + ('0' if auth[-1] != '0' else '1')
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_delete_request_is_signed_and_its_signature_checked(
    make_store: Any, admin: S3Admin, bucket: str, server: Server
) -> None:
    """moto recomputes every signature with botocore: a DELETE it accepts was signed right."""
    store = make_store()
    uri = await store.put(b'signed delete')
    key = f'{store.key_prefix}{uri[-64:]}.bin'
    tampered = make_store(key_prefix=store.key_prefix, transport=_TamperedDelete(), max_retries=0)
    with pytest.raises(S3AuthError, match='SignatureDoesNotMatch') as info:
        await tampered.delete(uri)
    assert info.value.operation == 'DELETE' and server.secret_key not in str(info.value)
    assert present(admin, bucket, key)  # refused: still there
    assert await store.delete(uri) is True
    assert not present(admin, bucket, key)
