"""AWS Signature Version 4 for S3, as pure functions (no clock, no I/O).

Why our own: the rules S3 needs are short, and a maintained signer would mean a large runtime
dependency (botocore) for four HMACs. Everything here is proven against botocore's `S3SigV4Auth`
by a property test and against live servers, so the S3-specific traps are pinned down:

- The path is percent-encoded exactly once (the S3 rule). The generic SigV4 rule encodes the
  already-encoded path a second time (`%20` -> `%2520`), which S3 rejects.
- Header values are trimmed and internal whitespace runs collapse to one space in the canonical
  form, while the wire keeps the raw value.
- The payload hash is the real SHA-256 of the body, never `UNSIGNED-PAYLOAD`.
- Every header we send (except those HTTP clients add on their own: content-length, user-agent,
  accept...) is signed, so `x-amz-meta-*` and the session token cannot be altered in transit.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = 'AWS4-HMAC-SHA256'
EMPTY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
_UNRESERVED = '-_.~'
_HEX = frozenset('0123456789abcdef')
# Headers the signer sets itself; a caller passing one would create an ambiguous request.
_RESERVED_HEADERS = frozenset({'authorization', 'host', 'x-amz-date', 'x-amz-content-sha256', 'x-amz-security-token'})


def encode_path(path: str) -> str:
    """Percent-encode a raw (unencoded) path once, segment by segment: the S3 canonical URI.

    Only RFC 3986 unreserved characters stay literal; everything else, including `+`, `=`, `@`,
    `%` and non-ASCII characters (as UTF-8), is escaped. Empty segments are kept (`/b//k`), since
    S3 keys may contain `//`. The result is both what is signed and what goes on the wire.
    """
    if not path.startswith('/'):
        raise ValueError(f'path must start with "/", got {path!r}')
    return '/'.join(quote(segment, safe=_UNRESERVED) for segment in path.split('/'))


def canonical_query(params: Iterable[tuple[str, str]]) -> str:
    """Encode raw query parameters, sorted by encoded name then value (`uploads` -> `uploads=`).

    The same string is signed and sent, so the server sees exactly the bytes that were signed.
    """
    pairs = sorted((quote(name, safe=_UNRESERVED), quote(value, safe=_UNRESERVED)) for name, value in params)
    return '&'.join(f'{name}={value}' for name, value in pairs)


def canonical_header_value(value: str) -> str:
    """Trim and collapse whitespace runs to one space, as SigV4's `Trimall` (and botocore) do."""
    return ' '.join(value.split())


def signing_key(secret_access_key: str, date_stamp: str, region: str, service: str = 's3') -> bytes:
    """Derive the per-day, per-region signing key (`AWS4` + secret, then date, region, service)."""
    key = _hmac(('AWS4' + secret_access_key).encode('utf-8'), date_stamp)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, 'aws4_request')


def sign(
    *,
    method: str,
    host: str,
    path: str,
    query: str = '',
    headers: Mapping[str, str] | None = None,
    payload_sha256: str,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None = None,
    now: datetime,
    service: str = 's3',
) -> dict[str, str]:
    """Sign one request and return every header to send, keys lowercased, `authorization` included.

    `path` is the already encoded canonical URI (see `encode_path`) and `query` the already
    canonical query string (see `canonical_query`): the caller sends those exact strings.
    `payload_sha256` is the lowercase hex SHA-256 of the body (`EMPTY_SHA256` for none); it is
    signed and sent as `x-amz-content-sha256`. `headers` are extra headers to sign and send
    (`content-type`, `x-amz-meta-*`); their raw values are sent untouched. `now` must be
    timezone-aware; it is converted to UTC.
    """
    if now.tzinfo is None:
        raise ValueError(f'now must be timezone-aware (UTC), got naive {now.isoformat()}')
    if len(payload_sha256) != 64 or not _HEX.issuperset(payload_sha256):
        raise ValueError(f'payload_sha256 must be 64 lowercase hex characters, got {payload_sha256!r}')
    if not host:
        raise ValueError('host must not be empty')
    if not path.startswith('/'):
        raise ValueError(f'path must start with "/", got {path!r}')

    stamp = now.astimezone(UTC)
    amz_date = stamp.strftime('%Y%m%dT%H%M%SZ')
    date_stamp = amz_date[:8]

    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        lname = name.strip().lower()
        if lname in _RESERVED_HEADERS:
            raise ValueError(f'header {name!r} is set by the signer; do not pass it')
        if lname in out:
            raise ValueError(f'header {name!r} given twice (header names are case-insensitive)')
        out[lname] = value
    out['host'] = host
    out['x-amz-content-sha256'] = payload_sha256
    out['x-amz-date'] = amz_date
    if session_token is not None:
        out['x-amz-security-token'] = session_token

    names = sorted(out)
    signed_headers = ';'.join(names)
    canonical_headers = ''.join(f'{name}:{canonical_header_value(out[name])}\n' for name in names)
    canonical_request = '\n'.join(
        [method.upper(), path, query, canonical_headers, signed_headers, payload_sha256],
    )
    scope = f'{date_stamp}/{region}/{service}/aws4_request'
    string_to_sign = '\n'.join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode('utf-8')).hexdigest()],
    )
    key = signing_key(secret_access_key, date_stamp, region, service)
    signature = hmac.new(key, string_to_sign.encode('utf-8'), hashlib.sha256).hexdigest()
    out['authorization'] = (
        f'{ALGORITHM} Credential={access_key_id}/{scope}, SignedHeaders={signed_headers}, Signature={signature}'
    )
    return out


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode('utf-8'), hashlib.sha256).digest()
