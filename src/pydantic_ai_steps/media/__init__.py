"""Content-addressed media: write large payloads once, reference them by `media+sha256://` URI.

Stores implement the `MediaStore` protocol; `externalize_media` / `restore_media` move payloads
out of pydantic-ai messages and back. Stores that need an optional driver are imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_loader, star_exports
from ._context import MediaContext
from ._errors import MediaIntegrityError
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
    from .stores.mongo import MongoMediaStore as MongoMediaStore
    from .stores.postgres import PostgresMediaStore as PostgresMediaStore
    from .stores.s3 import S3AuthError as S3AuthError
    from .stores.s3 import S3ConnectionError as S3ConnectionError
    from .stores.s3 import S3Error as S3Error
    from .stores.s3 import S3IntegrityError as S3IntegrityError
    from .stores.s3 import S3MediaStore as S3MediaStore
    from .stores.s3 import S3NotFound as S3NotFound
    from .stores.s3 import S3RequestError as S3RequestError
    from .stores.s3 import S3ServerError as S3ServerError
    from .stores.s3 import S3ThrottledError as S3ThrottledError
    from .stores.sqlite import SqliteMediaStore as SqliteMediaStore

_LAZY = {
    'DiskMediaStore': ('.stores.disk', None),
    'SqliteMediaStore': ('.stores.sqlite', None),
    'S3MediaStore': ('.stores.s3', None),
    'S3Error': ('.stores.s3', None),
    'S3AuthError': ('.stores.s3', None),
    'S3NotFound': ('.stores.s3', None),
    'S3RequestError': ('.stores.s3', None),
    'S3ThrottledError': ('.stores.s3', None),
    'S3ServerError': ('.stores.s3', None),
    'S3ConnectionError': ('.stores.s3', None),
    'S3IntegrityError': ('.stores.s3', None),
    'MongoMediaStore': ('.stores.mongo', 'pymongo'),
    'PostgresMediaStore': ('.stores.postgres', None),
    'externalize_media': ('._walker', None),
    'restore_media': ('._walker', None),
}
__getattr__ = lazy_loader(__name__, _LAZY)

__all__ = [
    'KeyStrategy',
    'MediaContext',
    'MediaIntegrityError',
    'MediaStore',
    'PublicUrlResolver',
    'default_key_strategy',
    'make_static_public_url',
    'media_uri_for',
    'parse_media_uri',
]
__all__ += star_exports(__name__, _LAZY)  # pyright: ignore[reportUnsupportedDunderAll]
