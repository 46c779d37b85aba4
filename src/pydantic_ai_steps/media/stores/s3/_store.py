"""`S3MediaStore` itself: its settings, the MediaStore protocol, and object keys."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import Final, NoReturn, SupportsIndex
from urllib.parse import urlsplit

import httpx

from ...._records import utc_now
from ...._urls import redacted_url
from ..._context import EMPTY_CONTEXT, MediaContext
from ..._errors import integrity_message
from ..._protocol import (
    KeyStrategy,
    PublicUrlResolver,
    default_key_strategy,
    resolve_public_url,
)
from ..._uri import parse_media_uri, uri_for_digest
from .._sha256 import sha256_hex
from ._collection import S3Collection
from ._credentials import Secret, mask
from ._errors import S3IntegrityError, S3NotFound
from ._headers import metadata_of, put_headers
from ._multipart import MIN_PART_SIZE, MiB, S3Multipart
from ._transport import DEFAULT_TIMEOUT

MAX_KEY_BYTES: Final = 1024


class S3MediaStore(S3Collection, S3Multipart):
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
        if not _REGION.fullmatch(region):
            raise ValueError(f'region {region!r} must be a bare region name such as "us-east-1" or "auto"')
        _require_text('access_key_id', access_key_id)
        if not isinstance(secret_access_key, str) or not secret_access_key:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError('secret_access_key must be a non-empty string')
        if session_token is not None and (not isinstance(session_token, str) or not session_token):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError('session_token must be a non-empty string or None')
        if not isinstance(key_prefix, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'key_prefix must be a string, got {type(key_prefix).__name__}')
        _check_whole('max_retries', max_retries, 0)
        _check_seconds('retry_backoff_seconds', retry_backoff_seconds, zero=True)
        if not isinstance(timeout, httpx.Timeout):
            _check_seconds('timeout', timeout, zero=False)
        _check_whole('multipart_threshold_bytes', multipart_threshold_bytes, 1)
        _check_whole('multipart_part_size_bytes', multipart_part_size_bytes, MIN_PART_SIZE, '(5 MiB, the S3 minimum)')
        _check_whole('multipart_concurrency', multipart_concurrency, 1)
        if client is not None and transport is not None:
            raise ValueError('pass client= or transport=, not both (a given client already has its transport)')

        self.bucket = bucket
        self.endpoint = f'{self._scheme}://{self._host}'
        self.region = region
        self.key_prefix = key_prefix
        self._access_key_id = access_key_id
        self._masked_key = mask(access_key_id)
        self._secret = Secret(secret_access_key)
        self._session_token = None if session_token is None else Secret(session_token)
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
        self._owned_client = None
        self._random = random.Random()
        self._clock = utc_now

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

    # ----------------------------------------------------------------- MediaStore protocol

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        """Upload `data` (single PUT, or multipart above the threshold) and return its URI."""
        if not isinstance(data, bytes | bytearray | memoryview):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f'data must be bytes, got {type(data).__name__}')
        payload = bytes(data)
        headers = put_headers(context)  # validated before any hashing or network call
        digest = await sha256_hex(payload)
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
        if await sha256_hex(data) != digest:
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
        return metadata_of(response.headers)

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


def _require_text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'{name} must be a non-empty string, got {value!r}')


_REGION = re.compile(r'[A-Za-z0-9_.-]+')


def _check_whole(name: str, value: object, least: int, why: str = '') -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        shown = f'{least} {why}'.rstrip()
        raise ValueError(f'{name} must be an int >= {shown}, got {value!r}')


def _check_seconds(name: str, value: object, *, zero: bool) -> None:
    """A number of seconds: finite, and positive (or also zero, if `zero`)."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):  # pyright: ignore[reportOperatorIssue]
        bound = '>= 0' if zero else '> 0'
        raise ValueError(f'{name} must be a finite number of seconds {bound}, got {value!r}')


def _parse_endpoint(endpoint: str) -> tuple[str, str]:
    """Split `scheme://host[:port]`, rejecting what path-style addressing cannot honour."""
    _require_text('endpoint', endpoint)
    parts = urlsplit(endpoint.strip())
    if parts.username or parts.password:
        raise ValueError('endpoint must not contain credentials; pass access_key_id= and secret_access_key=')
    shown = redacted_url(endpoint)  # a malformed `user:password@` is hidden all the same
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        raise ValueError(f'endpoint {shown!r} must look like https://host[:port] (http or https)')
    if parts.path not in ('', '/') or parts.query or parts.fragment:
        raise ValueError(
            f'endpoint {shown!r} must not have a path, query or fragment: objects are addressed as '
            '<endpoint>/<bucket>/<key>, so pass the bucket as bucket= (and a key prefix as key_prefix=)'
        )
    try:
        parts.port  # noqa: B018  (validates the port)
    except ValueError:
        raise ValueError(f'endpoint {shown!r} has an invalid port') from None
    return parts.scheme, parts.netloc.lower()
