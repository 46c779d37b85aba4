"""The pool a store opens from a DSN: a connection stays parked between operations, and only then."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord, StepEvent
from pydantic_ai_steps.store.backends.postgres import PostgresConnection
from tests.step_persistence.agents import call, scripted

pytestmark = [pytest.mark.server, pytest.mark.anyio]


def _connections(store: PostgresStepStore) -> Any:
    return store.backend.connections  # pyright: ignore[reportAttributeAccessIssue]


async def _backend_pid(store: PostgresStepStore) -> int:
    async def read(conn: PostgresConnection) -> int:
        return int(await conn.fetchval('SELECT pg_backend_pid()'))  # pyright: ignore[reportArgumentType]

    return await _connections(store).run(read, replay_safe=True)


async def test_one_connection_serves_successive_calls_without_going_back_to_the_pool(dsn: str, prefix: str) -> None:
    store = PostgresStepStore(dsn=dsn, table=prefix)
    try:
        await store.register_run(RunRecord(run_id='r'))
        first = await _backend_pid(store)
        for index in range(5):
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=index))
        assert await _backend_pid(store) == first
        pool = _connections(store)._owned  # pyright: ignore[reportPrivateUsage]
        assert (pool.get_size(), pool.get_idle_size()) == (1, 0)  # parked: checked out between calls
        assert len(await store.list_events(run_id='r')) == 5
    finally:
        with anyio.fail_after(10):  # the pool's close waits for every connection it handed out
            await store.aclose()


async def test_a_pool_of_one_connection_from_a_dsn_runs_20_agents_at_once(dsn: str, prefix: str) -> None:
    store = PostgresStepStore(dsn=dsn, table=prefix, pool_options={'min_size': 1, 'max_size': 1}, acquire_timeout=20)
    try:

        async def one(index: int) -> str:
            agent = Agent(
                scripted([call('work', 'c1')], [call('work', 'c2')], 'done'),
                capabilities=[StepPersistence(store=store, run_id=f'run-{index}')],
            )

            @agent.tool_plain
            async def work() -> str:  # pyright: ignore[reportUnusedFunction]
                await asyncio.sleep(0.001)
                return 'worked'

            return (await agent.run('go')).output

        with anyio.fail_after(60):
            outputs = await asyncio.gather(*(one(index) for index in range(20)))
        assert outputs == ['done'] * 20
        assert {run.status for run in await store.list_runs()} == {'completed'}
    finally:
        await store.aclose()


async def test_a_parked_connection_the_server_ended_is_replaced_before_anything_is_sent(dsn: str, prefix: str) -> None:
    import asyncpg

    store = PostgresStepStore(dsn=dsn, table=prefix)
    admin = await asyncpg.connect(dsn)
    try:
        await store.register_run(RunRecord(run_id='r'))
        parked = await _backend_pid(store)
        await admin.execute('SELECT pg_terminate_backend($1)', parked)
        await asyncio.sleep(0.2)  # the client sees the connection close
        # An unkeyed event is not replay-safe: it succeeds only because it goes to a live connection.
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        assert len(await store.list_events(run_id='r')) == 1
        assert await _backend_pid(store) != parked
    finally:
        await admin.close()
        await store.aclose()


async def test_setup_or_reset_in_pool_options_turn_parking_off(dsn: str, prefix: str) -> None:
    acquired: list[int] = []

    async def setup(conn: Any) -> None:
        acquired.append(conn.get_server_pid())

    store = PostgresStepStore(dsn=dsn, table=prefix, pool_options={'setup': setup})
    try:
        await store.register_run(RunRecord(run_id='r'))
        before = len(acquired)
        for index in range(3):
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=index))
        assert len(acquired) == before + 3  # asyncpg's setup ran on every acquire
    finally:
        await store.aclose()


async def test_a_store_opened_in_one_event_loop_works_in_the_next(dsn: str, prefix: str) -> None:
    store = PostgresStepStore(dsn=dsn, table=prefix)
    await store.register_run(RunRecord(run_id='r'))

    def in_another_loop() -> int:
        async def read() -> int:
            return len(await store.list_runs())

        return asyncio.run(read())

    assert await anyio.to_thread.run_sync(in_another_loop) == 1
    assert len(await store.list_runs()) == 1
    await store.aclose()
