"""Connections for the PostgreSQL stores: a caller's pool, or an asyncpg pool opened from a DSN.

The pool protocol is the upstream package's (`PostgresPool`, `PostgresConnection`): `acquire()`
as an async context manager, and on a connection `transaction()`, `execute`, `fetch`, `fetchrow`
and `fetchval` with `$n` parameters. An `asyncpg.Pool` is one as it is; a
`psycopg_pool.AsyncConnectionPool` becomes one through `PsycopgPool` (`_psycopg`).

`Connections` is what the stores use: one connection per operation, released before the call
returns (so a save that puts media first never holds two), acquired within `acquire_timeout`
seconds or `PoolTimeoutError`. A store given `dsn=` opens its asyncpg pool lazily, in the event
loop that first uses it (a new loop, as `anyio.run` makes, gets a pool of its own), and closes
it in `aclose()`. A caller's pool is never closed.

Parking (a pool the store opened only): a connection an operation is done with stays checked out
of the asyncpg pool, ready for the next operation, up to the pool's `min_size` connections (the
ones asyncpg keeps open anyway) and only while no operation waits for the pool. asyncpg's own
acquire and release cost about as much client CPU as the statement itself (its release runs in a
task of its own, two turns of the event loop), and a store does two writes per tool cycle. A
connection that failed, or whose operation raised, goes back to the pool, which checks and resets
or discards it; every 1,000th release goes back too, so the pool's upkeep (`max_queries`,
`expire_connections()`) still applies. `setup=` or `reset=` in `pool_options` turns parking off:
those hooks promise to run on every acquire and release.

A server that cannot be reached: an error opening a connection (refused, unknown host, the server
starting or shutting down) is `StoreUnavailableError` naming the server without its password,
chained from the driver's error cut where it enters the driver, whose frames hold the DSN
(`unreachable_error`): nothing of the operation was sent. An error once a statement is under way
stays the driver's: the server may have applied it.

Retries: a connection that turns out dead (the server restarted since it was pooled, a proxy
dropped it) fails the operation without any sign of what the server did with it. The operation
is tried once more, on another connection, only when that is safe: the failure came before
anything was sent, or the caller said the operation is replay-safe (every read, and writes whose
records are keyed, so a second application changes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, NoReturn, Protocol, SupportsIndex, TypeVar, cast, runtime_checkable

import anyio

from ...._errors import StepsError, StoreUnavailableError, StoreUrlError, sqlstate
from ...._urls import redacted_url

__all__ = [
    'Connections',
    'PoolTimeoutError',
    'PostgresConnection',
    'PostgresPool',
    'disconnect_kind',
    'nothing_reached',
    'sqlstate',
]

_R = TypeVar('_R')
DEFAULT_ACQUIRE_TIMEOUT = 30.0
DEFAULT_POOL_OPTIONS: Mapping[str, Any] = {'min_size': 1, 'max_size': 10}
_RETRIES = 3
_RECYCLE_EVERY = 1000


@runtime_checkable
class PostgresConnection(Protocol):
    """One connection: what the stores call on it (asyncpg's `Connection` spelling)."""

    def transaction(self) -> AbstractAsyncContextManager[object]: ...

    async def execute(self, query: str, *args: object) -> object: ...

    async def fetchval(self, query: str, *args: object) -> object: ...

    async def fetchrow(self, query: str, *args: object) -> Sequence[object] | None: ...

    async def fetch(self, query: str, *args: object) -> Sequence[Sequence[object]]: ...


@runtime_checkable
class PostgresPool(Protocol):
    """A pool handing out `PostgresConnection`s: `async with pool.acquire() as conn`."""

    def acquire(self) -> AbstractAsyncContextManager[PostgresConnection]: ...


class PoolTimeoutError(StoreUnavailableError, TimeoutError):
    """No connection of the pool became free in time: every one is in use (or the server is unreachable)."""


_UNSENT = ('connection is closed', 'the connection is closed', 'cannot perform operation: another operation')
_DISCONNECT_STATES = frozenset({'57P01', '57P02', '57P03', '08000', '08003', '08006', '08001', '08004'})


def disconnect_kind(error: BaseException) -> Literal['unsent', 'ambiguous'] | None:
    """Whether `error` says the connection is gone: before the statement was sent, or maybe after."""
    if isinstance(error, StepsError):
        return None  # ours (a pool that stayed full) is not a dead connection: waiting again would not help
    name = type(error).__name__
    text = str(error)
    if name == 'InterfaceError' and any(part in text for part in _UNSENT[:2]):
        return 'unsent'  # asyncpg checks the connection before it writes anything
    if type(error).__module__.startswith('psycopg') and name == 'OperationalError' and text == _UNSENT[1]:
        return 'unsent'
    if name in ('ConnectionDoesNotExistError', 'ConnectionFailureError') or sqlstate(error) in _DISCONNECT_STATES:
        return 'ambiguous'
    if isinstance(error, ConnectionError | EOFError):
        return 'ambiguous'
    if type(error).__module__.startswith('psycopg') and name in ('OperationalError', 'AdminShutdown'):
        return 'ambiguous'
    return None


_CANNOT_CONNECT_STATES = frozenset({'57P03', '08001', '08004', '08006'})
_DRIVERS = ('asyncpg', 'psycopg')


def nothing_reached(error: BaseException) -> bool:
    """Whether `error`, raised while opening a connection, says the server could not be reached: a
    socket error (refused, unknown host, unreachable, connect timed out), or the server refusing
    connections while it starts or shuts down."""
    if isinstance(error, StepsError):
        return False
    return isinstance(error, OSError) or sqlstate(error) in _CANNOT_CONNECT_STATES


def without_driver_frames(error: BaseException) -> BaseException:
    """`error`, and each error it was raised from or during, with its traceback cut where it enters
    a driver: asyncpg's connect frames hold the DSN, password included, as locals."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb, kept = current.__traceback__, None
        while tb is not None and not str(tb.tb_frame.f_globals.get('__name__', '')).startswith(_DRIVERS):
            kept, tb = tb, tb.tb_next
        if kept is None:
            current.__traceback__ = None
        else:
            kept.tb_next = None
        current = current.__cause__ or current.__context__
    return error


class Connections:
    """The stores' access to PostgreSQL: exactly one of a caller's `pool` or a `dsn` to open one from."""

    def __init__(
        self,
        pool: object | None,
        dsn: str | None,
        *,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
        pool_options: Mapping[str, Any] | None = None,
        owner: str = 'PostgresStepStore',
    ) -> None:
        if (pool is None) == (dsn is None):
            raise ValueError(
                f'{owner} needs exactly one of a pool (asyncpg.Pool, psycopg_pool.AsyncConnectionPool or '
                f'anything with acquire()) or dsn= (a postgresql:// URL the store opens a pool for); '
                f'got pool={pool!r}, dsn={"<given>" if dsn is not None else None}'
            )
        if isinstance(acquire_timeout, bool) or not isinstance(acquire_timeout, int | float) or acquire_timeout <= 0:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'acquire_timeout must be a positive number of seconds, got {acquire_timeout!r}')
        if dsn is not None and not isinstance(dsn, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'dsn must be a postgresql:// URL string, got {type(dsn).__name__}')
        self.acquire_timeout = float(acquire_timeout)
        self._dsn = dsn
        self._pool_options = {**DEFAULT_POOL_OPTIONS, **(pool_options or {})}
        self._caller_pool: PostgresPool | None = _as_pool(pool, owner) if pool is not None else None
        self._owned: Any = None
        self._owned_loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Future[Any] | None = None
        options = self._pool_options
        parkable = self._caller_pool is None and 'setup' not in options and 'reset' not in options
        min_size = options.get('min_size')
        self._park_limit = min_size if parkable and isinstance(min_size, int) and min_size > 0 else 0
        self._parked: list[tuple[AbstractAsyncContextManager[PostgresConnection], PostgresConnection]] = []
        self._waiting = 0
        self._releases = 0

    @property
    def owns_pool(self) -> bool:
        return self._caller_pool is None

    @property
    def caller_pool(self) -> PostgresPool | None:
        return self._caller_pool

    def describe(self) -> str:
        return 'pool=<caller-owned>' if self._caller_pool is not None else 'dsn=<given>'

    def server(self) -> str:
        """The server, as a message names it: the DSN without its password, or what the caller's pool connects to."""
        if self._dsn is not None:
            return f'named by dsn={redacted_url(self._dsn)!r}'
        args, kwargs = (
            getattr(self._caller_pool, '_connect_args', ()),
            getattr(self._caller_pool, '_connect_kwargs', {}),
        )
        if isinstance(args, tuple) and args and isinstance(args[0], str):  # an asyncpg pool made from a DSN
            return f'of pool= ({redacted_url(args[0])!r})'
        host = cast(dict[str, object], kwargs).get('host') if isinstance(kwargs, dict) else None
        return f'of pool= (host {host!r})' if host is not None else 'of pool='

    @contextlib.contextmanager
    def reporting_unreachable(self) -> Generator[None]:
        """Errors of opening a connection: `StoreUnavailableError` where the server could not be reached."""
        try:
            yield
        except Exception as error:
            if not nothing_reached(error):
                raise
            said = _without_password(f'{type(error).__name__}: {error}', self._dsn)  # no local holds it
            raise StoreUnavailableError(
                f'the PostgreSQL server {self.server()} could not be reached: {said}'
            ) from without_driver_frames(error)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(
            'a PostgreSQL store cannot be pickled or copied: it holds a pool and, built from dsn=, the '
            "DSN's credentials, which must not be written into a pickle; build a new store where another is needed"
        )

    async def _pool(self) -> Any:
        if self._caller_pool is not None:
            return self._caller_pool
        loop = asyncio.get_running_loop()
        if self._owned is not None and self._owned_loop is loop:
            return self._owned
        if self._opening is None or self._owned_loop is not loop:
            self._abandon()
            self._owned_loop = loop
            self._opening = asyncio.ensure_future(self._open())
        opening = self._opening
        try:
            pool = await asyncio.shield(opening)
        except BaseException:
            if self._opening is opening and opening.done():
                self._opening = None  # a failed open is tried again by the next call
            raise
        self._owned = pool
        return pool

    async def _open(self) -> Any:
        try:
            import asyncpg  # pyright: ignore[reportMissingTypeStubs]
        except ImportError:  # pragma: no cover - the `postgres` extra installs it
            raise ImportError(
                'a PostgreSQL store opened with dsn= needs asyncpg: pip install "pydantic-ai-steps[postgres]"'
            ) from None
        assert self._dsn is not None
        try:
            return await asyncpg.create_pool(self._dsn, **owned_pool_options(self._pool_options))  # pyright: ignore[reportUnknownMemberType]
        except asyncpg.ClientConfigurationError as error:  # pyright: ignore[reportUnknownMemberType]
            raise StoreUrlError(f'the PostgreSQL URL given as dsn= is not usable: {error}') from None

    def _abandon(self) -> None:
        """Drop a pool opened in another (finished) event loop: its connections cannot be used from this one."""
        pool, self._owned, self._opening = self._owned, None, None
        self._parked.clear()
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.terminate()

    async def _take(self) -> tuple[AbstractAsyncContextManager[PostgresConnection], PostgresConnection, Any]:
        """One connection (a parked one first), within `acquire_timeout` seconds: its context, itself, its pool."""
        with self.reporting_unreachable():
            pool = self._caller_pool if self._caller_pool is not None else await self._pool()
        if self._parked:
            parked = await self._unpark()
            if parked is not None:
                return (*parked, pool)
        context = pool.acquire()
        self._waiting += 1
        try:
            async with asyncio.timeout(self.acquire_timeout):  # asyncpg and psycopg run on asyncio only
                with self.reporting_unreachable():  # inside: the timeout's own TimeoutError is PoolTimeoutError
                    conn = await context.__aenter__()
        except TimeoutError:
            raise PoolTimeoutError(self._timeout_message(pool)) from None
        except Exception as error:
            if type(error).__name__ == 'PoolTimeout':  # psycopg_pool's own wait limit
                raise PoolTimeoutError(self._timeout_message(pool)) from without_driver_frames(error)
            raise
        finally:
            self._waiting -= 1
        return context, conn, pool

    async def _unpark(self) -> tuple[AbstractAsyncContextManager[PostgresConnection], PostgresConnection] | None:
        """A parked connection that is still open; closed ones go back to the pool, which replaces them."""
        while self._parked:
            context, conn = self._parked.pop()
            if not _is_closed(conn):
                return context, conn
            with contextlib.suppress(Exception):
                await context.__aexit__(None, None, None)
        return None

    def _park(
        self, context: AbstractAsyncContextManager[PostgresConnection], conn: PostgresConnection, pool: Any
    ) -> bool:
        """Keep `conn` for the next operation instead of releasing it, if parking applies."""
        if self._park_limit == 0 or pool is not self._owned or self._waiting or _is_closed(conn):
            return False
        self._releases += 1
        if self._releases % _RECYCLE_EVERY == 0 or len(self._parked) >= self._park_limit:
            return False
        self._parked.append((context, conn))
        return True

    def _timeout_message(self, pool: Any) -> str:
        size = _pool_size(pool)
        of = (
            f' (a pool of {size} connection{"s" if size != 1 else ""}, all in use or not connected)'
            if size is not None
            else ''
        )
        return (
            f'waited {self.acquire_timeout:g} s for a PostgreSQL connection from the pool{of} and none became free; '
            'make the pool larger, hold its connections for less time, or pass a longer acquire_timeout= '
            '(or, if the server is down, bring it back: the pool reconnects by itself)'
        )

    async def read(self, body: Callable[[PostgresConnection], Awaitable[_R]]) -> _R:
        """`run` for a body that only reads: retried after any dead connection, and `StoreUnavailableError`
        when a retry reaches no server, since the attempt cut off changed nothing."""
        return await self.run(body, replay_safe=True, reads=True)

    async def run(
        self, body: Callable[[PostgresConnection], Awaitable[_R]], *, replay_safe: bool, reads: bool = False
    ) -> _R:
        """`body(conn)` on one connection, released (or parked) after; again on another (up to three
        times) if it was dead and that is safe."""
        retried, cut_off = 0, None
        while True:
            try:
                context, conn, pool = await self._take()
                try:
                    result = await body(conn)
                except BaseException as error:
                    await context.__aexit__(type(error), error, error.__traceback__)
                    raise
                if not self._park(context, conn, pool):
                    await context.__aexit__(None, None, None)
                return result
            except Exception as error:
                if cut_off is not None and isinstance(error, StoreUnavailableError):
                    # The retry reached no server, but the attempt before may have been applied: that
                    # attempt's error, which says so, is the one to raise.
                    raise cut_off  # noqa: B904 - the retry's error stays its __context__
                kind = disconnect_kind(error)
                # A restart leaves every pooled connection dead, so a replay-safe call may meet
                # several in a row; each failed one is discarded by the pool.
                if retried < _RETRIES and (kind == 'unsent' or (kind == 'ambiguous' and replay_safe)):
                    retried += 1
                    cut_off = error if kind == 'ambiguous' and not reads else cut_off
                    continue
                raise

    async def aclose(self) -> None:
        """Close the pool this object opened (a caller's pool is left alone). Idempotent."""
        pool, loop = self._owned, self._owned_loop
        self._owned, self._opening, self._owned_loop = None, None, None
        parked, self._parked = self._parked, []
        if pool is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - aclose is async
            running = None
        if running is loop:
            for context, _ in parked:  # the pool's close waits for every connection it handed out
                with contextlib.suppress(Exception):
                    await context.__aexit__(None, None, None)
            try:
                with anyio.fail_after(10):
                    await pool.close()
            except Exception:
                pool.terminate()
        else:
            with contextlib.suppress(Exception):
                pool.terminate()


async def _no_reset(connection: object) -> None:
    """The stores' statements leave no session state (no `SET`, no `LISTEN`, only transaction-scoped
    advisory locks), so a connection needs no reset query when it goes back to the store's own pool:
    asyncpg's default sends one on every release, a second round trip for every call."""
    del connection


def owned_pool_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`asyncpg.create_pool` keywords for a pool a store opens: `options`, and no reset on release
    (unless `options` chooses one, or this asyncpg, before 0.30, has no such option)."""
    import inspect

    import asyncpg  # pyright: ignore[reportMissingTypeStubs]

    chosen = dict(options)
    if 'reset' in inspect.signature(asyncpg.create_pool).parameters:  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        chosen.setdefault('reset', _no_reset)
    return chosen


def _without_password(text: str, dsn: str | None) -> str:
    """`text` (a driver's message) with the password `dsn` carries replaced by `***`."""
    if dsn is None:
        return text
    from urllib.parse import unquote, urlsplit

    with contextlib.suppress(ValueError):
        password = urlsplit(dsn).password
        if password:
            return text.replace(unquote(password), '***').replace(password, '***')
    return text


def _is_closed(conn: object) -> bool:
    """Whether a connection is gone; asyncpg hands back the holder of a connection that closed while checked out."""
    is_closed = getattr(conn, 'is_closed', None)
    if not callable(is_closed):
        return False
    try:
        return bool(is_closed())
    except Exception:  # asyncpg's proxy of a connection released back to its pool on close
        return True


def _pool_size(pool: Any) -> int | None:
    for name in ('get_max_size', 'get_size'):
        method = getattr(pool, name, None)
        if callable(method):
            with contextlib.suppress(Exception):
                return int(cast(Any, method)())
    inner = getattr(pool, 'inner', None)
    size = getattr(inner, 'max_size', None)
    return size if isinstance(size, int) else None


def _as_pool(pool: object, owner: str) -> PostgresPool:
    module = type(pool).__module__
    if module.startswith('psycopg_pool'):
        from ._psycopg import PsycopgPool

        return PsycopgPool(pool)
    if not callable(getattr(pool, 'acquire', None)):
        raise TypeError(
            f'{owner} needs a pool with acquire() (asyncpg.Pool) or a psycopg_pool.AsyncConnectionPool, '
            f'got {type(pool).__name__}'
        )
    return cast(PostgresPool, pool)
