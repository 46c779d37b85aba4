"""An object's headers: `Content-Type` and the `x-amz-meta-*` metadata a put sends and a HEAD reads back.

Metadata keys are ASCII letters, digits and `-` (S3 lowercases them); values round-trip exactly.
"""

from __future__ import annotations

import base64
import binascii
import re

import httpx

from ..._context import MediaContext

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


def put_headers(context: MediaContext) -> dict[str, str]:
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


def metadata_of(headers: httpx.Headers) -> dict[str, str]:
    """The `x-amz-meta-*` headers of an answer, prefix removed, keys lowercased, values decoded."""
    metadata: dict[str, str] = {}
    for name, value in headers.multi_items():
        lname = name.lower()
        if lname.startswith(_META_PREFIX):
            metadata[lname[len(_META_PREFIX) :]] = _decode_metadata_value(value)
    return metadata


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
