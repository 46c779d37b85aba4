"""The `MediaStore` protocol and the two user-supplied callables stores accept."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol, cast, runtime_checkable

from .._errors import shortened
from ._context import EMPTY_CONTEXT, MediaContext
from ._uri import parse_media_uri, uri_for_digest

KeyStrategy = Callable[[str, MediaContext], str]
"""Maps a media URI and its context to a backend key (a relative path on disk, an object key on S3)."""

PublicUrlResolver = Callable[[str, MediaContext], 'str | Awaitable[str | None] | None']
"""Turns a media URI into a URL a model can fetch, or `None`. May be sync or async."""


@runtime_checkable
class MediaStore(Protocol):
    """An async, content-addressed blob store.

    `put` returns the canonical `media+sha256://` URI of the bytes; callers never choose keys, and
    storing the same bytes twice stores them once. `get` and `get_metadata` raise
    `FileNotFoundError` for a URI that was never stored and `ValueError` for a malformed one.

    `get` checks the bytes it read against the URI's digest; bytes that do not match (a flipped
    bit, a truncated file or row) raise `MediaIntegrityError`, a `FileNotFoundError`, so a damaged
    blob reads as a missing one. `exists` is only a presence check: it does not read or hash the
    bytes, so it can be `True` for a blob whose `get` then raises `MediaIntegrityError`.

    The shipped stores are also async context managers with an idempotent `aclose()`; that is not
    part of this protocol, so a store without them still satisfies it.
    """

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str: ...

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes: ...

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool: ...

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None: ...

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]: ...


def default_key_strategy(uri: str, context: MediaContext) -> str:
    """The default backend key: `<sha256>.bin` (the context is ignored)."""
    del context
    return parse_media_uri(uri) + '.bin'


def make_static_public_url(
    base_url: str | None = None, *, base: str | None = None, key_prefix: str = '', extension: str = '.bin'
) -> PublicUrlResolver:
    """A resolver for media served under one base URL, e.g. a public bucket or a CDN.

    `https://cdn.example/` with `key_prefix='media/'` maps a URI to
    `https://cdn.example/media/<sha256>.bin`. The base URL is the first argument; as a keyword it
    is `base_url=`, or `base=` as the upstream package names it (give exactly one).
    """
    if base_url is not None and base is not None:
        raise TypeError(
            f'make_static_public_url takes the base URL once, as base_url= or base=, not both; '
            f'got base_url={base_url!r} and base={base!r}'
        )
    url = base_url if base_url is not None else base
    if url is None:
        raise TypeError('make_static_public_url needs the base URL: pass base_url= (or base=, the upstream name)')
    if not isinstance(url, str) or not url:  # pyright: ignore[reportUnnecessaryIsInstance]
        error = ValueError if isinstance(url, str) else TypeError  # pyright: ignore[reportUnnecessaryIsInstance]
        raise error(f"the base URL must be a non-empty string such as 'https://cdn.example/media', got {url!r}")
    prefix = url[:-1] if url.endswith('/') else url

    def resolve(uri: str, context: MediaContext) -> str:
        del context
        return f'{prefix}/{key_prefix}{parse_media_uri(uri)}{extension}'

    return resolve


async def resolve_public_url(resolver: PublicUrlResolver | None, uri: str, context: MediaContext) -> str | None:
    """Run a sync or async resolver; a store without one has no public URL."""
    if resolver is None:
        return None
    parse_media_uri(uri)
    result = resolver(uri, context)
    if inspect.isawaitable(result):
        result = await result
    return result


def encode_metadata(metadata: Mapping[str, str]) -> str:
    """Serialize metadata for stores that keep it as JSON text (one format for all of them)."""
    return json.dumps(dict(metadata), ensure_ascii=False, separators=(',', ':'))


def decode_metadata(raw: object) -> dict[str, str]:
    """Parse stored metadata, insisting on a JSON object of strings to strings."""
    value: object = json.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, dict):
        raise ValueError(f'metadata payload must be a JSON object, got {type(value).__name__}')
    entries = cast(dict[object, object], value)
    result: dict[str, str] = {}
    for key, item in entries.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(f'metadata entries must map str to str, got {shortened(key)}: {shortened(item)}')
        result[key] = item
    return result


_DIGEST_IN_KEY = re.compile(r'(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])')
_EPOCH = datetime.fromtimestamp(0, UTC)


def uris_named_in_key(key: str) -> Iterator[str]:
    """The URIs a backend key may belong to: each 64-lowercase-hex run in it, the last first.

    A store that lists its blobs keeps only a candidate the key strategy maps back to that key.
    """
    for digest in reversed(_DIGEST_IN_KEY.findall(key)):
        yield uri_for_digest(digest)


def check_stored_before(stored_before: object) -> datetime | None:
    """`delete(stored_before=)`: `None`, or an aware `datetime` (a naive one would compare with the wrong clock)."""
    if stored_before is None:
        return None
    if not isinstance(stored_before, datetime):
        raise TypeError(f'stored_before must be an aware datetime or None, got {type(stored_before).__name__}')
    if stored_before.utcoffset() is None:
        raise ValueError(
            f'stored_before must be timezone-aware (e.g. datetime.now(UTC)), got naive {stored_before.isoformat()}'
        )
    return stored_before


def utc_from_timestamp(seconds: float) -> datetime:
    """An aware UTC `datetime` from epoch seconds (what a file's mtime or a row's `stored_at` holds)."""
    return _EPOCH + timedelta(seconds=seconds)
