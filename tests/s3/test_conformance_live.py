"""The shared MediaStore conformance suite, run against both live S3 servers."""

from __future__ import annotations

import uuid
from datetime import timedelta

import httpx
import pytest

from pydantic_ai_steps.media import S3MediaStore
from pydantic_ai_steps.testing.media_store import MediaStoreConformance

from .conftest import REGION, Server

pytestmark = pytest.mark.server


class TestS3MediaStoreConformance(MediaStoreConformance):
    metadata_on_repeat_put = 'last'  # every put re-uploads the object with its own headers
    stored_at_resolution = timedelta(seconds=1)  # LastModified is kept to the second

    @pytest.fixture
    def media_store(self, server: Server, bucket: str) -> S3MediaStore:
        # A sync fixture, because the suite has a sync test and pytest cannot give it an async
        # fixture. So nothing is left to close: without keep-alive the store's client holds no
        # socket between requests. A fresh key prefix makes the shared bucket an empty store.
        return S3MediaStore(
            bucket=bucket,
            endpoint=server.endpoint,
            region=REGION,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
            key_prefix=f'conformance-{uuid.uuid4().hex[:8]}/',
            transport=httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0)),
        )
