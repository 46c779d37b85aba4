"""Content-addressed media: write large payloads once, reference them by `media+sha256://` URI.

Stores implement the `MediaStore` protocol; `externalize_media` / `restore_media` move payloads
out of pydantic-ai messages and back. Stores that need an optional driver are imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import installed, lazy_loader
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
    from ._walker import externalize_media, restore_media
    from .stores.disk import DiskMediaStore
    from .stores.mongo import MongoMediaStore
    from .stores.postgres import PostgresMediaStore
    from .stores.s3 import S3MediaStore
    from .stores.sqlite import SqliteMediaStore

_LAZY = {
    'DiskMediaStore': '.stores.disk',
    'SqliteMediaStore': '.stores.sqlite',
    'S3MediaStore': '.stores.s3',
    'MongoMediaStore': '.stores.mongo',
    'PostgresMediaStore': '.stores.postgres',
    'externalize_media': '._walker',
    'restore_media': '._walker',
}
__getattr__ = lazy_loader(__name__, _LAZY)

__all__ = [
    'DiskMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'PostgresMediaStore',
    'PublicUrlResolver',
    'S3MediaStore',
    'SqliteMediaStore',
    'default_key_strategy',
    'externalize_media',
    'make_static_public_url',
    'media_uri_for',
    'parse_media_uri',
    'restore_media',
]
if installed('pymongo'):
    __all__ += ['MongoMediaStore']
