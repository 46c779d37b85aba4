"""Fixtures for the PostgreSQL stores: the test server's DSN, a fresh table prefix per test, pools.

Every test gets its own prefix (`t_<hex>`), so tests never see each other's rows, and every table
and function under it is dropped afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

from tests.conftest import require_env


@pytest.fixture
def dsn() -> str:
    return require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']


def drop_prefix(dsn: str, prefix: str) -> None:
    """Drop every table and function whose name starts with `<prefix>_`."""
    pattern = prefix.replace('_', r'\_') + r'\_%'
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE %s "
                'AND relnamespace = current_schema()::regnamespace',
                (pattern,),
            )
        ]
        functions = [
            row[0]
            for row in conn.execute(
                'SELECT p.oid::regprocedure::text FROM pg_proc p WHERE proname LIKE %s '
                'AND pronamespace = current_schema()::regnamespace',
                (pattern,),
            )
        ]
        for table in tables:
            conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')  # pyright: ignore[reportArgumentType]
        for function in functions:
            conn.execute(f'DROP FUNCTION IF EXISTS {function}')  # pyright: ignore[reportArgumentType]


@pytest.fixture
def prefix(dsn: str) -> Iterator[str]:
    name = f't_{secrets.token_hex(6)}'
    yield name
    drop_prefix(dsn, name)


class ConnectPerAcquire:
    """The smallest pool: a new asyncpg connection for each `acquire()`, closed on release.

    For the one conformance test that runs each example in an event loop of its own
    (`anyio.run`), where a pool opened in the fixture's loop cannot be used.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            yield conn
        finally:
            await conn.close()


def in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
