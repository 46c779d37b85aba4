"""MongoMediaStore passes the shared media conformance suite against the test server."""

from __future__ import annotations

import pytest

from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.testing.media_store import MediaStoreConformance


class TestMongoMediaStore(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, url: str, database_name: str) -> MongoMediaStore:
        return MongoMediaStore(db_url=url, database=database_name)
