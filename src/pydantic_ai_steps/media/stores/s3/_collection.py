"""Listing and deleting for media garbage collection (`list_blobs`, `delete`).

`list_blobs` pages through ListObjectsV2 under `key_prefix`, and an object's `LastModified` says
when it was last put (every put re-uploads, so a repeat put refreshes it). `delete(uri,
stored_before=t)` reads `Last-Modified` with a HEAD and sends a DELETE only if the object is older
than `t` by at least one second (S3 keeps the time to the second); if the DELETE has to be
retried, the HEAD is repeated first. S3 has no conditional delete on the modification time, so a
put landing between that HEAD and the DELETE (milliseconds apart) is deleted with the blob; with
the default grace period of garbage collection that takes a put of a blob nobody had put for an
hour, about to be referenced: rare, not impossible. Times are the server's clock: keep the grace
period well above any skew between this machine and the server. AWS dates a multipart upload from
its start, so an upload lasting longer than the grace period (less the five minutes a writer trusts
a put) could be collected before its writer references it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal

from ....store.maintenance import BlobInfo
from ..._context import EMPTY_CONTEXT, MediaContext
from ..._protocol import check_stored_before, uris_named_in_key
from ..._uri import parse_media_uri
from ._errors import S3NotFound, S3RequestError
from ._parsing import http_date, listing
from ._transport import S3Transport

LIST_PAGE_KEYS = 1000
"""`max-keys` of each ListObjectsV2 request (1000 is the most S3 returns)."""
LAST_MODIFIED_RESOLUTION: Final = timedelta(seconds=1)
"""S3 keeps an object's modification time to the second: a put at 12:00:00.9 reads as 12:00:00."""


class S3Collection(S3Transport):
    """`list_blobs` and `delete` for `S3MediaStore`: what garbage collection needs of a media store."""

    key_prefix: str

    if TYPE_CHECKING:

        def _key(self, uri: str, context: MediaContext) -> str: ...

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob under `key_prefix` (ListObjectsV2, page by page), `stored_at` its `LastModified`."""
        token: str | None = None
        tokens: set[str] = set()
        while True:
            query = [('list-type', '2'), ('max-keys', str(LIST_PAGE_KEYS))]
            if self.key_prefix:
                query.append(('prefix', self.key_prefix))
            if token is not None:
                query.append(('continuation-token', token))
            response = await self._send(op='LIST', method='GET', key=self.key_prefix, query=query, bucket_only=True)
            page = listing(response.content)
            if page is None:
                raise self._list_error('answered with something other than a ListBucketResult', response.status_code)
            for key, size, modified in page.objects:
                uri = self._uri_for_key(key)
                if uri is not None:
                    yield BlobInfo(uri=uri, size=size, stored_at=modified)
            if not page.truncated:
                return
            if not page.next_token or page.next_token in tokens:
                raise self._list_error('said the listing goes on but gave no new continuation token', 200)
            token = page.next_token
            tokens.add(token)

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """HEAD, then DELETE the object of `uri`; with `stored_before`, only if it was last put before it.

        `True` if the object was removed; `False` if there was none, or it was put since (its
        `Last-Modified` not a full second before `stored_before`). The key comes from the key
        strategy with an empty `MediaContext`. 403 and 404 are never retried.
        """
        parse_media_uri(uri)
        cutoff = check_stored_before(stored_before)
        key = self._key(uri, EMPTY_CONTEXT)
        if await self._object_age(key, uri, cutoff) != 'old':
            return False

        async def still_old() -> None:
            # A retried DELETE must not remove a blob put since the first attempt (whose answer
            # may have been lost after it did delete the object: gone now means it went).
            age = await self._object_age(key, uri, cutoff)
            if age != 'old':
                raise _Settled(removed=age == 'absent')

        try:
            await self._send(
                op='DELETE', method='DELETE', key=key, uri=uri, before_retry=None if cutoff is None else still_old
            )
        except S3NotFound:
            return False
        except _Settled as settled:
            return settled.removed
        return True

    async def _object_age(self, key: str, uri: str, cutoff: datetime | None) -> Literal['absent', 'recent', 'old']:
        """Whether the object is there and, against `cutoff`, surely put before it (`None`: any object is old)."""
        try:
            response = await self._send(op='HEAD', method='HEAD', key=key, uri=uri)
        except S3NotFound:
            return 'absent'
        if cutoff is None:
            return 'old'
        modified = http_date(response.headers.get('last-modified'))
        if modified is None:  # cannot tell when it was put: keep it
            return 'recent'
        return 'old' if modified + LAST_MODIFIED_RESOLUTION <= cutoff else 'recent'

    def _uri_for_key(self, key: str) -> str | None:
        """The URI whose key (with an empty context) is `key`, from a digest in it; `None` for other objects."""
        if not key.startswith(self.key_prefix):
            return None
        for uri in uris_named_in_key(key[len(self.key_prefix) :]):
            try:
                if self._key(uri, EMPTY_CONTEXT) == key:
                    return uri
            except ValueError:  # a key this store refuses: it never stored that object
                continue
        return None

    def _list_error(self, problem: str, status: int) -> S3RequestError:
        return S3RequestError(
            f'S3 LIST s3://{self.bucket}/{self.key_prefix} {problem}',
            operation='LIST',
            bucket=self.bucket,
            key=self.key_prefix,
            status=status,
        )


class _Settled(Exception):
    """Raised by a DELETE's check before a retry: the object is gone (`removed`) or was put again."""

    def __init__(self, *, removed: bool) -> None:
        super().__init__('no retry: ' + ('the object is gone' if removed else 'the object was put again'))
        self.removed = removed
