"""Content-addressed media URIs: `media+sha256://<64 lowercase hex>`.

The URI depends only on the bytes, so every store computes the same URI for the same payload and a
blob can move between stores without rewriting the snapshots that reference it.
"""

from __future__ import annotations

import hashlib
import re

MEDIA_URI_PREFIX = 'media+sha256://'
_DIGEST = re.compile(r'[0-9a-f]{64}')


def media_uri_for(data: bytes) -> str:
    """Return the canonical URI of `data`."""
    return MEDIA_URI_PREFIX + hashlib.sha256(data).hexdigest()


def uri_for_digest(digest: str) -> str:
    """Return the URI of an already computed lowercase hex SHA-256 digest."""
    return MEDIA_URI_PREFIX + digest


def parse_media_uri(uri: str) -> str:
    """Return the 64-character lowercase hex digest named by `uri`.

    Strict on purpose: a URI is a storage key, so near-misses (uppercase hex, short digests,
    another scheme) are errors rather than guesses.
    """
    if not isinstance(uri, str) or not uri.startswith(MEDIA_URI_PREFIX):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'not a media URI: {uri!r}; expected {MEDIA_URI_PREFIX}<64 lowercase hex>')
    digest = uri[len(MEDIA_URI_PREFIX) :]
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f'invalid sha256 digest in {uri!r}; expected 64 lowercase hex characters')
    return digest
