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

Garbage collection lists the objects under `key_prefix` and deletes by `Last-Modified`, with a
HEAD before each DELETE (S3 has no conditional delete on it): `_collection` says what that costs.

The modules: `_store` (the store, its settings and keys), `_transport` (signed requests, retries,
failure classes), `_credentials` (keeping secrets out of what a failure leaves), `_multipart`,
`_collection` (listing and deleting), `_headers` (content type and metadata), `_parsing` (S3's
XML answers and dates), `_errors`.
"""

from __future__ import annotations

from ._errors import (
    S3AuthError,
    S3ConnectionError,
    S3Error,
    S3IntegrityError,
    S3NotFound,
    S3RequestError,
    S3ServerError,
    S3ThrottledError,
)
from ._store import S3MediaStore

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
