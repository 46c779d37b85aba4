"""Live S3 servers for the tests in this folder: moto (signatures checked) and SeaweedFS.

`scripts/services.sh start` writes their addresses and keys to an env file; without those
variables the live tests skip (and fail under CI=true, see `tests.conftest.require_env`).
Buckets get a fresh name per test run and are emptied and deleted afterwards.

The `S3Admin` helper signs with botocore, not with the code under test, so what it reports
about the server's state (headers, pending uploads) is an independent observation.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from pydantic_ai_steps.media import S3MediaStore
from tests.conftest import require_env

SERVERS = {'moto': 'TEST_S3', 'seaweedfs': 'TEST_S3B'}
RUN_ID = uuid.uuid4().hex[:10]
REGION = 'us-east-1'


@dataclass(frozen=True)
class Server:
    name: str
    endpoint: str
    access_key: str
    secret_key: str


class S3Admin:
    """Bucket set-up, tear-down and inspection, signed by botocore."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = httpx.Client(timeout=30)

    def request(self, method: str, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        url = self.server.endpoint + quote(path, safe='/~')
        request = AWSRequest(method=method, url=url, params=params or {}, data=b'')
        credentials = Credentials(self.server.access_key, self.server.secret_key)
        S3SigV4Auth(credentials, 's3', REGION).add_auth(request)
        prepared = request.prepare()
        return self.client.request(method, prepared.url, headers=dict(prepared.headers.items()))

    def create_bucket(self, bucket: str) -> None:
        response = self.request('PUT', f'/{bucket}')
        assert response.status_code == 200, response.text

    def head(self, bucket: str, key: str) -> httpx.Headers:
        response = self.request('HEAD', f'/{bucket}/{key}')
        assert response.status_code == 200, response.status_code
        return response.headers

    def pending_uploads(self, bucket: str) -> list[tuple[str, str]]:
        """(key, upload id) of every multipart upload started and neither completed nor aborted."""
        response = self.request('GET', f'/{bucket}', {'uploads': ''})
        assert response.status_code == 200, response.text
        root = ElementTree.fromstring(response.content)
        return [
            (_child_text(upload, 'Key'), _child_text(upload, 'UploadId'))
            for upload in root.iter()
            if upload.tag.rsplit('}', 1)[-1] == 'Upload'
        ]

    def keys(self, bucket: str) -> list[str]:
        response = self.request('GET', f'/{bucket}', {'list-type': '2'})
        assert response.status_code == 200, response.text
        root = ElementTree.fromstring(response.content)
        return [_child_text(item, 'Key') for item in root.iter() if item.tag.rsplit('}', 1)[-1] == 'Contents']

    def delete_bucket(self, bucket: str) -> None:
        for key, upload_id in self.pending_uploads(bucket):
            self.request('DELETE', f'/{bucket}/{key}', {'uploadId': upload_id})
        for key in self.keys(bucket):
            self.request('DELETE', f'/{bucket}/{key}')
        self.request('DELETE', f'/{bucket}')


def _child_text(element: ElementTree.Element, name: str) -> str:
    for child in element:
        if child.tag.rsplit('}', 1)[-1] == name:
            return child.text or ''
    return ''


@pytest.fixture(params=sorted(SERVERS))
def server(request: pytest.FixtureRequest) -> Server:
    prefix = SERVERS[request.param]
    env = require_env(f'{prefix}_ENDPOINT', f'{prefix}_ACCESS_KEY', f'{prefix}_SECRET_KEY')
    return Server(request.param, env[f'{prefix}_ENDPOINT'], env[f'{prefix}_ACCESS_KEY'], env[f'{prefix}_SECRET_KEY'])


@pytest.fixture(scope='session')
def _buckets() -> Iterator[dict[str, tuple[S3Admin, str]]]:
    made: dict[str, tuple[S3Admin, str]] = {}
    yield made
    for admin, bucket in made.values():
        admin.delete_bucket(bucket)
        admin.client.close()


@pytest.fixture
def admin(server: Server, _buckets: dict[str, tuple[S3Admin, str]]) -> S3Admin:
    if server.name not in _buckets:
        helper = S3Admin(server)
        bucket = f'steps-{RUN_ID}-{server.name}'
        helper.create_bucket(bucket)
        _buckets[server.name] = (helper, bucket)
    return _buckets[server.name][0]


@pytest.fixture
def bucket(server: Server, admin: S3Admin, _buckets: dict[str, tuple[S3Admin, str]]) -> str:
    """A bucket unique to this test run on `server` (one per server, shared by the run's tests)."""
    return _buckets[server.name][1]


@pytest.fixture
async def make_store(server: Server, bucket: str) -> AsyncIterator[Any]:
    """Build stores on the live server; each is closed after the test."""
    stores: list[S3MediaStore] = []

    def build(**options: Any) -> S3MediaStore:
        arguments: dict[str, Any] = {
            'bucket': bucket,
            'endpoint': server.endpoint,
            'region': REGION,
            'access_key_id': server.access_key,
            'secret_access_key': server.secret_key,
            'key_prefix': f'{uuid.uuid4().hex[:8]}/',  # tests sharing the bucket never share keys
        }
        arguments.update(options)
        store = S3MediaStore(**arguments)
        stores.append(store)
        return store

    yield build
    for store in stores:
        await store.aclose()
