"""Signed requests to one bucket: the store's HTTP client, retries with backoff, failure classes.

Every attempt is signed anew; what may succeed later (5xx but 501, throttling, connection
failures) is retried with full-jitter backoff, and every other answer becomes its `S3Error` at
once. The signed headers exist only inside `S3Transport._attempt` (see the package docs for what
that guarantees).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import anyio
import httpx

from ...._closing import AsyncClosing
from ... import _sigv4
from ._credentials import Secret, without_credentials
from ._errors import (
    S3AuthError,
    S3ConnectionError,
    S3Error,
    S3NotFound,
    S3RequestError,
    S3ServerError,
    S3ThrottledError,
)
from ._parsing import error_document

logger = logging.getLogger(__package__)

DEFAULT_TIMEOUT: Final = httpx.Timeout(60.0, connect=10.0)
"""Connect within 10 s; 60 s for each read/write/pool wait (a stalled transfer, not a slow one)."""
BACKOFF_CAP_SECONDS: Final = 20.0
"""No retry waits longer than this, whatever the attempt or the server's Retry-After."""

# Error codes S3-compatible servers send for "slow down": retried like a 429.
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


@dataclass(frozen=True, slots=True)
class Answer:
    """What the store keeps of an HTTP response: never httpx's `Response`, whose request holds the credentials."""

    status_code: int
    reason_phrase: str
    headers: httpx.Headers
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


class S3Transport(AsyncClosing):
    """Sends the store's requests: signed, with timeouts, retried while a retry may succeed.

    Mixed into `S3MediaStore`, whose constructor sets these attributes.
    """

    bucket: str
    endpoint: str
    region: str
    _host: str
    _access_key_id: str
    _masked_key: str
    _secret: Secret
    _session_token: Secret | None
    _timeout: httpx.Timeout
    _max_retries: int
    _backoff: float
    _given_client: httpx.AsyncClient | None
    _transport: httpx.AsyncBaseTransport | None
    _owned_client: httpx.AsyncClient | None
    _random: random.Random
    _clock: Callable[[], datetime]

    # ----------------------------------------------------------------- lifecycle

    async def aclose(self) -> None:
        """Close the client this store created (a `client=` passed in stays open)."""
        client, self._owned_client = self._owned_client, None
        if client is not None:
            await client.aclose()

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
    ) -> Answer:
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
                error_body = error_document(answer.content) if error_in_ok_body else None
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
    ) -> Answer | httpx.RequestError:
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
            return without_credentials(exc, self._redact)
        finally:
            signed = None
        return Answer(response.status_code, response.reason_phrase, response.headers, response.content)

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
        response: Answer,
        error_body: tuple[str | None, str | None, str | None] | None,
        gave_up: str,
    ) -> tuple[S3Error, bool]:
        status = response.status_code
        code, message, request_id = error_body or error_document(response.content) or (None, None, None)
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
