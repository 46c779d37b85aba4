"""MongoStepStore and MongoMediaStore pass the shared conformance suites against the test server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import MongoStepStore
from pydantic_ai_steps.store import Backend
from pydantic_ai_steps.testing.backend import BackendConformance, BackendFactory
from pydantic_ai_steps.testing.media_store import MediaStoreConformance
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory


class TestMongoStepStore(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, url: str, database_name: str) -> StoreFactory:
        def make(**options: Any) -> MongoStepStore:
            return MongoStepStore(db_url=url, database=database_name, **options)

        return make


class TestMongoBackend(BackendConformance):
    persistent = True

    @pytest.fixture
    async def make_backend(self, url: str, database_name: str, anyio_backend: str) -> AsyncIterator[BackendFactory]:
        del anyio_backend
        made: list[Backend] = []

        def make() -> Backend:
            backend = MongoStepStore(db_url=url, database=database_name, media_store=None).backend
            made.append(backend)
            return backend

        yield make
        for backend in made:
            await backend.aclose()


class TestMongoMediaStore(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, url: str, database_name: str) -> MongoMediaStore:
        return MongoMediaStore(db_url=url, database=database_name)
