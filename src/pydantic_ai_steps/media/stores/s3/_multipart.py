"""Multipart uploads: a large blob goes up in parts, in parallel; a failed upload is aborted.

Aborting matters: the parts of an upload that is never completed stay stored, and billed, until
a bucket lifecycle rule or a manual abort removes them. So a failed or cancelled upload aborts
itself, shielded from the cancellation and bounded in time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Final
from xml.sax.saxutils import escape as xml_escape

import anyio

from .._sha256 import sha256_hex
from ._errors import S3Error, S3NotFound, S3RequestError
from ._parsing import xml_field
from ._transport import S3Transport, logger

MiB: Final = 1024 * 1024
MIN_PART_SIZE: Final = 5 * MiB
"""S3 rejects multipart parts below 5 MiB (except the last one)."""
MAX_PARTS: Final = 10_000
ABORT_DEADLINE_SECONDS: Final = 30.0
"""How long a failed or cancelled multipart upload may spend aborting itself (shielded from cancellation)."""


class S3Multipart(S3Transport):
    """The multipart upload of `S3MediaStore.put` for payloads above `multipart_threshold_bytes`."""

    _part_size: int
    _concurrency: int

    async def _put_multipart(self, key: str, data: bytes, headers: Mapping[str, str]) -> None:
        part_size = max(self._part_size, -(-len(data) // MAX_PARTS))
        created = await self._send(
            op='multipart create',
            method='POST',
            key=key,
            query=[('uploads', '')],
            headers=headers,
            idempotent=False,  # a lost answer would leave an upload we cannot name, so never resend
        )
        upload_id = xml_field(created.content, 'UploadId')
        if not upload_id:
            raise S3RequestError(
                f'S3 multipart create s3://{self.bucket}/{key} answered without an UploadId',
                operation='multipart create',
                bucket=self.bucket,
                key=key,
                status=created.status_code,
            )
        try:
            etags = await self._upload_parts(key, upload_id, data, part_size)
            await self._complete_multipart(key, upload_id, etags, len(data))
        except BaseException as exc:
            await self._abort_multipart(key, upload_id, exc)
            raise

    async def _upload_parts(self, key: str, upload_id: str, data: bytes, part_size: int) -> list[str]:
        count = -(-len(data) // part_size)
        etags: list[str] = [''] * count
        failures: list[Exception] = []
        pending = iter(range(count))  # shared by the workers: each part is taken exactly once

        async def worker(scope: anyio.CancelScope) -> None:
            for index in pending:
                chunk = data[index * part_size : (index + 1) * part_size]
                op = f'multipart part {index + 1}/{count}'
                try:
                    response = await self._send(
                        op=op,
                        method='PUT',
                        key=key,
                        query=[('partNumber', str(index + 1)), ('uploadId', upload_id)],
                        body=chunk,
                        payload_sha256=await sha256_hex(chunk),
                    )
                    etag = response.headers.get('etag')
                    if not etag:
                        raise S3RequestError(
                            f'S3 {op} s3://{self.bucket}/{key} answered without an ETag',
                            operation=op,
                            bucket=self.bucket,
                            key=key,
                            status=response.status_code,
                        )
                except Exception as exc:
                    failures.append(exc)
                    scope.cancel()  # stop the other parts: the upload is going to be aborted
                    return
                etags[index] = etag

        async with anyio.create_task_group() as group:
            for _ in range(min(self._concurrency, count)):
                group.start_soon(worker, group.cancel_scope)
        if failures:
            raise failures[0]
        return etags

    async def _complete_multipart(self, key: str, upload_id: str, etags: Sequence[str], size: int) -> None:
        parts = ''.join(
            f'<Part><PartNumber>{number}</PartNumber><ETag>{xml_escape(etag)}</ETag></Part>'
            for number, etag in enumerate(etags, start=1)
        )
        body = f'<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>'.encode()
        try:
            await self._send(
                op='multipart complete',
                method='POST',
                key=key,
                query=[('uploadId', upload_id)],
                headers={'content-type': 'application/xml'},
                body=body,
                payload_sha256=hashlib.sha256(body).hexdigest(),
                error_in_ok_body=True,  # S3 may send 200 and then an <Error> for this call
            )
        except S3RequestError as exc:
            # A retried complete whose first attempt did succeed finds the upload gone. The key
            # is content-addressed, so an object of the right size there is our object.
            if exc.code != 'NoSuchUpload' or await self._object_size(key) != size:
                raise

    async def _abort_multipart(self, key: str, upload_id: str, cause: BaseException) -> None:
        """Abort a failed upload so its parts do not linger; note on `cause` if even that fails."""
        problem: str | None = None
        # Shielded and bounded: it must run even when the upload was cancelled, and must not
        # hang a cancelled caller for long.
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_DEADLINE_SECONDS) as deadline:
            try:
                await self._send(op='multipart abort', method='DELETE', key=key, query=[('uploadId', upload_id)])
            except S3Error as exc:
                if exc.code != 'NoSuchUpload':  # NoSuchUpload: already gone, nothing left behind
                    problem = str(exc)
            else:
                logger.info('aborted multipart upload of s3://%s/%s after a failure', self.bucket, key)
        if deadline.cancelled_caught:
            problem = f'no answer within {ABORT_DEADLINE_SECONDS:.0f} s'
        if problem is None:
            return
        note = (
            f'aborting multipart upload {upload_id} of s3://{self.bucket}/{key} also failed ({problem}); '
            'its parts stay stored until a bucket lifecycle rule or a manual abort removes them'
        )
        logger.warning('%s', note)
        cause.add_note(note)

    async def _object_size(self, key: str) -> int | None:
        try:
            response = await self._send(op='HEAD', method='HEAD', key=key)
        except S3NotFound:
            return None
        length = response.headers.get('content-length')
        return int(length) if length and length.isdigit() else None
