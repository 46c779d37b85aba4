"""`PsycopgPool`: a `psycopg_pool.AsyncConnectionPool` as the stores' pool protocol.

DBOS and LangGraph users already hold such a pool, so the stores accept it as it is (passing one
as `pool` wraps it here). Statements keep PostgreSQL's own `$n` placeholders through psycopg's
raw cursors, so a value used twice is bound once. A connection the pool hands out is switched to
autocommit for the store's statements (each is its own transaction: one round trip, no `BEGIN`
and `COMMIT` around it) and switched back before it returns to the pool. `transaction()` opens a
real transaction when a store needs several statements as one unit (migrations, chunked media).

Behind PgBouncer in transaction mode, build the pool with `kwargs={'prepare_threshold': None}`,
so psycopg never prepares a statement on a server connection the next transaction may not get.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

__all__ = ['PsycopgPool']


class PsycopgConnection:
    """One psycopg `AsyncConnection`, spoken to as an asyncpg connection is."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return cast(AbstractAsyncContextManager[object], self._connection.transaction())

    async def execute(self, query: str, *args: object) -> object:
        async with self._cursor() as cursor:
            await cursor.execute(query, args or None)
            return cursor.statusmessage

    async def fetch(self, query: str, *args: object) -> Sequence[Sequence[object]]:
        async with self._cursor() as cursor:
            await cursor.execute(query, args or None)
            return cast(Sequence[Sequence[object]], await cursor.fetchall())

    async def fetchrow(self, query: str, *args: object) -> Sequence[object] | None:
        async with self._cursor() as cursor:
            await cursor.execute(query, args or None)
            return cast(Sequence[object] | None, await cursor.fetchone())

    async def fetchval(self, query: str, *args: object) -> object:
        row = await self.fetchrow(query, *args)
        return row[0] if row is not None else None

    def _cursor(self) -> Any:
        from psycopg import AsyncRawCursor

        return AsyncRawCursor(self._connection)


class PsycopgPool:
    """Wraps a `psycopg_pool.AsyncConnectionPool`; the caller keeps owning (and closing) it."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def __repr__(self) -> str:
        return f'PsycopgPool({self.pool!r})'

    def get_max_size(self) -> int:
        return int(self.pool.max_size)

    @asynccontextmanager
    async def acquire(self) -> AsyncGenerator[PsycopgConnection]:
        async with self.pool.connection() as connection:
            autocommit = bool(connection.autocommit)
            if not autocommit:
                await connection.set_autocommit(True)
            try:
                yield PsycopgConnection(connection)
            finally:
                if not autocommit and not connection.closed:
                    await connection.set_autocommit(False)
