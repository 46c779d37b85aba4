"""Failures against the real server: a backend killed mid-write, a server restart between two calls
(on a private server: `tests/servers/restart.py`), a pool of one connection under 20 concurrent runs,
an exhausted pool, ten processes migrating at once."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord, StepEvent
from pydantic_ai_steps.store.backends.postgres import PoolTimeoutError
from pydantic_ai_steps.testing._support import snapshot, tool_cycle
from tests.servers.restart import PrivatePostgres
from tests.step_persistence.agents import call, scripted

pytestmark = [pytest.mark.server, pytest.mark.anyio]


@pytest.fixture
async def asyncpg_pool(dsn: str, anyio_backend: str) -> AsyncIterator[Any]:
    import asyncpg

    del anyio_backend
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    yield pool
    await pool.close()


async def _blocked_commit_pid(conn: Any, prefix: str) -> int:
    """The backend whose commit (of the store under `prefix`) is waiting for the lock the test holds;
    other tests' commits, on the same server at the same time, may be waiting for locks of their own."""
    pattern = '%' + f'{prefix}_commit('.replace('_', '\\_') + '%'
    for _ in range(200):
        pid = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1", pattern
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.02)
    raise AssertionError('the commit never waited for the lock')


async def test_a_backend_killed_mid_write(asyncpg_pool: Any, dsn: str, prefix: str) -> None:
    import asyncpg

    store = PostgresStepStore(asyncpg_pool, table=prefix)
    await store.register_run(RunRecord(run_id='r'))
    blocker = await asyncpg.connect(dsn)
    admin = await asyncpg.connect(dsn)
    try:
        # A write that is not replay-safe (an event without a key): killed mid-statement, its error surfaces.
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(f"SELECT 1 FROM {prefix}_runs WHERE run_id = 'r' FOR UPDATE")
        unkeyed = StepEvent(run_id='r', kind='tool_call_started', step_index=1, tool_call_id='c1')
        write = asyncio.ensure_future(store.write_records(snapshot=snapshot('r', tool_cycle()), events=[unkeyed]))
        await admin.execute('SELECT pg_terminate_backend($1)', await _blocked_commit_pid(admin, prefix))
        with pytest.raises(Exception) as raised:
            await write
        assert type(raised.value).__name__ in ('AdminShutdownError', 'ConnectionDoesNotExistError'), raised.value
        await lock.rollback()
        # Nothing of it is visible, and the next call succeeds.
        assert await store.list_events(run_id='r') == []
        assert await store.latest_snapshot(run_id='r') is None
        keyed = [StepEvent(run_id='r', kind='tool_call_started', step_index=1, tool_call_id='c1', idempotency_key='e1')]
        await store.write_records(snapshot=snapshot('r', tool_cycle(), idempotency_key='s1'), events=keyed)

        # A keyed write killed mid-statement is replay-safe: it is retried on another connection.
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(f"SELECT 1 FROM {prefix}_runs WHERE run_id = 'r' FOR UPDATE")
        again = asyncio.ensure_future(
            store.write_records(snapshot=snapshot('r', tool_cycle(), idempotency_key='s1'), events=keyed)
        )
        await admin.execute('SELECT pg_terminate_backend($1)', await _blocked_commit_pid(admin, prefix))
        await asyncio.sleep(0.1)
        await lock.rollback()
        await again
        assert [event.idempotency_key for event in await store.list_events(run_id='r')] == ['e1']
        assert len(await store.list_snapshots(run_id='r')) == 1
    finally:
        await blocker.close()
        await admin.close()


@pytest.mark.parametrize('driver', ['asyncpg', 'psycopg'])
async def test_the_same_store_carries_on_across_a_server_restart(
    driver: str, private_postgres: PrivatePostgres
) -> None:
    from psycopg_pool import AsyncConnectionPool

    dsn, prefix = private_postgres.dsn, 'steps'  # the server is this test's own
    pool: Any = None
    if driver == 'psycopg':
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        store = PostgresStepStore(pool, table=prefix)
    else:
        store = PostgresStepStore(dsn=dsn, table=prefix)
    try:
        await store.register_run(RunRecord(run_id='before'))
        await store.save_snapshot(snapshot('before', tool_cycle(), idempotency_key='k1'))
        await anyio.to_thread.run_sync(private_postgres.restart)
        # Each pooled connection died with the server; the store's next calls, write and read, go on.
        await store.register_run(RunRecord(run_id='after'))
        await store.append_event(StepEvent(run_id='after', kind='run_started', step_index=0, idempotency_key='e'))
        assert await store.get_run(run_id='before') is not None
        latest = await store.latest_snapshot(run_id='before')
        assert latest is not None and len(latest.messages) == 3
        assert len(await store.list_events(run_id='after')) == 1
    finally:
        await store.aclose()
        if pool is not None:
            await pool.close()


async def test_a_pool_of_one_connection_runs_20_agents_at_once(dsn: str, prefix: str) -> None:
    import asyncpg

    image = BinaryContent(bytes(range(256)) * 300, media_type='image/png')  # to the media store, same pool
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        store = PostgresStepStore(pool, table=prefix, acquire_timeout=20)

        async def one(index: int) -> str:
            agent = Agent(
                scripted([call('work', 'c1')], [call('work', 'c2')], 'done'),
                capabilities=[StepPersistence(store=store, run_id=f'run-{index}')],
            )

            @agent.tool_plain
            async def work() -> str:  # pyright: ignore[reportUnusedFunction]
                await asyncio.sleep(0.001)
                return 'worked'

            return (await agent.run(['go', image])).output

        with anyio.fail_after(60):
            outputs = await asyncio.gather(*(one(index) for index in range(20)))
        assert outputs == ['done'] * 20
        runs = await store.list_runs()
        assert len(runs) == 20 and {run.status for run in runs} == {'completed'}
    finally:
        await pool.close()


async def test_an_exhausted_pool_is_a_clear_error_naming_the_wait(dsn: str, prefix: str) -> None:
    import asyncpg

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        store = PostgresStepStore(pool, table=prefix, acquire_timeout=0.3)
        async with pool.acquire():
            with pytest.raises(PoolTimeoutError, match=r'waited 0\.3 s .*a pool of 1 connection, all in use'):
                await store.register_run(RunRecord(run_id='r'))
        await store.register_run(RunRecord(run_id='r'))  # once the connection is back, it works
    finally:
        await pool.close()


def _open_and_write(dsn: str, prefix: str, index: int) -> None:
    async def write() -> None:
        store = PostgresStepStore(dsn=dsn, table=prefix, pool_options={'min_size': 1, 'max_size': 1})
        try:
            await store.register_run(RunRecord(run_id=f'process-{index}'))
        finally:
            await store.aclose()

    asyncio.run(write())


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='forks the test process')
async def test_ten_processes_opening_a_fresh_database_at_once_all_succeed(dsn: str, prefix: str) -> None:
    context = multiprocessing.get_context('fork')
    processes = [context.Process(target=_open_and_write, args=(dsn, prefix, index)) for index in range(10)]
    for process in processes:
        process.start()
    for process in processes:
        await anyio.to_thread.run_sync(process.join, 60)
    assert [process.exitcode for process in processes] == [0] * 10
    store = PostgresStepStore(dsn=dsn, table=prefix)
    try:
        assert len(await store.list_runs()) == 10
    finally:
        await store.aclose()
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval(f'SELECT count(*) FROM {prefix}_schema_version') == 1
    finally:
        await conn.close()
