"""An in-memory S3 behind `httpx.MockTransport`, for tests of the store's logic without a server.

Every request's signature is recomputed with botocore's `S3SigV4Auth` and refused (403
SignatureDoesNotMatch) when it differs, so no unit test can pass with a request a real server
would reject. Faults are injected with `fail_when`.
"""

from __future__ import annotations

import email.utils
import hashlib
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from unittest.mock import patch
from urllib.parse import parse_qsl, unquote
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import anyio
import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ACCESS_KEY = 'AKIAFAKEFAKEFAKE1234'
SECRET_KEY = 'fake/Secret+Key=0123456789abcdefSECRET'
SESSION_TOKEN = 'FakeSessionToken/abc+def=TOKEN'

Fault = Callable[[httpx.Request], 'httpx.Response | None']
LONG_AGO = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)
"""The modification time of an object a test placed in `objects` directly."""


def _now_to_the_second() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)  # S3 keeps modification times to the second


def error_response(status: int, code: str, message: str = 'injected', headers: dict[str, str] | None = None):
    body = f'<Error><Code>{code}</Code><Message>{message}</Message><RequestId>req-1</RequestId></Error>'
    return httpx.Response(status, content=body.encode(), headers=headers)


@dataclass
class Call:
    method: str
    raw_path: str
    key: str
    query: dict[str, str]
    headers: httpx.Headers
    timeout: dict[str, float | None]


@dataclass
class FakeS3:
    bucket: str = 'bkt'
    secret_key: str = SECRET_KEY
    session_token: str | None = None
    objects: dict[str, tuple[bytes, dict[str, str]]] = field(default_factory=dict)
    modified: dict[str, datetime] = field(default_factory=dict)
    clock: Callable[[], datetime] = _now_to_the_second
    uploads: dict[str, dict[str, object]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    in_flight_parts: int = 0
    max_in_flight_parts: int = 0
    part_gate: int = 0  # parts wait until this many are in flight at once (proves parallelism)
    _gate: anyio.Event = field(default_factory=anyio.Event)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def fail_when(self, fault: Fault) -> None:
        """`fault(request)` runs first; a response (or raised httpx error) replaces the real answer."""
        self.faults.append(fault)

    def count(self, method: str, *, query: str | None = None) -> int:
        return sum(1 for c in self.calls if c.method == method and (query is None or query in c.query))

    async def handle(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        raw_path, _, raw_query = request.url.raw_path.decode('ascii').partition('?')
        query = dict(parse_qsl(raw_query, keep_blank_values=True))
        bucket, _, key = unquote(raw_path).lstrip('/').partition('/')
        self.calls.append(
            Call(request.method, raw_path, key, query, request.headers, dict(request.extensions.get('timeout', {})))
        )
        for fault in self.faults:
            answer = fault(request)
            if answer is not None:
                return answer
        if (refusal := self._check_signature(request)) is not None:
            return refusal
        if bucket != self.bucket:
            return error_response(404, 'NoSuchBucket', 'The specified bucket does not exist')
        if 'partNumber' in query:
            return await self._upload_part(request, query)
        if request.method == 'POST' and 'uploads' in query:
            upload_id = f'up-{next(self._ids)}+/='  # awkward characters on purpose
            self.uploads[upload_id] = {'key': key, 'headers': _meta(request), 'parts': {}}
            xml = f'<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>'
            return httpx.Response(200, content=xml.encode())
        if request.method == 'POST' and 'uploadId' in query:
            return self._complete(key, query['uploadId'], request.content)
        if request.method == 'DELETE' and 'uploadId' in query:
            if self.uploads.pop(query['uploadId'], None) is None:
                return error_response(404, 'NoSuchUpload', 'no such upload')
            return httpx.Response(204)
        if request.method == 'PUT':
            self.objects[key] = (request.content, _meta(request))
            self.modified[key] = self.clock()
            return httpx.Response(200, headers={'etag': f'"{hashlib.md5(request.content).hexdigest()}"'})
        if request.method == 'GET' and not key and query.get('list-type') == '2':
            return self._list(query)
        if request.method == 'DELETE':
            self.objects.pop(key, None)  # S3 answers 204 whether or not the key existed
            self.modified.pop(key, None)
            return httpx.Response(204)
        if request.method in ('GET', 'HEAD'):
            if key not in self.objects:
                if request.method == 'HEAD':
                    return httpx.Response(404)
                return error_response(404, 'NoSuchKey', 'The specified key does not exist.')
            data, headers = self.objects[key]
            content = data if request.method == 'GET' else b''
            modified = email.utils.format_datetime(self.modified.get(key, LONG_AGO), usegmt=True)
            return httpx.Response(
                200, content=content, headers={**headers, 'content-length': str(len(data)), 'last-modified': modified}
            )
        return error_response(400, 'NotImplementedHere')

    def _list(self, query: dict[str, str]) -> httpx.Response:
        """ListObjectsV2: keys in order, `max-keys` (at most 1000) a page, the token naming the last key listed."""
        prefix = query.get('prefix', '')
        after = query.get('continuation-token', '').removeprefix('after:')
        keys = sorted(key for key in self.objects if key.startswith(prefix) and key > after)
        size = min(1000, int(query.get('max-keys', '1000')))
        page, rest = keys[:size], keys[size:]
        contents = ''.join(
            f'<Contents><Key>{escape(key)}</Key>'
            f'<LastModified>{self.modified.get(key, LONG_AGO).strftime("%Y-%m-%dT%H:%M:%S.000Z")}</LastModified>'
            f'<ETag>"x"</ETag><Size>{len(self.objects[key][0])}</Size><StorageClass>STANDARD</StorageClass></Contents>'
            for key in page
        )
        more = f'<NextContinuationToken>{escape("after:" + page[-1])}</NextContinuationToken>' if rest else ''
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>{self.bucket}</Name>'
            f'<Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount><MaxKeys>{size}</MaxKeys>'
            f'<IsTruncated>{"true" if rest else "false"}</IsTruncated>{more}{contents}</ListBucketResult>'
        )
        return httpx.Response(200, content=xml.encode())

    async def _upload_part(self, request: httpx.Request, query: dict[str, str]) -> httpx.Response:
        upload = self.uploads.get(query['uploadId'])
        if upload is None:
            return error_response(404, 'NoSuchUpload')
        self.in_flight_parts += 1
        self.max_in_flight_parts = max(self.max_in_flight_parts, self.in_flight_parts)
        try:
            if self.part_gate:
                if self.in_flight_parts >= self.part_gate:
                    self._gate.set()
                with anyio.fail_after(10):  # a safety net against a hang, not a timing assertion
                    await self._gate.wait()
            parts = upload['parts']
            assert isinstance(parts, dict)
            parts[int(query['partNumber'])] = request.content
            return httpx.Response(200, headers={'etag': f'"{hashlib.md5(request.content).hexdigest()}"'})
        finally:
            self.in_flight_parts -= 1

    def _complete(self, key: str, upload_id: str, body: bytes) -> httpx.Response:
        upload = self.uploads.pop(upload_id, None)
        if upload is None:
            return error_response(404, 'NoSuchUpload')
        parts = upload['parts']
        headers = upload['headers']
        assert isinstance(parts, dict) and isinstance(headers, dict)
        listed = [
            (int(part.findtext('PartNumber') or 0), part.findtext('ETag') or '')
            for part in ElementTree.fromstring(body).iter('Part')
        ]
        assert [n for n, _ in listed] == sorted(parts), f'complete lists {listed}, uploaded {sorted(parts)}'
        for number, etag in listed:
            assert etag == f'"{hashlib.md5(parts[number]).hexdigest()}"'
        self.objects[key] = (b''.join(parts[n] for n, _ in listed), headers)
        self.modified[key] = self.clock()
        return httpx.Response(200, content=b'<CompleteMultipartUploadResult/>')

    def _check_signature(self, request: httpx.Request) -> httpx.Response | None:
        auth = request.headers.get('authorization', '')
        match = re.fullmatch(
            r'AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, '
            r'SignedHeaders=([a-z0-9;-]+), Signature=[0-9a-f]{64}',
            auth,
        )
        if match is None:
            return error_response(403, 'AccessDenied', f'malformed authorization {auth!r}')
        access_key, _, region, signed = match.groups()
        if access_key != ACCESS_KEY:
            return error_response(403, 'InvalidAccessKeyId', 'The AWS Access Key Id you provided does not exist')
        names = signed.split(';')
        for required in ('host', 'x-amz-content-sha256', 'x-amz-date'):
            assert required in names, f'{required} is not signed'
        unsigned_amz = [n for n in request.headers if n.startswith('x-amz-') and n not in names]
        assert not unsigned_amz, f'unsigned x-amz headers sent: {unsigned_amz}'
        if request.headers['x-amz-content-sha256'] != hashlib.sha256(request.content).hexdigest():
            return error_response(400, 'XAmzContentSHA256Mismatch', 'payload hash mismatch')
        reference = AWSRequest(
            method=request.method,
            url=str(request.url),
            data=request.content,
            headers={n: request.headers[n] for n in names if n not in ('x-amz-date', 'x-amz-security-token')},
        )
        stamp = datetime.strptime(request.headers['x-amz-date'], '%Y%m%dT%H%M%SZ')
        with patch('botocore.auth.get_current_datetime', return_value=stamp):
            S3SigV4Auth(Credentials(access_key, self.secret_key, self.session_token), 's3', region).add_auth(reference)
        if reference.headers['Authorization'] != auth:
            return error_response(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match')
        return None


def _meta(request: httpx.Request) -> dict[str, str]:
    return {n: v for n, v in request.headers.items() if n.startswith('x-amz-meta-') or n == 'content-type'}
