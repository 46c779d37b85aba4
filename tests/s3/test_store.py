"""S3MediaStore logic against an in-memory S3 that checks every signature with botocore."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import pickle
import re
from collections.abc import Awaitable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydantic_ai_steps.media import (
    MediaContext,
    MediaIntegrityError,
    MediaStore,
    S3MediaStore,
    make_static_public_url,
    media_uri_for,
)
from pydantic_ai_steps.media.stores.s3 import (
    S3AuthError,
    S3ConnectionError,
    S3Error,
    S3IntegrityError,
    S3NotFound,
    S3RequestError,
    S3ServerError,
    S3ThrottledError,
)
from pydantic_ai_steps.media.stores.s3 import _transport as s3_transport

from .fake_s3 import ACCESS_KEY, SECRET_KEY, SESSION_TOKEN, FakeS3, error_response

pytestmark = pytest.mark.anyio
MiB = 1024 * 1024
MISSING = 'media+sha256://' + '0' * 64


@pytest.fixture
def fake() -> FakeS3:
    return FakeS3()


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff delays the store asked for, recorded instead of slept."""
    recorded: list[float] = []

    async def record(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(s3_transport, '_sleep', record)
    return recorded


def make_store(fake: FakeS3, **options: Any) -> S3MediaStore:
    arguments: dict[str, Any] = {
        'bucket': 'bkt',
        'endpoint': 'https://s3.example.com:9000/',
        'region': 'us-east-1',
        'access_key_id': ACCESS_KEY,
        'secret_access_key': SECRET_KEY,
        'transport': fake.transport(),
    }
    arguments.update(options)
    return S3MediaStore(**arguments)


# ----------------------------------------------------------------------------- basics


async def test_is_a_media_store_and_round_trips_bytes_type_and_metadata(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        assert isinstance(store, MediaStore)
        context = MediaContext(media_type='image/png', metadata={'Source': 'camera-1', 'n': '3'})
        uri = await store.put(b'hello', context=context)
        assert uri == media_uri_for(b'hello')
        assert await store.get(uri) == b'hello'
        assert await store.exists(uri) is True
        assert await store.get_metadata(uri) == {'source': 'camera-1', 'n': '3'}  # S3 lowercases keys
    stored_headers = fake.objects[f'{uri[-64:]}.bin'][1]
    assert stored_headers['content-type'] == 'image/png'


async def test_request_shape_matches_the_reference(fake: FakeS3) -> None:
    """Path-style, single-encoded path with the prefix, host with port, signed payload hash."""
    async with make_store(fake, key_prefix='pre fix/@') as store:
        uri = await store.put(b'hello')
    (call,) = fake.calls
    digest = uri[-64:]
    assert call.method == 'PUT'
    assert call.raw_path == f'/bkt/pre%20fix/%40{digest}.bin'
    assert call.headers['host'] == 's3.example.com:9000'
    assert call.headers['x-amz-content-sha256'] == digest == hashlib.sha256(b'hello').hexdigest()
    assert 'SignedHeaders=host;x-amz-content-sha256;x-amz-date,' in call.headers['authorization']


async def test_empty_payload_round_trips(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'')
        assert await store.get(uri) == b''


async def test_put_again_replaces_metadata(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'x', context=MediaContext(metadata={'a': '1'}))
        await store.put(b'x', context=MediaContext(metadata={'b': '2'}))
        assert await store.get_metadata(uri) == {'b': '2'}


async def test_missing_object_exists_false_get_and_metadata_not_found(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        assert await store.exists(MISSING) is False
        with pytest.raises(FileNotFoundError, match='media not found') as info:
            await store.get(MISSING)
        assert isinstance(info.value, S3NotFound)
        assert MISSING in str(info.value) and 's3://bkt/' in str(info.value)
        with pytest.raises(S3NotFound):
            await store.get_metadata(MISSING)
    assert fake.count('GET') == 1  # a 404 is an answer, not a failure to retry


async def test_missing_bucket_is_a_configuration_error_not_a_missing_blob(fake: FakeS3) -> None:
    async with make_store(fake, bucket='nope') as store:
        with pytest.raises(S3RequestError, match="create bucket 'nope'") as info:
            await store.get(MISSING)
    assert not isinstance(info.value, FileNotFoundError)
    assert info.value.code == 'NoSuchBucket'


async def test_malformed_uri_is_rejected_before_any_request(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        for call in (store.get, store.exists, store.get_metadata, store.public_url):
            with pytest.raises(ValueError, match='not a media URI'):
                await call('s3://bkt/x')
    assert fake.calls == []


async def test_public_url_uses_the_resolver_or_none(fake: FakeS3) -> None:
    uri = media_uri_for(b'x')
    async with make_store(fake) as plain:
        assert await plain.public_url(uri) is None
    resolver = make_static_public_url('https://cdn.example/', key_prefix='m/')
    async with make_store(fake, public_url=resolver) as store:
        assert await store.public_url(uri) == f'https://cdn.example/m/{uri[-64:]}.bin'

    async def presign(uri: str, context: MediaContext) -> str:
        return f'https://signed.example/{uri[-8:]}?type={context.media_type}'

    async with make_store(fake, public_url=presign) as store:
        assert await store.public_url(uri, context=MediaContext(media_type='image/png')) == (
            f'https://signed.example/{uri[-8:]}?type=image/png'
        )


async def test_corrupted_object_raises_integrity_error(fake: FakeS3) -> None:
    async with make_store(fake) as store:
        uri = await store.put(b'good')
        fake.objects[f'{uri[-64:]}.bin'] = (b'evil!', {})
        with pytest.raises(S3IntegrityError) as info:
            await store.get(uri)
    assert isinstance(info.value, MediaIntegrityError) and isinstance(info.value, FileNotFoundError)
    assert (info.value.uri, info.value.size, info.value.bucket) == (uri, 5, 'bkt')
    assert str(info.value) == (
        f'media {uri} is damaged: the 5 bytes that S3 GET s3://bkt/{uri[-64:]}.bin returned do not match '
        'its sha256 digest; it reads as missing'
    )


async def test_context_dependent_key_strategy(fake: FakeS3) -> None:
    def by_type(uri: str, context: MediaContext) -> str:
        extension = {'image/png': '.png'}.get(context.media_type or '', '.bin')
        return f'{uri[-64:]}{extension}'

    context = MediaContext(media_type='image/png')
    async with make_store(fake, key_strategy=by_type, key_prefix='media/') as store:
        uri = await store.put(b'img', context=context)
        assert f'media/{uri[-64:]}.png' in fake.objects
        assert await store.get(uri, context=context) == b'img'


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ('options', 'message'),
    [
        ({'endpoint': 's3.example.com'}, 'must look like https://host'),
        ({'endpoint': 'ftp://s3.example.com'}, 'must look like https://host'),
        ({'endpoint': 'https://acct.r2.cloudflarestorage.com/my-bucket'}, 'must not have a path'),
        ({'endpoint': 'https://user:pw@s3.example.com'}, 'must not contain credentials'),
        ({'endpoint': 'https://s3.example.com:99999'}, 'invalid port'),
        ({'bucket': 'a/b'}, 'not a valid S3 bucket name'),
        ({'bucket': ''}, 'bucket must be a non-empty string'),
        ({'region': 'us east/1'}, 'bare region name'),
        ({'access_key_id': ''}, 'access_key_id must be a non-empty string'),
        ({'secret_access_key': ''}, 'secret_access_key must be a non-empty string'),
        ({'max_retries': -1}, 'max_retries must be an int >= 0'),
        ({'max_retries': True}, 'max_retries must be an int >= 0, got True'),
        ({'multipart_threshold_bytes': 0}, 'multipart_threshold_bytes must be an int >= 1'),
        ({'multipart_part_size_bytes': MiB}, '5 MiB, the S3 minimum'),
        ({'multipart_concurrency': 0}, 'multipart_concurrency must be an int >= 1'),
        ({'multipart_concurrency': 2.5}, 'multipart_concurrency must be an int >= 1, got 2.5'),
        ({'region': 'us east'}, "region 'us east' must be a bare region name"),
        ({'timeout': -1}, 'timeout must be a finite number of seconds > 0, got -1'),
        ({'timeout': 'x'}, "timeout must be a finite number of seconds > 0, got 'x'"),
        ({'retry_backoff_seconds': 'x'}, "retry_backoff_seconds must be a finite number of seconds >= 0, got 'x'"),
        ({'retry_backoff_seconds': float('nan')}, 'retry_backoff_seconds must be a finite number'),
        ({'client': httpx.AsyncClient()}, 'not both'),
    ],
)
def test_constructor_rejects_bad_settings(fake: FakeS3, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_store(fake, **options)


@pytest.mark.parametrize(
    ('endpoint', 'message'),
    [
        ('ftp://u:S3cr3t@host', 'must not contain credentials'),
        ('https//u:S3cr3t@host', "endpoint 'https//u:***@host' must look like https://host"),
        ('https://u:S3cr3t@', 'must not contain credentials'),
        ('https://u:S3cr3t/x@host', "endpoint 'https://u:***@host' must not have a path"),
    ],
)
def test_an_endpoint_with_a_password_is_refused_without_showing_it(fake: FakeS3, endpoint: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        make_store(fake, endpoint=endpoint)
    assert 'S3cr3t' not in str(refused.value)


@pytest.mark.parametrize(
    ('context', 'message'),
    [
        (MediaContext(metadata={'has_underscore': 'x'}), "metadata key 'has_underscore' is not allowed"),
        (MediaContext(metadata={'has space': 'x'}), 'ASCII letters, digits and "-"'),
        (MediaContext(metadata={'ünï': 'x'}), 'is not allowed'),
        (MediaContext(metadata={'': 'x'}), 'is not allowed'),
        (MediaContext(metadata={'Tag': '1', 'tag': '2'}), 'differ only in case'),
        (MediaContext(metadata={'a': 1}), 'must be a string'),  # type: ignore[dict-item]
        (MediaContext(media_type='text/plain\r\nx-evil: 1'), 'cannot be sent as Content-Type'),
    ],
)
async def test_bad_metadata_is_rejected_before_any_request(fake: FakeS3, context: MediaContext, message: str) -> None:
    async with make_store(fake) as store:
        with pytest.raises(ValueError, match=message):
            await store.put(b'x', context=context)
    assert fake.calls == []


@pytest.mark.parametrize(
    ('strategy', 'message'),
    [
        (lambda uri, context: '', 'non-empty string'),
        (lambda uri, context: 'a/../b', '".." segment'),
        (lambda uri, context: './b', '"." or ".." segment'),
        (lambda uri, context: 'k' * 1025, 'at most 1024'),
        (lambda uri, context: '\ud800', 'lone surrogate'),
    ],
)
async def test_bad_keys_are_rejected_before_any_request(fake: FakeS3, strategy: Any, message: str) -> None:
    async with make_store(fake, key_strategy=strategy) as store:
        with pytest.raises(ValueError, match=message):
            await store.put(b'x')
    assert fake.calls == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(max_size=40))
async def test_any_metadata_value_round_trips_exactly(value: str) -> None:
    """Whitespace runs, control characters, unicode, `=?...?=` look-alikes: all come back as written."""
    fake = FakeS3()
    async with make_store(fake) as store:
        uri = await store.put(b'v', context=MediaContext(metadata={'v': value}))
        assert await store.get_metadata(uri) == {'v': value}
    sent = fake.calls[0].headers['x-amz-meta-v']
    assert sent.isascii() and sent == sent.strip()


# ----------------------------------------------------------------------------- retries and failures


def fail_first(count: int, answer: Any, *, method: str | None = None) -> Any:
    """A fault answering `answer` (a response, or an exception class to raise) `count` times."""
    remaining = [count]

    def fault(request: httpx.Request) -> httpx.Response | None:
        if remaining[0] == 0 or (method is not None and request.method != method):
            return None
        remaining[0] -= 1
        if isinstance(answer, type) and issubclass(answer, Exception):
            raise answer('injected failure', request=request)
        return answer

    return fault


async def test_5xx_is_retried_then_succeeds(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(2, error_response(503, 'ServiceUnavailable')))
    async with make_store(fake, max_retries=3, retry_backoff_seconds=0.5) as store:
        uri = await store.put(b'data')
    assert fake.count('PUT') == 3
    assert len(delays) == 2
    assert 0 <= delays[0] <= 0.5 and 0 <= delays[1] <= 1.0  # full jitter, doubling cap
    assert fake.objects[f'{uri[-64:]}.bin'][0] == b'data'


async def test_persistent_5xx_gives_up_after_the_retry_budget(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(100, error_response(500, 'InternalError', 'We encountered an internal error')))
    async with make_store(fake, max_retries=2) as store:
        with pytest.raises(S3ServerError) as info:
            await store.put(b'data')
    error = info.value
    assert fake.count('PUT') == 3 and len(delays) == 2
    assert (error.bucket, error.status, error.code, error.operation) == ('bkt', 500, 'InternalError', 'PUT')
    assert error.key.endswith('.bin')
    assert 's3://bkt/' in str(error) and 'gave up after 3 attempts' in str(error)


async def test_501_is_not_retried(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(100, error_response(501, 'NotImplemented')))
    async with make_store(fake) as store:
        with pytest.raises(S3ServerError, match='501 NotImplemented'):
            await store.get(MISSING)
    assert fake.count('GET') == 1 and delays == []


@pytest.mark.parametrize(
    'response',
    [error_response(503, 'SlowDown', 'Please reduce your request rate.'), error_response(429, 'TooManyRequests')],
)
async def test_throttling_is_retried_then_reported(fake: FakeS3, delays: list[float], response: httpx.Response) -> None:
    fake.fail_when(fail_first(100, response))
    async with make_store(fake, max_retries=3) as store:
        with pytest.raises(S3ThrottledError, match='was throttled') as info:
            await store.exists(MISSING)
    assert fake.count('HEAD') == 4 and len(delays) == 3
    assert 'gave up after 4 attempts' in str(info.value)


async def test_retry_after_header_is_honoured(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(1, error_response(503, 'SlowDown', headers={'retry-after': '3'})))
    async with make_store(fake) as store:
        await store.put(b'x')
    assert delays == [3.0]


@pytest.mark.parametrize(
    ('response', 'error_type'),
    [
        (error_response(403, 'AccessDenied', 'Access Denied'), S3AuthError),
        (error_response(403, 'RequestTimeTooSkewed'), S3AuthError),
        (error_response(400, 'InvalidToken', 'The provided token is malformed'), S3AuthError),
        (error_response(400, 'ExpiredToken'), S3AuthError),
        (error_response(400, 'AuthorizationHeaderMalformed', "expecting 'eu-west-1'"), S3AuthError),
        (error_response(400, 'InvalidArgument'), S3RequestError),
        (error_response(409, 'OperationAborted'), S3RequestError),
        (error_response(301, 'PermanentRedirect', 'use the eu-west-1 endpoint'), S3RequestError),
    ],
)
async def test_other_4xx_are_never_retried(
    fake: FakeS3, delays: list[float], response: httpx.Response, error_type: type[S3Error]
) -> None:
    fake.fail_when(fail_first(100, response))
    async with make_store(fake) as store:
        with pytest.raises(error_type) as info:
            await store.put(b'x')
    assert fake.count('PUT') == 1 and delays == []
    assert 's3://bkt/' in str(info.value) and info.value.status == response.status_code


@pytest.mark.parametrize('failure', [httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.ReadError])
async def test_connection_failures_are_retried_then_reported(
    fake: FakeS3, delays: list[float], failure: type[httpx.TransportError]
) -> None:
    fake.fail_when(fail_first(100, failure))
    async with make_store(fake, max_retries=2) as store:
        with pytest.raises(S3ConnectionError) as info:
            await store.get(MISSING)
    assert fake.count('GET') == 3 and len(delays) == 2
    message = str(info.value)
    assert 'https://s3.example.com:9000' in message and 's3://bkt/' in message
    assert 'gave up after 3 attempts' in message
    assert isinstance(info.value, ConnectionError)
    assert isinstance(info.value.__cause__, failure)


async def test_connection_failure_then_success(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(1, httpx.ConnectError))
    async with make_store(fake) as store:
        uri = await store.put(b'x')
        assert await store.get(uri) == b'x'
    assert len(delays) == 1


async def test_timeouts_are_explicit_on_every_request(fake: FakeS3) -> None:
    async with make_store(fake, timeout=httpx.Timeout(7.0, connect=2.0)) as store:
        await store.put(b'x')
        await store.exists(MISSING)
    for call in fake.calls:
        assert call.timeout == {'connect': 2.0, 'read': 7.0, 'write': 7.0, 'pool': 7.0}


async def test_timeouts_apply_to_a_caller_client_too(fake: FakeS3) -> None:
    async with httpx.AsyncClient(transport=fake.transport(), timeout=None) as client:
        store = make_store(fake, transport=None, client=client)
        await store.put(b'x')
    assert fake.calls[0].timeout['connect'] == 10.0 and fake.calls[0].timeout['read'] == 60.0


def test_backoff_is_jittered_capped_and_exponential(fake: FakeS3) -> None:
    store = make_store(fake, retry_backoff_seconds=1.0)
    for attempt in range(1, 10):
        samples = [store._retry_delay(attempt, None) for _ in range(200)]
        ceiling = min(s3_transport.BACKOFF_CAP_SECONDS, 2 ** (attempt - 1))
        assert all(0.0 <= sample <= ceiling for sample in samples)
        assert len(set(samples)) > 100  # jittered, not a fixed schedule
    assert store._retry_delay(1, 500.0) == s3_transport.BACKOFF_CAP_SECONDS


# ----------------------------------------------------------------------------- multipart


def multipart_store(fake: FakeS3, **options: Any) -> S3MediaStore:
    return make_store(fake, multipart_threshold_bytes=6 * MiB, multipart_part_size_bytes=5 * MiB, **options)


def big_payload(size: int = 11 * MiB) -> bytes:
    block = hashlib.sha256(b'seed').digest()
    return (block * (size // len(block) + 1))[:size]


async def test_threshold_switches_between_single_put_and_multipart(fake: FakeS3) -> None:
    async with multipart_store(fake) as store:
        await store.put(big_payload(6 * MiB))  # at the threshold: one PUT
        assert fake.count('POST') == 0
        await store.put(big_payload(6 * MiB + 1))  # above: multipart
        assert fake.count('POST', query='uploads') == 1


async def test_multipart_round_trip_with_parallel_parts(fake: FakeS3) -> None:
    fake.part_gate = 2  # each part waits until two are in flight: only parallel uploads get past
    data = big_payload()
    context = MediaContext(media_type='video/mp4', metadata={'Camera': 'front  door'})
    async with multipart_store(fake, multipart_concurrency=4) as store:
        uri = await store.put(data, context=context)
        assert await store.get(uri) == data
        assert await store.get_metadata(uri) == {'camera': 'front  door'}
    assert fake.count('PUT', query='partNumber') == 3  # 5 + 5 + 1 MiB
    assert fake.max_in_flight_parts >= 2
    assert fake.objects[f'{uri[-64:]}.bin'][1]['content-type'] == 'video/mp4'
    assert fake.uploads == {}


async def test_failed_part_aborts_the_upload(fake: FakeS3) -> None:
    fake.fail_when(
        lambda request: (
            error_response(400, 'InvalidPart') if dict(request.url.params).get('partNumber') == '2' else None
        )
    )
    async with multipart_store(fake) as store:
        with pytest.raises(S3RequestError, match='multipart part 2/3'):
            await store.put(big_payload())
    assert fake.count('DELETE', query='uploadId') == 1
    assert fake.uploads == {} and fake.objects == {}


async def test_failed_abort_is_reported_on_the_original_error(fake: FakeS3) -> None:
    fake.fail_when(fail_first(100, error_response(400, 'InvalidPart'), method='PUT'))
    fake.fail_when(fail_first(100, error_response(403, 'AccessDenied'), method='DELETE'))
    async with multipart_store(fake) as store:
        with pytest.raises(S3RequestError) as info:
            await store.put(big_payload())
    notes = ' '.join(getattr(info.value, '__notes__', []))
    assert 'aborting multipart upload' in notes and 'also failed' in notes


async def test_cancelled_multipart_upload_is_still_aborted(fake: FakeS3) -> None:
    with anyio.CancelScope() as scope:

        def cancel_on_first_part(request: httpx.Request) -> None:
            if 'partNumber' in dict(request.url.params):
                scope.cancel()

        fake.fail_when(cancel_on_first_part)
        async with multipart_store(fake) as store:
            await store.put(big_payload())
    assert scope.cancelled_caught
    assert fake.count('DELETE', query='uploadId') == 1
    assert fake.uploads == {} and fake.objects == {}


async def test_multipart_create_is_not_resent_after_an_ambiguous_failure(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(1, httpx.ReadTimeout, method='POST'))
    async with multipart_store(fake) as store:
        with pytest.raises(S3ConnectionError, match='multipart create'):
            await store.put(big_payload())
    assert fake.count('POST', query='uploads') == 1 and delays == []


async def test_multipart_create_is_resent_when_the_connection_never_opened(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(1, httpx.ConnectError, method='POST'))
    async with multipart_store(fake) as store:
        uri = await store.put(big_payload())
    assert fake.count('POST', query='uploads') == 2 and len(delays) == 1
    assert f'{uri[-64:]}.bin' in fake.objects


async def test_error_inside_a_200_complete_is_retried(fake: FakeS3, delays: list[float]) -> None:
    """S3 may answer CompleteMultipartUpload with 200 and then an <Error> body."""
    in_200 = httpx.Response(200, content=b'<Error><Code>InternalError</Code><Message>oops</Message></Error>')
    fake.fail_when(_complete_fault(in_200))
    async with multipart_store(fake) as store:
        uri = await store.put(big_payload())
    assert len(delays) == 1
    assert f'{uri[-64:]}.bin' in fake.objects


async def test_complete_whose_first_answer_was_lost_is_accepted(fake: FakeS3, delays: list[float]) -> None:
    """First complete succeeds but its answer is lost; the retry sees NoSuchUpload, the object is there."""
    real_complete = fake._complete
    lost = [False]

    def lose_first_answer(key: str, upload_id: str, body: bytes) -> httpx.Response:
        response = real_complete(key, upload_id, body)
        if not lost[0]:
            lost[0] = True
            raise httpx.ReadError('connection reset after complete')
        return response

    fake._complete = lose_first_answer  # type: ignore[method-assign]
    data = big_payload()
    async with multipart_store(fake) as store:
        uri = await store.put(data)
        assert await store.get(uri) == data
    assert fake.count('POST', query='uploadId') == 2


def _complete_fault(response: httpx.Response) -> Any:
    sent = [False]

    def fault(request: httpx.Request) -> httpx.Response | None:
        params = dict(request.url.params)
        if request.method == 'POST' and 'uploadId' in params and not sent[0]:
            sent[0] = True
            return response
        return None

    return fault


# ----------------------------------------------------------------------------- client lifecycle


async def test_owned_client_is_lazy_and_closed_by_aclose(fake: FakeS3) -> None:
    store = make_store(fake)
    assert store._owned_client is None
    await store.put(b'x')
    client = store._owned_client
    assert client is not None
    await store.put(b'y')
    assert store._owned_client is client  # one client per store
    await store.aclose()
    assert client.is_closed and store._owned_client is None


async def test_caller_client_is_never_closed(fake: FakeS3) -> None:
    async with httpx.AsyncClient(transport=fake.transport()) as client:
        async with make_store(fake, transport=None, client=client) as store:
            await store.put(b'x')
        assert not client.is_closed


# ----------------------------------------------------------------------------- secrets


def test_repr_shows_a_masked_key_and_no_secret(fake: FakeS3) -> None:
    store = make_store(fake, session_token=SESSION_TOKEN)
    text = repr(store)
    assert SECRET_KEY not in text and SESSION_TOKEN not in text and ACCESS_KEY not in text
    assert 'AKIA…1234' in text and "bucket='bkt'" in text
    dumped = repr(vars(store))
    assert SECRET_KEY not in dumped and SESSION_TOKEN not in dumped


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):  # root logger: ours, httpx's and httpcore's records
        yield caplog


async def test_no_secret_in_any_log_line_or_exception(all_logs: pytest.LogCaptureFixture, delays: list[float]) -> None:
    fake = FakeS3(session_token=SESSION_TOKEN)
    texts: list[str] = []
    async with make_store(fake, session_token=SESSION_TOKEN, max_retries=1) as store:
        uri = await store.put(b'ok', context=MediaContext(metadata={'a': 'b'}))
        await store.get(uri)
        # A server that echoes the token in its error message (AWS's SignatureDoesNotMatch
        # carries the canonical request, which holds it); plus every failure class.
        fake.fail_when(fail_first(1, error_response(403, 'SignatureDoesNotMatch', f'canonical: {SESSION_TOKEN}')))
        fake.fail_when(fail_first(2, error_response(500, 'InternalError', f'echo {SECRET_KEY}')))
        fake.fail_when(fail_first(2, httpx.ConnectError))
        fake.fail_when(fail_first(1, error_response(404, 'NoSuchKey')))
        for _ in range(4):
            with pytest.raises(S3Error) as info:
                await store.get(uri)
            texts += [str(info.value), repr(info.value), *getattr(info.value, '__notes__', [])]
        fake.faults.clear()
    wrong = make_store(FakeS3(secret_key='other'), session_token=SESSION_TOKEN)
    with pytest.raises(S3AuthError) as info:
        await wrong.put(b'x')
    await wrong.aclose()
    texts += [str(info.value), repr(info.value)]
    # botocore's records come from the fake server's signature check (the test oracle), not the store.
    records = [record for record in all_logs.records if not record.name.startswith('botocore')]
    assert {record.name.split('.')[0] for record in records} >= {'pydantic_ai_steps', 'httpx'}
    texts += [record.getMessage() for record in records]
    texts += [repr(record.args) for record in records]
    assert any('retry' in text for text in texts)  # the retry paths did log
    for text in texts:
        assert SECRET_KEY not in text, text
        assert SESSION_TOKEN not in text, text
    assert any('***' in text for text in texts)  # the echoed token was redacted, not dropped silently


# ----------------------------------------------------------------------------- exception classes


@pytest.mark.parametrize(
    ('error_type', 'other_base'),
    [
        (S3Error, Exception),
        (S3AuthError, PermissionError),
        (S3NotFound, FileNotFoundError),
        (S3ConnectionError, ConnectionError),
        (S3RequestError, S3Error),
        (S3ThrottledError, S3Error),
        (S3ServerError, S3Error),
        (S3IntegrityError, FileNotFoundError),
    ],
)
def test_every_s3_error_is_a_runtime_error_and_keeps_its_other_base(
    error_type: type[S3Error], other_base: type[Exception]
) -> None:
    """The upstream store raises RuntimeError for a failed S3 call; `except RuntimeError` must still catch ours."""
    error = error_type('S3 GET s3://bkt/k failed', operation='GET', bucket='bkt', key='k', status=500)
    assert isinstance(error, RuntimeError)
    assert isinstance(error, other_base)
    assert str(error) == 'S3 GET s3://bkt/k failed'
    assert (error.operation, error.bucket, error.key, error.status) == ('GET', 'bkt', 'k', 500)
    with pytest.raises(RuntimeError, match='failed'):
        raise error
    with pytest.raises(other_base):
        raise error


async def test_a_failed_call_is_caught_by_except_runtime_error(fake: FakeS3, delays: list[float]) -> None:
    fake.fail_when(fail_first(100, error_response(500, 'InternalError')))
    async with make_store(fake, max_retries=0) as store:
        with pytest.raises(RuntimeError, match='failed on the server'):
            await store.get(MISSING)


# ----------------------------------------------------------------------------- secrets beyond messages


def _reachable_texts(value: object, depth: int) -> Iterator[str]:
    """`repr` of `value` and, `depth` levels down, of its attributes and items; an httpx request's raw headers."""
    yield repr(value)
    if isinstance(value, httpx.Response):
        value = value.request
    if isinstance(value, httpx.Request):
        yield repr(value.headers.raw)
    if depth <= 0:
        return
    children: list[object] = []
    if isinstance(value, dict):
        children += [*value.keys(), *value.values()]  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    elif isinstance(value, list | tuple | set | frozenset):
        children += list(value)  # pyright: ignore[reportUnknownArgumentType]
    if hasattr(value, '__dict__') and not isinstance(value, type):
        children += list(vars(value).values())
    for child in children:
        yield from _reachable_texts(child, depth - 1)


def texts_reachable_from(error: BaseException) -> list[str]:
    """What an error reporter can record: every exception of the chain (message, repr, notes, attributes,
    an httpx error's request) and every local of every frame of every traceback in it."""
    texts: list[str] = []
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        texts += [str(current), repr(current), *getattr(current, '__notes__', [])]
        texts += _reachable_texts(current, depth=3)
        if isinstance(current, httpx.RequestError):
            with contextlib.suppress(RuntimeError):  # `.request` raises when the error has none
                texts += _reachable_texts(current.request, depth=1)
        tb = current.__traceback__
        while tb is not None:
            for local in tb.tb_frame.f_locals.values():
                texts += _reachable_texts(local, depth=1)
            tb = tb.tb_next
        pending += [link for link in (current.__cause__, current.__context__) if link is not None]
    return texts


async def _failure_of(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except Exception as error:
        return error
    raise AssertionError('the call was expected to fail')


FAILURES: dict[str, Any] = {
    'connection-error': fail_first(100, httpx.ConnectError),
    'connect-timeout': fail_first(100, httpx.ConnectTimeout),
    'read-timeout': fail_first(100, httpx.ReadTimeout),
    'pool-timeout': fail_first(100, httpx.PoolTimeout),
    'remote-protocol-error': fail_first(100, httpx.RemoteProtocolError),
    '403': fail_first(100, error_response(403, 'AccessDenied', 'Access Denied')),
    '500': fail_first(100, error_response(500, 'InternalError', 'We encountered an internal error')),
}


@pytest.mark.parametrize('operation', ['get', 'put', 'exists', 'multipart'])
@pytest.mark.parametrize('failure', FAILURES)
async def test_no_credential_is_reachable_from_a_failure(delays: list[float], failure: str, operation: str) -> None:
    """Not in the exception chain, its attributes, an httpx error's request, nor any frame's locals."""
    fake = FakeS3(session_token=SESSION_TOKEN)
    async with multipart_store(fake, session_token=SESSION_TOKEN, max_retries=1) as store:
        uri = await store.put(b'stored')
        fake.fail_when(FAILURES[failure])
        call = {
            'get': lambda: store.get(uri),
            'put': lambda: store.put(b'new bytes'),
            'exists': lambda: store.exists(uri),
            'multipart': lambda: store.put(big_payload()),
        }[operation]
        error = await _failure_of(call())
    assert isinstance(error, S3Error), repr(error)
    sent = [call.headers['authorization'] for call in fake.calls]
    signatures = [header.rsplit('Signature=', 1)[1] for header in sent]
    assert len(signatures) >= 2 and fake.calls[0].headers['x-amz-security-token'] == SESSION_TOKEN
    texts = texts_reachable_from(error)
    assert any('s3://bkt/' in text for text in texts)  # the walk does see the error
    for text in texts:
        assert SECRET_KEY not in text, text
        assert SESSION_TOKEN not in text, text
        for signature in signatures:
            assert signature not in text, text
    assert SESSION_TOKEN.encode() not in pickle.dumps(error) and SECRET_KEY.encode() not in pickle.dumps(error)


async def test_no_credential_is_reachable_from_an_integrity_error(fake: FakeS3) -> None:
    fake.session_token = SESSION_TOKEN
    async with make_store(fake, session_token=SESSION_TOKEN) as store:
        uri = await store.put(b'good')
        fake.objects[f'{uri[-64:]}.bin'] = (b'evil', {})
        error = await _failure_of(store.get(uri))
    assert isinstance(error, S3IntegrityError)
    signatures = [call.headers['authorization'].rsplit('Signature=', 1)[1] for call in fake.calls]
    for text in texts_reachable_from(error):
        assert SECRET_KEY not in text and SESSION_TOKEN not in text, text
        assert not any(signature in text for signature in signatures), text


async def test_the_cause_of_a_connection_error_keeps_its_type_and_url_but_no_credential(
    fake: FakeS3, delays: list[float]
) -> None:
    fake.fail_when(fail_first(100, httpx.ReadTimeout))
    async with make_store(fake, session_token=SESSION_TOKEN, max_retries=0) as store:
        error = await _failure_of(store.get(MISSING))
    cause = error.__cause__
    assert isinstance(cause, httpx.ReadTimeout) and cause.__traceback__ is None
    assert str(cause.request.url) == f'https://s3.example.com:9000/bkt/{MISSING[-64:]}.bin'
    assert cause.request.headers['authorization'] == '<redacted>'
    assert cause.request.headers['x-amz-security-token'] == '<redacted>'
    assert cause.request.headers['x-amz-date']  # what is not a credential stays, for debugging


@pytest.mark.parametrize('used', [False, True], ids=['fresh', 'after-a-request'])
async def test_a_store_cannot_be_pickled_or_copied(fake: FakeS3, used: bool) -> None:
    fake.session_token = SESSION_TOKEN
    store = make_store(fake, session_token=SESSION_TOKEN)
    if used:
        await store.put(b'x')
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r'S3MediaStore cannot be pickled or copied: it holds credentials'):
            attempt(store)
    await store.aclose()
