"""The PostgreSQL step store passes the shared conformance suites over asyncpg and over psycopg."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from pydantic_ai.messages import ModelMessage

from pydantic_ai_steps.step_persistence import PostgresStepStore
from pydantic_ai_steps.store import Backend
from pydantic_ai_steps.testing._snapshots import HISTORIES, ROUND_TRIP_SETTINGS
from pydantic_ai_steps.testing.backend import BackendConformance, BackendFactory
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory

from .conftest import ConnectPerAcquire

pytestmark = pytest.mark.server


@pytest.fixture
async def asyncpg_pool(dsn: str, anyio_backend: str) -> AsyncIterator[Any]:
    import asyncpg

    del anyio_backend
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def psycopg_pool(dsn: str, anyio_backend: str) -> AsyncIterator[Any]:
    from psycopg_pool import AsyncConnectionPool

    del anyio_backend
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
    await pool.open()
    yield pool
    await pool.close()


class _PropertyTestOnItsOwnConnections(StepStoreConformance):
    """The suite's property test runs each example in an event loop of its own (`anyio.run`), where
    a pool opened by an async fixture cannot be used (nor can any async fixture be requested): it
    runs here on a store whose pool opens a connection per `acquire()`, in whichever loop asks."""

    @pytest.fixture
    def loopless_store(self, dsn: str, prefix: str) -> StoreFactory:
        return lambda **options: PostgresStepStore(ConnectPerAcquire(dsn), table=prefix, **options)

    @ROUND_TRIP_SETTINGS
    @given(histories=HISTORIES)
    def test_arbitrary_histories_round_trip_exactly(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, loopless_store: StoreFactory, histories: list[list[ModelMessage]]
    ) -> None:
        inner: Any = StepStoreConformance.test_arbitrary_histories_round_trip_exactly.hypothesis.inner_test  # pyright: ignore[reportFunctionMemberAccess]
        inner(self, loopless_store, histories)


class TestPostgresStepStoreAsyncpg(_PropertyTestOnItsOwnConnections):
    persistent = True

    @pytest.fixture
    def make_store(self, asyncpg_pool: Any, prefix: str) -> StoreFactory:
        return lambda **options: PostgresStepStore(asyncpg_pool, table=prefix, **options)


class TestPostgresStepStorePsycopg(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, psycopg_pool: Any, prefix: str) -> StoreFactory:
        return lambda **options: PostgresStepStore(psycopg_pool, table=prefix, **options)

    def test_arbitrary_histories_round_trip_exactly(self) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        pytest.skip('runs in TestPostgresStepStoreAsyncpg: its texts are bound the same way through either driver')


class TestPostgresStepStoreOwnPool(StepStoreConformance):
    """`dsn=`: the store opens its pool in the loop that uses it and closes it in `aclose()`."""

    persistent = True

    @pytest.fixture
    async def make_store(self, dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[StoreFactory]:
        del anyio_backend
        made: list[PostgresStepStore] = []

        def make(**options: Any) -> PostgresStepStore:
            store = PostgresStepStore(dsn=dsn, table=prefix, pool_options={'min_size': 1, 'max_size': 3}, **options)
            made.append(store)
            return store

        yield make
        for store in made:
            await store.aclose()

    def test_arbitrary_histories_round_trip_exactly(self) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        pytest.skip('runs in TestPostgresStepStoreAsyncpg, on the same asyncpg connections')


class TestPostgresBackend(BackendConformance):
    persistent = True

    @pytest.fixture
    async def make_backend(self, dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[BackendFactory]:
        del anyio_backend
        made: list[Backend] = []

        def make() -> Backend:
            backend = PostgresStepStore(dsn=dsn, table=prefix, pool_options={'min_size': 1, 'max_size': 2}).backend
            made.append(backend)
            return backend

        yield make
        for backend in made:
            await backend.aclose()
