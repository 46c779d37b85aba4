"""PostgreSQL pieces shared by the benches: a fresh table prefix, a pool that counts statements,
the floor (the same rows inserted by the bare driver), and the size of what a prefix holds.

Used only when `TEST_POSTGRES_DSN` names a server (`scripts/services.sh start` exports it).
"""

from __future__ import annotations

import importlib
import os
import secrets
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from typing import Any

asyncpg: Any = importlib.import_module('asyncpg')  # no type stubs: used as Any


def dsn() -> str | None:
    return os.environ.get('TEST_POSTGRES_DSN') or None


def fresh_prefix(kind: str = 'bench') -> str:
    return f'{kind}_{secrets.token_hex(4)}'


class CountingConnection:
    """An asyncpg connection that counts the statements sent through it (each one round trip)."""

    def __init__(self, conn: Any, counter: list[int]) -> None:
        self._conn = conn
        self._counter = counter

    def transaction(self) -> Any:
        return self._conn.transaction()

    async def execute(self, query: str, *args: object) -> object:
        self._counter[0] += 1
        return await self._conn.execute(query, *args)

    async def fetch(self, query: str, *args: object) -> Any:
        self._counter[0] += 1
        return await self._conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: object) -> Any:
        self._counter[0] += 1
        return await self._conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: object) -> Any:
        self._counter[0] += 1
        return await self._conn.fetchval(query, *args)


class LazyPool:
    """An asyncpg pool opened on first use in the running loop; with `counting`, its statements are counted."""

    def __init__(self, url: str, *, counting: bool = False, max_size: int = 4, store_pool: bool = False) -> None:
        self.url = url
        self.counting = counting
        self.store_pool = store_pool
        """Open it as a store opens its own (`dsn=`): no reset query on release."""
        self.max_size = max_size
        self.statements = [0]
        self.acquired = 0
        self._pool: Any = None

    async def pool(self) -> Any:
        if self._pool is None:
            options: dict[str, Any] = {'min_size': 1, 'max_size': self.max_size}
            if self.store_pool:
                from pydantic_ai_steps.store.backends.postgres._pool import owned_pool_options

                options = owned_pool_options(options)
            self._pool = await asyncpg.create_pool(self.url, **options)
        return self._pool

    @asynccontextmanager
    async def acquire(self) -> AsyncGenerator[Any]:
        pool = await self.pool()
        async with pool.acquire() as conn:
            self.acquired += 1
            yield CountingConnection(conn, self.statements) if self.counting else conn

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def server_transactions(url: str) -> int:
    """Transactions committed in the database so far (`pg_stat_database.xact_commit`, flushed first)."""
    conn: Any = await asyncpg.connect(url)
    try:
        await conn.execute('SELECT pg_stat_force_next_flush()')
        return int(await conn.fetchval('SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()'))
    finally:
        await conn.close()


async def prefix_bytes(url: str, prefix: str) -> int:
    """`pg_total_relation_size` of every table under the prefix (TOAST and indexes included)."""
    conn: Any = await asyncpg.connect(url)
    try:
        value = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c WHERE c.relkind = 'r' "
            'AND c.relname LIKE $1 AND c.relnamespace = current_schema()::regnamespace',
            prefix.replace('_', '\\_') + '\\_%',
        )
        return int(value)
    finally:
        await conn.close()


async def drop_prefix(url: str, prefix: str) -> None:
    conn: Any = await asyncpg.connect(url)
    try:
        pattern = prefix.replace('_', '\\_') + '\\_%'
        for (name,) in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE $1 "
            'AND relnamespace = current_schema()::regnamespace',
            pattern,
        ):
            await conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
        for (name,) in await conn.fetch(
            'SELECT oid::regprocedure::text FROM pg_proc WHERE proname LIKE $1 '
            'AND pronamespace = current_schema()::regnamespace',
            pattern,
        ):
            await conn.execute(f'DROP FUNCTION IF EXISTS {name}')
    finally:
        await conn.close()


class Floor:
    """The bare minimum the same writes cost: one autocommit `INSERT` of the same rows per write.

    With `pool`, each write takes a connection from that pool and gives it back, as every user of
    a caller's pool does (asyncpg's acquire and release are part of any statement sent through it);
    without, the writes go to one connection of the floor's own.
    """

    def __init__(self, url: str, prefix: str, pool: LazyPool | None = None) -> None:
        self.url = url
        self.table = f'{prefix}_floor'
        self.pool = pool
        self._conn: Any = None

    async def open(self) -> None:
        self._conn = await asyncpg.connect(self.url)
        await self._conn.execute(
            f'CREATE TABLE IF NOT EXISTS {self.table} (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
            'run_id text NOT NULL, kind text NOT NULL, body text NOT NULL)'
        )

    async def write(self, run_id: str, rows: Sequence[tuple[str, str]]) -> None:
        """One statement, one transaction: every `(kind, body)` row of one store write (opened on first use)."""
        if self._conn is None:
            await self.open()
        if self.pool is None:
            await self._insert(self._conn, run_id, rows)
            return
        async with self.pool.acquire() as conn:
            await self._insert(conn, run_id, rows)

    async def _insert(self, conn: Any, run_id: str, rows: Sequence[tuple[str, str]]) -> None:
        await conn.execute(
            f'INSERT INTO {self.table} (run_id, kind, body) '
            'SELECT $1, k, b FROM unnest($2::text[], $3::text[]) AS x(k, b)',
            run_id,
            [kind for kind, _ in rows],
            [body for _, body in rows],
        )

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
