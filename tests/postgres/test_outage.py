"""A PostgreSQL server that goes down under a store that has served calls, and comes back (on a
private server: `tests/servers/restart.py`): what each call raises, that no message, repr or
traceback local shows the password, and that the same store carries on once the server is back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord, StepEvent, StoreUnavailableError
from pydantic_ai_steps.store.backends.postgres import PoolTimeoutError
from pydantic_ai_steps.testing._support import snapshot, tool_cycle
from tests.postgres.test_failures import _blocked_commit_pid  # pyright: ignore[reportPrivateUsage]
from tests.servers.restart import PrivatePostgres
from tests.step_persistence.agents import scripted

pytestmark = [pytest.mark.server, pytest.mark.anyio]

PASSWORD = 'outage-Pw-7f3a'  # the private server trusts every connection, so any password is accepted


def _with_password(server: PrivatePostgres) -> str:
    return server.dsn.replace('steps@', f'steps:{PASSWORD}@')


def _password_shown(error: BaseException) -> list[str]:
    """Where `error`, or an error it was raised from or during, shows the password: its message, its
    repr, or a local of a frame of its traceback."""
    found: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if PASSWORD in str(current) or PASSWORD in repr(current):
            found.append(f'{type(current).__name__} message')
        tb = current.__traceback__
        while tb is not None:
            for name, value in tb.tb_frame.f_locals.items():
                if PASSWORD in repr(value):
                    found.append(f'{tb.tb_frame.f_code.co_name}: {name}')
            tb = tb.tb_next
        current = current.__cause__ or current.__context__
    return found


@pytest.fixture(params=['asyncpg-dsn', 'asyncpg-pool', 'psycopg-pool'])
async def outage_store(request: pytest.FixtureRequest, private_postgres: PrivatePostgres) -> AsyncIterator[Any]:
    dsn, pool = _with_password(private_postgres), None
    if request.param == 'asyncpg-dsn':
        store = PostgresStepStore(dsn=dsn, table='steps', acquire_timeout=2)
    elif request.param == 'asyncpg-pool':
        import asyncpg

        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        store = PostgresStepStore(pool, table='steps', acquire_timeout=2)
    else:
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        store = PostgresStepStore(pool, table='steps', acquire_timeout=1)
    try:
        yield store
    finally:
        await store.aclose()
        if pool is not None:
            await pool.close()


async def _until_it_works(call: Callable[[], Awaitable[object]], within: float = 60) -> None:
    """`call()` until it succeeds: a psycopg pool reconnects on its own schedule (growing back-off)."""
    deadline = time.monotonic() + within
    while True:
        try:
            await call()
            return
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_server_that_went_down_is_store_unavailable_and_the_store_recovers(
    outage_store: PostgresStepStore, private_postgres: PrivatePostgres
) -> None:
    store, media = outage_store, outage_store.media_store
    assert media is not None
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snapshot('r', tool_cycle(), idempotency_key='k1'))
    uri = await media.put(b'stored before' * 10)
    await anyio.to_thread.run_sync(private_postgres.stop)

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        'read': lambda: store.get_run(run_id='r'),
        'keyed write': lambda: store.register_run(RunRecord(run_id='r2')),
        'unkeyed write': lambda: store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0)),
        'media put': lambda: media.put(b'put while down'),
        'media get': lambda: media.get(uri),
    }
    for name, call in calls.items():
        with pytest.raises(StoreUnavailableError) as raised:
            await call()
        error = raised.value
        if not isinstance(error, PoolTimeoutError):  # asyncpg: the connect failed (psycopg's pool hides why)
            assert isinstance(error.__cause__, OSError), (name, error.__cause__)  # the driver's error
            assert f'127.0.0.1:{private_postgres.port}' in str(error) and 'steps:***@' in str(error), str(error)
        assert _password_shown(error) == [], (name, _password_shown(error))

    agent = Agent(scripted('done'), capabilities=[StepPersistence(store=store, run_id='during')])
    with pytest.raises(StoreUnavailableError):  # a run whose records cannot be written fails
        await agent.run('go')

    await anyio.to_thread.run_sync(private_postgres.start)
    await _until_it_works(lambda: store.get_run(run_id='r'))
    await store.register_run(RunRecord(run_id='r3'))
    await store.append_event(StepEvent(run_id='r3', kind='run_started', step_index=0))
    assert await media.get(uri) == b'stored before' * 10
    assert await media.get(await media.put(b'after')) == b'after'
    assert {run.run_id for run in await store.list_runs()} == {'r', 'r3'}
    assert PASSWORD not in repr(store)


async def test_a_keyed_write_cut_off_by_a_shutdown_raises_the_drivers_error(private_postgres: PrivatePostgres) -> None:
    import asyncpg

    store = PostgresStepStore(dsn=_with_password(private_postgres), table='steps', acquire_timeout=2)
    blocker = await asyncpg.connect(private_postgres.dsn)
    try:
        await store.register_run(RunRecord(run_id='r'))
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("SELECT 1 FROM steps_runs WHERE run_id = 'r' FOR UPDATE")
        keyed = snapshot('r', tool_cycle(), idempotency_key='s1')
        write = asyncio.ensure_future(store.save_snapshot(keyed))
        await _blocked_commit_pid(blocker, 'steps')
        await anyio.to_thread.run_sync(private_postgres.stop)  # fast: the blocked commit's backend is ended
        # Its retry reaches no server; the statement under way may have been applied, so the error
        # is the driver's lost connection, not "could not be reached".
        with pytest.raises(Exception) as raised:
            await write
        assert not isinstance(raised.value, StoreUnavailableError), raised.value
        assert type(raised.value).__name__ in ('AdminShutdownError', 'ConnectionDoesNotExistError'), raised.value
        assert _password_shown(raised.value) == []

        await anyio.to_thread.run_sync(private_postgres.start)
        await store.save_snapshot(keyed)  # the caller's retry: applied once whatever the first did
        assert len(await store.list_snapshots(run_id='r')) == 1
    finally:
        blocker.terminate()
        await store.aclose()
