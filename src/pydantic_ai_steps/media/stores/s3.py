"""`S3MediaStore`: media in an S3 bucket (AWS S3, Cloudflare R2, MinIO, SeaweedFS, ...).

Path-style URLs (`<endpoint>/<bucket>/<key>`) signed with our own SigV4 module, because
path-style works on every S3-compatible server and needs no DNS per bucket. One `httpx`
client per store; every request has explicit timeouts and bounded, jittered retries on 5xx,
throttling and connection failures (never on other 4xx: those will not get better). Each failure
class has its own exception type naming the bucket and key.

No credential (secret key, session token, the Authorization signature) appears in a repr, a log
line, an exception message, an exception's chain (httpx's error is chained as a copy whose
request has its credential headers redacted, without its traceback), or the locals of the frames
an error passes through (what error reporters such as Sentry record): the signed headers live in
one frame that drops them before it returns or raises. A store cannot be pickled or copied
(`TypeError`): a pickle of it would hold the secret; build a new store where you need one.

Blobs above `multipart_threshold_bytes` go up as a multipart upload (parts in parallel); a failed
or cancelled upload is aborted so no orphan parts keep costing storage.

Garbage collection: `list_blobs` pages through ListObjectsV2 under `key_prefix`, and an object's
`LastModified` says when it was last put (every put re-uploads, so a repeat put refreshes it).
`delete(uri, stored_before=t)` reads `Last-Modified` with a HEAD and sends a DELETE only if the
object is older than `t` by at least one second (S3 keeps the time to the second); if the DELETE
has to be retried, the HEAD is repeated first. S3 has no conditional delete on the modification
time, so a put landing between that HEAD and the DELETE (milliseconds apart) is deleted with the
blob; with the default grace period of garbage collection that takes a put of a blob nobody had
put for an hour, about to be referenced: rare, not impossible. Times are the server's clock:
keep the grace period well above any skew between this machine and the server. AWS dates a
multipart upload from its start, so an upload lasting longer than the grace period (less the
ten minutes a writer trusts a put) could be collected before its writer references it.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import logging
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Final, Literal, NoReturn, Self, SupportsIndex
from urllib.parse import urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape as xml_escape

import anyio
import anyio.to_thread
import httpx

from ...store.maintenance import BlobInfo
from .. import _sigv4
from .._context import EMPTY_CONTEXT, MediaContext
from .._errors import MediaIntegrityError, integrity_message
from .._protocol import (
    KeyStrategy,
    PublicUrlResolver,
    check_stored_before,
    default_key_strategy,
    resolve_public_url,
    uris_named_in_key,
)
from .._uri import parse_media_uri, uri_for_digest

__all__ = [
    'S3AuthError',
    'S3ConnectionError',
    'S3Error',
    'S3IntegrityError',
    'S3MediaStore',
    'S3NotFound',
    'S3RequestError',
    'S3ServerError',
    'S3ThrottledError',
]

logger = logging.getLogger(__name__)

MiB: Final = 1024 * 1024
DEFAULT_TIMEOUT: Final = httpx.Timeout(60.0, connect=10.0)
"""Connect within 10 s; 60 s for each read/write/pool wait (a stalled transfer, not a slow one)."""
MIN_PART_SIZE: Final = 5 * MiB
"""S3 rejects multipart parts below 5 MiB (except the last one)."""
MAX_PARTS: Final = 10_000
MAX_KEY_BYTES: Final = 1024
BACKOFF_CAP_SECONDS: Final = 20.0
ABORT_DEADLINE_SECONDS: Final = 30.0
"""How long a failed or cancelled multipart upload may spend aborting itself (shielded from cancellation)."""
_HASH_IN_THREAD_BYTES = 1 * MiB
LIST_PAGE_KEYS = 1000
"""`max-keys` of each ListObjectsV2 request (1000 is the most S3 returns)."""
LAST_MODIFIED_RESOLUTION: Final = timedelta(seconds=1)
"""S3 keeps an object's modification time to the second: a put at 12:00:00.9 reads as 12:00:00."""

_METADATA_KEY = re.compile(r'[A-Za-z0-9-]+')
# Values sent as-is: printable ASCII words separated by single spaces. Anything else (non-ASCII,
# control characters, leading/trailing or repeated whitespace, empty) would be mangled by HTTP
# or by the signature's whitespace folding, so it is sent RFC 2047 encoded, the form AWS itself
# uses for non-ASCII metadata. A literal value starting with `=?` is encoded too, which keeps
# decoding unambiguous: every value reads back exactly as written.
_PLAIN_VALUE = re.compile(r'[\x21-\x7e]+(?: [\x21-\x7e]+)*')
_ENCODED_VALUE = re.compile(r'=\?utf-8\?b\?([A-Za-z0-9+/]*={0,2})\?=', re.IGNORECASE)
_HEADER_SAFE = re.compile(r'[\x20-\x7e]*')
_META_PREFIX = 'x-amz-meta-'
_THROTTLE_CODES = frozenset(
    {
        'SlowDown',
        'Throttling',
        'ThrottlingException',
        'ThrottledException',
        'RequestThrottled',
        'RequestThrottledException',
        'RequestLimitExceeded',
        'TooManyRequests',
        'TooManyRequestsException',
    }
)

# Credential problems S3 reports with 400 rather than 403 (e.g. a bad or expired session token,
# or a signing region the bucket is not in): still an authentication failure for the caller.
_AUTH_CODES = frozenset(
    {
        'AuthorizationHeaderMalformed',
        'ExpiredToken',
        'InvalidAccessKeyId',
        'InvalidToken',
        'SignatureDoesNotMatch',
        'TokenRefreshRequired',
    }
)

_sleep = anyio.sleep  # module-level indirection so tests can record backoff delays


# --------------------------------------------------------------------------- exceptions


class S3Error(RuntimeError):
    """Base of every S3MediaStore failure; names the operation, bucket and key, never a credential.

    A `RuntimeError`, as the upstream store's S3 failures are, so `except RuntimeError` keeps
    working; the subclasses are also the matching built-in (`PermissionError`,
    `FileNotFoundError`, `ConnectionError`) where there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        bucket: str,
        key: str,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.bucket = bucket
        self.key = key
        self.status = status
        self.code = code
        self.request_id = request_id


class S3AuthError(S3Error, PermissionError):
    """401/403 (or a credential error code): wrong credentials, token or region, a skewed clock, no permission."""


class S3NotFound(S3Error, FileNotFoundError):
    """The object does not exist (a `FileNotFoundError`, as the MediaStore protocol requires)."""


class S3RequestError(S3Error):
    """Any other 4xx (or 3xx) answer: the request itself is wrong (e.g. no such bucket); never retried."""


class S3ThrottledError(S3Error):
    """The server kept asking us to slow down (429, `SlowDown`) until the retries ran out."""


class S3ServerError(S3Error):
    """The server kept failing (5xx) until the retries ran out."""


class S3ConnectionError(S3Error, ConnectionError):
    """The server could not be reached or did not answer in time, on every attempt."""


class S3IntegrityError(S3Error, MediaIntegrityError):
    """The bytes read back do not hash to the digest they are stored under (read as missing, like every store)."""


# --------------------------------------------------------------------------- the store


class S3MediaStore:
    """A `MediaStore` over one S3 bucket, addressed path-style and signed with SigV4.

    Objects live at `<key_prefix><key_strategy(uri, context)>` (default `<sha256>.bin`).
    `context.media_type` is sent as `Content-Type` and `context.metadata` as signed
    `x-amz-meta-<key>` headers: keys must be ASCII letters, digits and `-`, and read back
    lowercased (S3 lowercases them); values round-trip exactly. Every `put` re-uploads, so the
    last put's metadata wins.

    `client=` shares a caller-owned `httpx.AsyncClient` (never closed here); otherwise the store
    creates its own on first use (with `transport=` if given) and `aclose()` / `async with`
    closes it. `timeout` applies to every request, on either client. A store cannot be pickled
    or copied (it holds credentials): `pickle.dumps(store)` raises `TypeError`.

    `list_blobs()` and `delete()` serve media garbage collection (see the module docs); they
    need the `s3:ListBucket` and `s3:DeleteObject` permissions. A bucket holds other objects
    too, so the listing reports only the keys under `key_prefix` that the key strategy gives
    for a digest they contain, with an empty `MediaContext`; every other object is skipped, and
    so never collected (garbage collection with a key strategy that depends on the context is
    not supported).
    """

    def __init__(
        self,
        *,
        bucket: str,
        endpoint: str,
        region: str,
        access_key_id: str,
        secret_access_key: str,
        session_token: str | None = None,
        key_prefix: str = '',
        key_strategy: KeyStrategy = default_key_strategy,
        public_url: PublicUrlResolver | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        retry_backoff_seconds: float = 0.25,
        multipart_threshold_bytes: int = 64 * MiB,
        multipart_part_size_bytes: int = 16 * MiB,
        multipart_concurrency: int = 4,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        _require_text('bucket', bucket)
        if not re.fullmatch(r'[A-Za-z0-9._-]{1,255}', bucket):
            raise ValueError(
                f'bucket {bucket!r} is not a valid S3 bucket name: use letters, digits, ".", "-" and "_" only'
            )
        self._scheme, self._host = _parse_endpoint(endpoint)
        _require_text('region', region)
        if '/' in region or region.strip() != region:
            raise ValueError(f'region {region!r} must be a bare region name such as "us-east-1" or "auto"')
        _require_text('access_key_id', access_key_id)
        if not isinstance(secret_access_key, str) or not secret_access_key:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError('secret_access_key must be a non-empty string')
        if session_token is not None and (not isinstance(session_token, str) or not session_token):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError('session_token must be a non-empty string or None')
        if not isinstance(key_prefix, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'key_prefix must be a string, got {type(key_prefix).__name__}')
        if not isinstance(max_retries, int) or max_retries < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'max_retries must be an int >= 0, got {max_retries!r}')
        if retry_backoff_seconds < 0:
            raise ValueError(f'retry_backoff_seconds must be >= 0, got {retry_backoff_seconds!r}')
        if multipart_threshold_bytes < 1:
            raise ValueError(f'multipart_threshold_bytes must be >= 1, got {multipart_threshold_bytes!r}')
        if multipart_part_size_bytes < MIN_PART_SIZE:
            raise ValueError(
                f'multipart_part_size_bytes must be >= {MIN_PART_SIZE} (5 MiB, the S3 minimum), '
                f'got {multipart_part_size_bytes!r}'
            )
        if multipart_concurrency < 1:
            raise ValueError(f'multipart_concurrency must be >= 1, got {multipart_concurrency!r}')
        if client is not None and transport is not None:
            raise ValueError('pass client= or transport=, not both (a given client already has its transport)')

        self.bucket = bucket
        self.endpoint = f'{self._scheme}://{self._host}'
        self.region = region
        self.key_prefix = key_prefix
        self._access_key_id = access_key_id
        self._masked_key = _mask(access_key_id)
        self._secret = _Secret(secret_access_key)
        self._session_token = None if session_token is None else _Secret(session_token)
        self._key_strategy = key_strategy
        self._public_url = public_url
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._max_retries = max_retries
        self._backoff = retry_backoff_seconds
        self._threshold = multipart_threshold_bytes
        self._part_size = multipart_part_size_bytes
        self._concurrency = multipart_concurrency
        self._given_client = client
        self._transport = transport
        self._owned_client: httpx.AsyncClient | None = None
        self._random = random.Random()
        self._clock: Callable[[], datetime] = _utc_now

    def __repr__(self) -> str:
        return (
            f'S3MediaStore(bucket={self.bucket!r}, endpoint={self.endpoint!r}, region={self.region!r}, '
            f'access_key_id={self._masked_key!r}, key_prefix={self.key_prefix!r})'
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(
            'S3MediaStore cannot be pickled or copied: it holds credentials (the secret access key and any '
            'session token), which must not be written into a pickle; build a new S3MediaStore from your '
            'configuration where another one is needed'
        )

    # ----------------------------------------------------------------- lifecycle

    async def aclose(self) -> None:
        """Close the client this store created (a `client=` passed in stays open)."""
        client, self._owned_client = self._owned_client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._given_client is not None:
            return self._given_client
        if self._owned_client is None:
            # Redirects are not followed: a redirected request would carry a signature for
            # another URL; S3's redirect answers (wrong region) surface as S3RequestError.
            self._owned_client = httpx.AsyncClient(
                transport=self._transport, timeout=self._timeout, follow_redirects=False
            )
        return self._owned_client

    # ----------------------------------------------------------------- MediaStore protocol

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        """Upload `data` (single PUT, or multipart above the threshold) and return its URI."""
        if not isinstance(data, bytes | bytearray | memoryview):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f'data must be bytes, got {type(data).__name__}')
        payload = bytes(data)
        headers = _put_headers(context)  # validated before any hashing or network call
        digest = await _sha256_hex(payload)
        uri = uri_for_digest(digest)
        key = self._key(uri, context)
        if len(payload) > self._threshold:
            await self._put_multipart(key, payload, headers)
        else:
            # The URI digest is the SHA-256 of the body: it doubles as the signed payload hash.
            await self._send(op='PUT', method='PUT', key=key, headers=headers, body=payload, payload_sha256=digest)
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        """Download the bytes of `uri`; `S3NotFound` (a `FileNotFoundError`) if it was never stored."""
        digest = parse_media_uri(uri)
        key = self._key(uri, context)
        response = await self._send(op='GET', method='GET', key=key, uri=uri)
        data = response.content
        if await _sha256_hex(data) != digest:
            error = S3IntegrityError(
                integrity_message(uri, len(data), f'that S3 GET s3://{self.bucket}/{key} returned'),
                operation='GET',
                bucket=self.bucket,
                key=key,
                status=response.status_code,
            )
            error.uri, error.size = uri, len(data)
            raise error
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        """HEAD the object: True if present, False on 404; other failures raise."""
        parse_media_uri(uri)
        try:
            await self._send(op='HEAD', method='HEAD', key=self._key(uri, context), uri=uri)
        except S3NotFound:
            return False
        return True

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        """The configured resolver's URL for `uri`, or None without a resolver."""
        parse_media_uri(uri)  # a malformed URI is an error even when there is no resolver
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        """The `x-amz-meta-*` headers of the object, prefix removed, keys lowercased."""
        parse_media_uri(uri)
        response = await self._send(op='HEAD', method='HEAD', key=self._key(uri, context), uri=uri)
        metadata: dict[str, str] = {}
        for name, value in response.headers.multi_items():
            lname = name.lower()
            if lname.startswith(_META_PREFIX):
                metadata[lname[len(_META_PREFIX) :]] = _decode_metadata_value(value)
        return metadata

    # ----------------------------------------------------------------- garbage collection

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob under `key_prefix` (ListObjectsV2, page by page), `stored_at` its `LastModified`."""
        token: str | None = None
        tokens: set[str] = set()
        while True:
            query = [('list-type', '2'), ('max-keys', str(LIST_PAGE_KEYS))]
            if self.key_prefix:
                query.append(('prefix', self.key_prefix))
            if token is not None:
                query.append(('continuation-token', token))
            response = await self._send(op='LIST', method='GET', key=self.key_prefix, query=query, bucket_only=True)
            page = _listing(response.content)
            if page is None:
                raise self._list_error('answered with something other than a ListBucketResult', response.status_code)
            for key, size, modified in page.objects:
                uri = self._uri_for_key(key)
                if uri is not None:
                    yield BlobInfo(uri=uri, size=size, stored_at=modified)
            if not page.truncated:
                return
            if not page.next_token or page.next_token in tokens:
                raise self._list_error('said the listing goes on but gave no new continuation token', 200)
            token = page.next_token
            tokens.add(token)

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """HEAD, then DELETE the object of `uri`; with `stored_before`, only if it was last put before it.

        `True` if the object was removed; `False` if there was none, or it was put since (its
        `Last-Modified` not a full second before `stored_before`). The key comes from the key
        strategy with an empty `MediaContext`. 403 and 404 are never retried.
        """
        parse_media_uri(uri)
        cutoff = check_stored_before(stored_before)
        key = self._key(uri, EMPTY_CONTEXT)
        if await self._object_age(key, uri, cutoff) != 'old':
            return False

        async def still_old() -> None:
            # A retried DELETE must not remove a blob put since the first attempt (whose answer
            # may have been lost after it did delete the object: gone now means it went).
            age = await self._object_age(key, uri, cutoff)
            if age != 'old':
                raise _Settled(removed=age == 'absent')

        try:
            await self._send(
                op='DELETE', method='DELETE', key=key, uri=uri, before_retry=None if cutoff is None else still_old
            )
        except S3NotFound:
            return False
        except _Settled as settled:
            return settled.removed
        return True

    async def _object_age(self, key: str, uri: str, cutoff: datetime | None) -> Literal['absent', 'recent', 'old']:
        """Whether the object is there and, against `cutoff`, surely put before it (`None`: any object is old)."""
        try:
            response = await self._send(op='HEAD', method='HEAD', key=key, uri=uri)
        except S3NotFound:
            return 'absent'
        if cutoff is None:
            return 'old'
        modified = _http_date(response.headers.get('last-modified'))
        if modified is None:  # cannot tell when it was put: keep it
            return 'recent'
        return 'old' if modified + LAST_MODIFIED_RESOLUTION <= cutoff else 'recent'

    def _uri_for_key(self, key: str) -> str | None:
        """The URI whose key (with an empty context) is `key`, from a digest in it; `None` for other objects."""
        if not key.startswith(self.key_prefix):
            return None
        for uri in uris_named_in_key(key[len(self.key_prefix) :]):
            try:
                if self._key(uri, EMPTY_CONTEXT) == key:
                    return uri
            except ValueError:  # a key this store refuses: it never stored that object
                continue
        return None

    def _list_error(self, problem: str, status: int) -> S3RequestError:
        return S3RequestError(
            f'S3 LIST s3://{self.bucket}/{self.key_prefix} {problem}',
            operation='LIST',
            bucket=self.bucket,
            key=self.key_prefix,
            status=status,
        )

    # ----------------------------------------------------------------- keys

    def _key(self, uri: str, context: MediaContext) -> str:
        suffix = self._key_strategy(uri, context)
        if not isinstance(suffix, str) or not suffix:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'key_strategy must return a non-empty string, got {suffix!r} for {uri}')
        key = self.key_prefix + suffix
        try:
            size = len(key.encode('utf-8'))
        except UnicodeEncodeError:
            raise ValueError(f'S3 object key {key!r} is not valid Unicode text (lone surrogate)') from None
        if size > MAX_KEY_BYTES:
            raise ValueError(f'S3 object key {key!r} is {size} bytes in UTF-8; S3 allows at most {MAX_KEY_BYTES}')
        if any(segment in ('.', '..') for segment in key.split('/')):
            raise ValueError(
                f'S3 object key {key!r} has a "." or ".." segment, which servers and proxies may '
                'normalise away; choose a key_prefix/key_strategy without them'
            )
        return key

    # ----------------------------------------------------------------- multipart

    async def _put_multipart(self, key: str, data: bytes, headers: Mapping[str, str]) -> None:
        part_size = max(self._part_size, -(-len(data) // MAX_PARTS))
        created = await self._send(
            op='multipart create',
            method='POST',
            key=key,
            query=[('uploads', '')],
            headers=headers,
            idempotent=False,  # a lost answer would leave an upload we cannot name, so never resend
        )
        upload_id = _xml_field(created.content, 'UploadId')
        if not upload_id:
            raise S3RequestError(
                f'S3 multipart create s3://{self.bucket}/{key} answered without an UploadId',
                operation='multipart create',
                bucket=self.bucket,
                key=key,
                status=created.status_code,
            )
        try:
            etags = await self._upload_parts(key, upload_id, data, part_size)
            await self._complete_multipart(key, upload_id, etags, len(data))
        except BaseException as exc:
            await self._abort_multipart(key, upload_id, exc)
            raise

    async def _upload_parts(self, key: str, upload_id: str, data: bytes, part_size: int) -> list[str]:
        count = -(-len(data) // part_size)
        etags: list[str] = [''] * count
        failures: list[Exception] = []
        pending = iter(range(count))  # shared by the workers: each part is taken exactly once

        async def worker(scope: anyio.CancelScope) -> None:
            for index in pending:
                chunk = data[index * part_size : (index + 1) * part_size]
                op = f'multipart part {index + 1}/{count}'
                try:
                    response = await self._send(
                        op=op,
                        method='PUT',
                        key=key,
                        query=[('partNumber', str(index + 1)), ('uploadId', upload_id)],
                        body=chunk,
                        payload_sha256=await _sha256_hex(chunk),
                    )
                    etag = response.headers.get('etag')
                    if not etag:
                        raise S3RequestError(
                            f'S3 {op} s3://{self.bucket}/{key} answered without an ETag',
                            operation=op,
                            bucket=self.bucket,
                            key=key,
                            status=response.status_code,
                        )
                except Exception as exc:
                    failures.append(exc)
                    scope.cancel()  # stop the other parts: the upload is going to be aborted
                    return
                etags[index] = etag

        async with anyio.create_task_group() as group:
            for _ in range(min(self._concurrency, count)):
                group.start_soon(worker, group.cancel_scope)
        if failures:
            raise failures[0]
        return etags

    async def _complete_multipart(self, key: str, upload_id: str, etags: Sequence[str], size: int) -> None:
        parts = ''.join(
            f'<Part><PartNumber>{number}</PartNumber><ETag>{xml_escape(etag)}</ETag></Part>'
            for number, etag in enumerate(etags, start=1)
        )
        body = f'<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>'.encode()
        try:
            await self._send(
                op='multipart complete',
                method='POST',
                key=key,
                query=[('uploadId', upload_id)],
                headers={'content-type': 'application/xml'},
                body=body,
                payload_sha256=hashlib.sha256(body).hexdigest(),
                error_in_ok_body=True,  # S3 may send 200 and then an <Error> for this call
            )
        except S3RequestError as exc:
            # A retried complete whose first attempt did succeed finds the upload gone. The key
            # is content-addressed, so an object of the right size there is our object.
            if exc.code != 'NoSuchUpload' or await self._object_size(key) != size:
                raise

    async def _abort_multipart(self, key: str, upload_id: str, cause: BaseException) -> None:
        """Abort a failed upload so its parts do not linger; note on `cause` if even that fails."""
        problem: str | None = None
        # Shielded and bounded: it must run even when the upload was cancelled, and must not
        # hang a cancelled caller for long.
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_DEADLINE_SECONDS) as deadline:
            try:
                await self._send(op='multipart abort', method='DELETE', key=key, query=[('uploadId', upload_id)])
            except S3Error as exc:
                if exc.code != 'NoSuchUpload':  # NoSuchUpload: already gone, nothing left behind
                    problem = str(exc)
            else:
                logger.info('aborted multipart upload of s3://%s/%s after a failure', self.bucket, key)
        if deadline.cancelled_caught:
            problem = f'no answer within {ABORT_DEADLINE_SECONDS:.0f} s'
        if problem is None:
            return
        note = (
            f'aborting multipart upload {upload_id} of s3://{self.bucket}/{key} also failed ({problem}); '
            'its parts stay stored until a bucket lifecycle rule or a manual abort removes them'
        )
        logger.warning('%s', note)
        cause.add_note(note)

    async def _object_size(self, key: str) -> int | None:
        try:
            response = await self._send(op='HEAD', method='HEAD', key=key)
        except S3NotFound:
            return None
        length = response.headers.get('content-length')
        return int(length) if length and length.isdigit() else None

    # ----------------------------------------------------------------- one request, with retries

    async def _send(
        self,
        *,
        op: str,
        method: str,
        key: str,
        query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        body: bytes = b'',
        payload_sha256: str | None = None,
        uri: str | None = None,
        idempotent: bool = True,
        error_in_ok_body: bool = False,
        bucket_only: bool = False,
        before_retry: Callable[[], Awaitable[None]] | None = None,
    ) -> _Answer:
        """Sign and send one request, retrying what may succeed later; return a 2xx response.

        Retried: 5xx (except 501), throttling (429 or a throttling error code), and transport
        failures. A transport failure after the request may have reached the server is retried
        only for idempotent requests. Every attempt is re-signed (fresh `x-amz-date`).
        `bucket_only` addresses the bucket itself (`/<bucket>`, for a listing; `key` then only
        names the request in messages). `before_retry` runs before each retry and may raise to
        stop retrying.
        """
        path = _sigv4.encode_path(f'/{self.bucket}' if bucket_only else f'/{self.bucket}/{key}')
        query_string = _sigv4.canonical_query(query)
        url = httpx.URL(self.endpoint).copy_with(
            raw_path=(path + ('?' + query_string if query_string else '')).encode()
        )
        body_hash = payload_sha256 if payload_sha256 is not None else hashlib.sha256(body).hexdigest()
        attempts = self._max_retries + 1
        for attempt in range(1, attempts + 1):
            # Said only when retrying was the plan and the budget ran out.
            gave_up = f' (gave up after {attempts} attempts)' if attempt == attempts and attempts > 1 else ''
            error: S3Error
            retry_after: float | None = None
            answer = await self._attempt(method, url, path, query_string, headers, body, body_hash)
            if isinstance(answer, httpx.RequestError):
                error, retryable = self._transport_error(op, key, answer, idempotent, gave_up)
            else:
                logger.debug(
                    'S3 %s s3://%s/%s -> %d (attempt %d/%d)',
                    op,
                    self.bucket,
                    key,
                    answer.status_code,
                    attempt,
                    attempts,
                )
                error_body = _error_document(answer.content) if error_in_ok_body else None
                if answer.is_success and error_body is None:
                    return answer
                error, retryable = self._response_error(op, method, key, uri, answer, error_body, gave_up)
                retry_after = _retry_after_seconds(answer.headers.get('retry-after'))
            if not retryable or attempt == attempts:
                raise error
            delay = self._retry_delay(attempt, retry_after)
            logger.warning(
                'S3 %s s3://%s/%s failed (%s); retry %d/%d in %.2f s',
                op,
                self.bucket,
                key,
                type(error).__name__ if error.status is None else f'{error.status} {error.code or ""}'.strip(),
                attempt,
                self._max_retries,
                delay,
            )
            await _sleep(delay)
            if before_retry is not None:
                await before_retry()
        raise AssertionError('unreachable: the last attempt returns or raises')  # pragma: no cover

    async def _attempt(
        self,
        method: str,
        url: httpx.URL,
        path: str,
        query: str,
        headers: Mapping[str, str] | None,
        body: bytes,
        body_hash: str,
    ) -> _Answer | httpx.RequestError:
        """Sign and send one request; return the answer, or the request's failure as a value.

        Nothing this hands back or leaves behind holds a credential, so no exception chain,
        traceback frame or error reporter recording frame locals can show one: the signed headers
        (the session token, the Authorization signature) live only in this frame and are dropped
        before it returns or raises; the answer keeps the status, headers and body of the response
        but not httpx's `Response`, whose `.request` (and `.next_request`) carry them; and a failure
        is a fresh copy of httpx's error, with no traceback and a request whose credential headers
        read `<redacted>`.
        """
        signed: dict[str, str] | None = _sigv4.sign(
            method=method,
            host=self._host,
            path=path,
            query=query,
            headers=headers,
            payload_sha256=body_hash,
            region=self.region,
            access_key_id=self._access_key_id,
            secret_access_key=self._secret.reveal(),
            session_token=None if self._session_token is None else self._session_token.reveal(),
            now=self._clock(),
        )
        try:
            response = await self._client().request(method, url, content=body, headers=signed, timeout=self._timeout)
        except httpx.RequestError as exc:
            return _without_credentials(exc, self._redact)
        finally:
            signed = None
        return _Answer(response.status_code, response.reason_phrase, response.headers, response.content)

    def _retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter (uniform in [0, base * 2^(attempt-1)], capped), or the server's Retry-After."""
        if retry_after is not None:
            return min(retry_after, BACKOFF_CAP_SECONDS)
        return self._random.uniform(0.0, min(BACKOFF_CAP_SECONDS, self._backoff * 2 ** (attempt - 1)))

    def _transport_error(
        self, op: str, key: str, exc: httpx.RequestError, idempotent: bool, gave_up: str
    ) -> tuple[S3Error, bool]:
        # These fail before any byte of the request reached the server: always safe to resend.
        unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        if isinstance(exc, httpx.TimeoutException):
            what = f'timed out ({type(exc).__name__}; timeouts: {_describe_timeout(self._timeout)})'
        else:
            what = f'{type(exc).__name__}: {self._redact(str(exc)) or "no detail"}'
        retryable = isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError) and (
            idempotent or unsent
        )
        error = S3ConnectionError(
            f'S3 {op} s3://{self.bucket}/{key} failed: could not talk to {self.endpoint}: {what}'
            + (gave_up if retryable else ''),
            operation=op,
            bucket=self.bucket,
            key=key,
        )
        error.__cause__ = exc
        return error, retryable

    def _response_error(
        self,
        op: str,
        method: str,
        key: str,
        uri: str | None,
        response: _Answer,
        error_body: tuple[str | None, str | None, str | None] | None,
        gave_up: str,
    ) -> tuple[S3Error, bool]:
        status = response.status_code
        code, message, request_id = error_body or _error_document(response.content) or (None, None, None)
        request_id = request_id or response.headers.get('x-amz-request-id')
        if response.is_success:  # an <Error> inside a 200: classify it by its code alone
            status_for_class = 503 if code in _THROTTLE_CODES else 500 if code == 'InternalError' else 400
        else:
            status_for_class = status
        detail = f'{status} {code}' if code else f'{status} {response.reason_phrase}'.strip()
        if message:
            detail += f': {self._redact(message)[:300]}'
        if request_id:
            detail += f' (request id {request_id})'
        where = f's3://{self.bucket}/{key}'
        cls: type[S3Error]
        retryable = False
        if status_for_class in (401, 403) or (400 <= status_for_class < 500 and code in _AUTH_CODES):
            cls, text = (
                S3AuthError,
                f'S3 {op} {where} was refused: {detail}; {_auth_hint(code, method, self._masked_key)}',
            )
        elif status_for_class == 404 and method in ('GET', 'HEAD', 'DELETE') and code in (None, 'NoSuchKey'):
            cls, text = S3NotFound, f'media not found: {uri or where} ({op} {where} -> {detail})'
        elif status_for_class == 429 or code in _THROTTLE_CODES:
            cls, text, retryable = S3ThrottledError, f'S3 {op} {where} was throttled: {detail}{gave_up}', True
        elif status_for_class >= 500:
            retryable = status_for_class != 501  # 501 NotImplemented will not change on a retry
            cls, text = S3ServerError, f'S3 {op} {where} failed on the server: {detail}{gave_up if retryable else ""}'
        else:
            if code == 'NoSuchBucket':
                detail += f'; create bucket {self.bucket!r} at {self.endpoint} first'
            cls, text = S3RequestError, f'S3 {op} {where} was rejected: {detail}'
        error = cls(text, operation=op, bucket=self.bucket, key=key, status=status, code=code, request_id=request_id)
        return error, retryable

    def _redact(self, text: str) -> str:
        """Remove credentials from server-provided text before it reaches a message or a log."""
        for secret in (self._secret, self._session_token):
            if secret is not None and secret.reveal() in text:
                text = text.replace(secret.reveal(), '***')
        return text


# --------------------------------------------------------------------------- helpers


class _Secret:
    """Holds a credential so that no repr, vars() dump, traceback local or pickle shows it."""

    __slots__ = ('_value',)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return '<redacted>'

    __str__ = __repr__

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError('a credential cannot be pickled or copied')


class _Settled(Exception):
    """Raised by a DELETE's check before a retry: the object is gone (`removed`) or was put again."""

    def __init__(self, *, removed: bool) -> None:
        super().__init__('no retry: ' + ('the object is gone' if removed else 'the object was put again'))
        self.removed = removed


@dataclass(frozen=True, slots=True)
class _Page:
    """One page of a ListObjectsV2 answer: `(key, size, LastModified)` of each object."""

    objects: list[tuple[str, int, datetime]]
    truncated: bool
    next_token: str | None


@dataclass(frozen=True, slots=True)
class _Answer:
    """What the store keeps of an HTTP response: never httpx's `Response`, whose request holds the credentials."""

    status_code: int
    reason_phrase: str
    headers: httpx.Headers
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


_CREDENTIAL_HEADERS = frozenset({'authorization', 'x-amz-security-token'})


def _redacted_request(request: httpx.Request) -> httpx.Request:
    """Method, URL and headers of `request`, credential headers reading `<redacted>`; no body."""
    headers = [
        (name, '<redacted>' if name.lower() in _CREDENTIAL_HEADERS else value)
        for name, value in request.headers.multi_items()
    ]
    return httpx.Request(request.method, request.url, headers=headers)


def _without_credentials(exc: httpx.RequestError, redact: Callable[[str], str]) -> httpx.RequestError:
    """A copy of `exc` that is safe to chain: same type and message, a redacted request, no traceback.

    The original is dropped: its `.request` carries the signed headers, and its traceback (and the
    httpcore error chained to it) runs through frames whose locals hold them.
    """
    try:
        request: httpx.Request | None = _redacted_request(exc.request)
    except RuntimeError:  # `.request` raises when the error was created without one
        request = None
    message = redact(str(exc))
    for cls in type(exc).__mro__:  # the first class, from httpx's own, whose constructor is the usual one
        if issubclass(cls, httpx.RequestError) and (cls is type(exc) or cls.__module__.startswith('httpx')):
            try:
                return cls(message, request=request)
            except TypeError:
                continue
    return httpx.RequestError(message, request=request)  # pragma: no cover  (httpx's own class always fits)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _mask(access_key_id: str) -> str:
    """`AKIA…WXYZ`: enough to tell keys apart in a message, too little to be one."""
    return f'{access_key_id[:4]}…{access_key_id[-4:]}' if len(access_key_id) >= 12 else '…'


def _require_text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'{name} must be a non-empty string, got {value!r}')


def _parse_endpoint(endpoint: str) -> tuple[str, str]:
    """Split `scheme://host[:port]`, rejecting what path-style addressing cannot honour."""
    _require_text('endpoint', endpoint)
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        raise ValueError(f'endpoint {endpoint!r} must look like https://host[:port] (http or https)')
    if parts.username or parts.password:
        raise ValueError('endpoint must not contain credentials; pass access_key_id= and secret_access_key=')
    if parts.path not in ('', '/') or parts.query or parts.fragment:
        raise ValueError(
            f'endpoint {endpoint!r} must not have a path, query or fragment: objects are addressed as '
            '<endpoint>/<bucket>/<key>, so pass the bucket as bucket= (and a key prefix as key_prefix=)'
        )
    try:
        parts.port  # noqa: B018  (validates the port)
    except ValueError:
        raise ValueError(f'endpoint {endpoint!r} has an invalid port') from None
    return parts.scheme, parts.netloc.lower()


def _put_headers(context: MediaContext) -> dict[str, str]:
    """Content-Type and `x-amz-meta-*` headers for a put, validated before any request."""
    headers: dict[str, str] = {}
    if context.media_type is not None:
        if not isinstance(context.media_type, str) or not _HEADER_SAFE.fullmatch(context.media_type):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f'media_type {context.media_type!r} cannot be sent as Content-Type: use printable ASCII only'
            )
        headers['content-type'] = context.media_type
    seen: dict[str, str] = {}
    for key, value in context.metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f'metadata key {key!r} is not allowed by S3MediaStore: use ASCII letters, digits and "-" '
                '(it is sent as an x-amz-meta-<key> HTTP header)'
            )
        if not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'metadata value for {key!r} must be a string, got {type(value).__name__}')
        lowered = key.lower()
        if lowered in seen:
            raise ValueError(
                f'metadata keys {seen[lowered]!r} and {key!r} differ only in case; S3 stores keys lowercased'
            )
        seen[lowered] = key
        headers[_META_PREFIX + lowered] = _encode_metadata_value(value)
    return headers


def _encode_metadata_value(value: str) -> str:
    if _PLAIN_VALUE.fullmatch(value) and not value.startswith('=?'):
        return value
    return '=?UTF-8?B?' + base64.b64encode(value.encode('utf-8', 'surrogatepass')).decode('ascii') + '?='


def _decode_metadata_value(value: str) -> str:
    match = _ENCODED_VALUE.fullmatch(value)
    if match is None:
        return value
    try:
        return base64.b64decode(match.group(1), validate=True).decode('utf-8', 'surrogatepass')
    except (binascii.Error, UnicodeDecodeError):
        return value  # not ours after all: hand back what the server stored


async def _sha256_hex(data: bytes) -> str:
    """Hash off the event loop when it would block it noticeably (hashlib releases the GIL)."""
    if len(data) < _HASH_IN_THREAD_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await anyio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest())


def _local(tag: str) -> str:
    return tag.rsplit('}', 1)[-1]


def _parse_xml(content: bytes) -> ElementTree.Element | None:
    # Server answers are small; refuse DTDs outright rather than trust the parser's entity limits.
    if not content.lstrip().startswith(b'<') or b'<!DOCTYPE' in content or b'<!ENTITY' in content:
        return None
    try:
        return ElementTree.fromstring(content)
    except ElementTree.ParseError:
        return None


def _xml_field(content: bytes, name: str) -> str | None:
    root = _parse_xml(content)
    if root is None:
        return None
    for element in root.iter():
        if _local(element.tag) == name:
            return (element.text or '').strip()
    return None


def _listing(content: bytes) -> _Page | None:
    """Parse a ListObjectsV2 answer (`None` if it is not one), with the same DTD-refusing parser."""
    root = _parse_xml(content)
    if root is None or _local(root.tag) != 'ListBucketResult':
        return None
    objects: list[tuple[str, int, datetime]] = []
    truncated, token = False, None
    for child in root:
        name = _local(child.tag)
        if name == 'Contents':
            fields = {_local(field.tag): field.text or '' for field in child}
            size = fields.get('Size', '').strip()
            modified = _iso_date(fields.get('LastModified', ''))
            # A time that cannot be read is taken as now: such an object is never collected.
            objects.append((fields.get('Key', ''), int(size) if size.isdigit() else 0, modified or _utc_now()))
        elif name == 'IsTruncated':
            truncated = (child.text or '').strip().lower() == 'true'
        elif name == 'NextContinuationToken':
            token = (child.text or '').strip() or None
    return _Page(objects, truncated, token)


def _iso_date(text: str) -> datetime | None:
    """An ISO 8601 time as S3 lists it (`2024-05-01T12:00:00.000Z`), aware UTC; `None` if unreadable."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _http_date(text: str | None) -> datetime | None:
    """An HTTP date (`Last-Modified: Wed, 01 May 2024 12:00:00 GMT`), aware UTC; `None` if absent or unreadable."""
    if not text:
        return None
    try:
        value = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _error_document(content: bytes) -> tuple[str | None, str | None, str | None] | None:
    """(Code, Message, RequestId) of an S3 `<Error>` document, or None if `content` is not one."""
    root = _parse_xml(content)
    if root is None or _local(root.tag) != 'Error':
        return None
    fields: dict[str, str] = {}
    for child in root:
        fields[_local(child.tag)] = (child.text or '').strip()
    return fields.get('Code') or None, fields.get('Message') or None, fields.get('RequestId') or None


def _retry_after_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
    return seconds if seconds >= 0 else None


def _auth_hint(code: str | None, method: str, masked_key: str) -> str:
    if code == 'SignatureDoesNotMatch':
        return f'the secret access key (for access key {masked_key}) or the region looks wrong'
    if code in ('InvalidAccessKeyId', 'InvalidClientTokenId'):
        return f'access key {masked_key} is not known to this server'
    if code in ('ExpiredToken', 'InvalidToken', 'TokenRefreshRequired'):
        return 'the session token is expired or invalid'
    if code == 'AuthorizationHeaderMalformed':
        return 'the request was signed for a region the server does not accept (check region=)'
    if code == 'RequestTimeTooSkewed':
        return "this machine's clock differs too much from the server's; sync it (NTP)"
    if code == 'AccessDenied':
        return f'access key {masked_key} lacks permission for this bucket/key'
    if method == 'HEAD':
        return (
            f'HEAD answers carry no error detail: check credentials ({masked_key}), region, clock, and the '
            's3:GetObject permission (without s3:ListBucket, AWS answers 403 instead of 404 for missing keys)'
        )
    return f'check the credentials ({masked_key}), region and permissions'


def _describe_timeout(timeout: httpx.Timeout) -> str:
    return f'connect {timeout.connect} s, read {timeout.read} s, write {timeout.write} s'
