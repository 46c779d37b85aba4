"""`PostgresStepStore`: every record in PostgreSQL tables under a prefix, shared by any number of processes.

Tables and migrations: `_schema`. Writes: one statement each (`_backend`). Connections: a
caller's pool or one opened from a DSN, with retries only where a replay is harmless (`_pool`);
a psycopg pool through `_psycopg`. Upstream snapshot layouts: `_legacy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...._errors import StoreUrlError
from ....media._protocol import MediaStore
from ...base import StepStoreBase
from ._backend import PostgresBackend
from ._pool import DEFAULT_ACQUIRE_TIMEOUT, Connections, PoolTimeoutError, PostgresConnection, PostgresPool
from ._psycopg import PsycopgPool
from ._schema import check_prefix

if TYPE_CHECKING:
    from ...registry import StoreLocation

__all__ = [
    'PoolTimeoutError',
    'PostgresConnection',
    'PostgresPool',
    'PostgresStepStore',
    'PsycopgPool',
    'open_location',
]


class PostgresStepStore(StepStoreBase):
    """A `StepStore` in PostgreSQL: one database every worker, replica and machine can reach.

    ```python
    store = PostgresStepStore(dsn='postgresql://app@db:5432/agents')   # the store opens its own pool
    store = PostgresStepStore(pool)                                     # or uses yours
    ```

    Give exactly one of `pool` (yours, never closed by the store: an `asyncpg.Pool`, a
    `psycopg_pool.AsyncConnectionPool`, or anything with the upstream `acquire()` protocol) or
    `dsn=` (the store opens an asyncpg pool, lazily, with `pool_options=` passed to
    `asyncpg.create_pool`, and closes it in `aclose()`). Tables are named `<table>_runs`,
    `<table>_events` and so on; `table` follows upstream's rule (lowercase, at most 40 characters).
    The schema is created or migrated by the first write, under an advisory lock, never by a read.

    Each write (`write_records`, or any single-record call) is one statement, so one round trip
    whatever the history's length; each uses one connection from the pool and returns it before
    the call returns, and payloads of `media_threshold_bytes` or more are put in the media store
    before that connection is taken. By default they go to a `PostgresMediaStore` over the same
    pool, table `<table>_media`; `media_store=None` keeps them inline. `acquire_timeout` bounds
    the wait for a free connection (`PoolTimeoutError` after it).
    """

    def __init__(
        self,
        pool: object | None = None,
        *,
        dsn: str | None = None,
        table: str = 'step_persistence',
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        max_snapshots_per_run: int | None = None,
        max_run_age: timedelta | None = None,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
        pool_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.table = check_prefix(table)
        connections = Connections(pool, dsn, acquire_timeout=acquire_timeout, pool_options=pool_options)
        owned = media_store == 'auto'
        if media_store == 'auto':
            from ....media.stores.postgres import PostgresMediaStore

            media_store = PostgresMediaStore._over(connections, table=f'{self.table}_media')  # pyright: ignore[reportPrivateUsage]
        super().__init__(
            PostgresBackend(connections, self.table),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            max_run_age=max_run_age,
            owns_media_store=owned,
        )
        self._connections = connections

    @property
    def pool(self) -> PostgresPool | None:
        """The caller's pool (wrapped, for a psycopg pool); `None` when the store opened its own."""
        return self._connections.caller_pool

    def __repr__(self) -> str:
        return (
            f'PostgresStepStore({self._connections.describe()}, table={self.table!r}, '
            f'max_snapshots_per_run={self.max_snapshots_per_run}, media_store={self.media_store!r})'
        )


def split_location(url: str) -> tuple[str, str | None]:
    """A `postgresql://` URL without this package's own `table=` query parameter, and that parameter."""
    parts = urlsplit(url)
    table: str | None = None
    kept: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == 'table':
            table = value
        else:
            kept.append((key, value))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment)), table


def open_location(location: StoreLocation, **options: Any) -> PostgresStepStore:
    """The store a `postgresql://user@host:port/db[?table=prefix]` URL names (the registry's entry point)."""
    dsn, table = split_location(location.target)
    if table is not None and 'table' not in options:
        try:
            options['table'] = check_prefix(table)
        except ValueError as error:
            raise StoreUrlError(f'bad postgresql store URL {location.url!r}: {error}') from None
    return PostgresStepStore(dsn=dsn, **options)
