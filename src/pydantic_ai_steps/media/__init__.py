"""Content-addressed media: write large payloads once, reference them by `media+sha256://` URI.

Stores implement the `MediaStore` protocol; `externalize_media` / `restore_media` move payloads
out of pydantic-ai messages and back. Stores that need an optional driver are imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_loader, star_exports
from ._context import MediaContext
from ._protocol import (
    KeyStrategy,
    MediaStore,
    PublicUrlResolver,
    default_key_strategy,
    make_static_public_url,
)
from ._uri import media_uri_for, parse_media_uri

if TYPE_CHECKING:
    from ._walker import externalize_media as externalize_media
    from ._walker import restore_media as restore_media
    from .stores.disk import DiskMediaStore as DiskMediaStore
    from .stores.s3 import S3MediaStore as S3MediaStore
    from .stores.sqlite import SqliteMediaStore as SqliteMediaStore

_LAZY = {
    'DiskMediaStore': ('.stores.disk', None),
    'SqliteMediaStore': ('.stores.sqlite', None),
    'S3MediaStore': ('.stores.s3', None),
    'MongoMediaStore': ('.stores.mongo', 'pymongo'),
    'PostgresMediaStore': ('.stores.postgres', None),
    'externalize_media': ('._walker', None),
    'restore_media': ('._walker', None),
}
__getattr__ = lazy_loader(__name__, _LAZY)

__all__ = [
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'PublicUrlResolver',
    'default_key_strategy',
    'make_static_public_url',
    'media_uri_for',
    'parse_media_uri',
]
__all__ += star_exports(__name__, _LAZY)  # pyright: ignore[reportUnsupportedDunderAll]
