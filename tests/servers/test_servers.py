"""The test servers `scripts/services.sh` starts really work: one small round trip per server,
plus the failure hooks later tests rely on (a MongoDB fail point, a restart on the same data), on
private servers started the same way (`restart.py`): the shared ones serve other tests meanwhile.

Without the servers' variables these skip (and fail under CI=true, see `tests.conftest.require_env`).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from pymongo import AsyncMongoClient
from pymongo.errors import AutoReconnect, DuplicateKeyError
from temporalio import activity, workflow
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.conftest import require_env

from .restart import PrivateMongoDB, PrivatePostgres

pytestmark = [pytest.mark.anyio, pytest.mark.server]


def _name(prefix: str) -> str:
    return f'{prefix}_{uuid.uuid4().hex[:12]}'


# ---------------------------------------------------------------- PostgreSQL


def _postgres_dsn() -> str:
    return require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']


async def test_postgres_asyncpg_and_psycopg_round_trip_with_durable_settings() -> None:
    dsn = _postgres_dsn()
    table = _name('probe')
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval('SHOW fsync') == 'on'
        assert await conn.fetchval('SHOW synchronous_commit') == 'on'
        await conn.execute(f'CREATE TABLE {table} (id integer PRIMARY KEY, body text NOT NULL)')
        await conn.execute(f'INSERT INTO {table} VALUES ($1, $2)', 1, 'from asyncpg')
        assert await conn.fetchval(f'SELECT body FROM {table} WHERE id = $1', 1) == 'from asyncpg'
    finally:
        await conn.close()

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        cur = await aconn.execute('SHOW fsync')
        assert await cur.fetchone() == ('on',)
        cur = await aconn.execute('SHOW synchronous_commit')
        assert await cur.fetchone() == ('on',)
        await aconn.execute(f'INSERT INTO {table} VALUES (%s, %s)', (2, 'from psycopg'))

    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool, pool.connection() as pconn:
        cur = await pconn.execute(f'SELECT id, body FROM {table} ORDER BY id')
        assert await cur.fetchall() == [(1, 'from asyncpg'), (2, 'from psycopg')]
        await pconn.execute(f'DROP TABLE {table}')


async def test_postgres_restart_keeps_committed_rows(private_postgres: PrivatePostgres) -> None:
    dsn = private_postgres.dsn
    table = _name('restart')
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE TABLE {table} (id integer PRIMARY KEY)')
        await conn.execute(f'INSERT INTO {table} VALUES (1), (2)')
    finally:
        await conn.close()

    private_postgres.restart()

    conn = await asyncpg.connect(dsn)
    try:
        assert [r['id'] for r in await conn.fetch(f'SELECT id FROM {table} ORDER BY id')] == [1, 2]
        await conn.execute(f'DROP TABLE {table}')
    finally:
        await conn.close()


# ---------------------------------------------------------------- SecantusDB (MongoDB wire protocol)


def _mongodb_url() -> str:
    return require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL']


async def test_mongodb_insert_find_and_unique_index() -> None:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(_mongodb_url(), serverSelectionTimeoutMS=5000)
    try:
        coll = client[_name('probe')]['items']
        await coll.create_index('key', unique=True)
        await coll.insert_one({'key': 'a', 'n': 1})
        found = await coll.find_one({'key': 'a'}, {'_id': 0})
        assert found == {'key': 'a', 'n': 1}
        with pytest.raises(DuplicateKeyError) as raised:
            await coll.insert_one({'key': 'a', 'n': 2})
        assert raised.value.code == 11000
        assert await coll.count_documents({}) == 1
        await client.drop_database(coll.database.name)
    finally:
        await client.close()


async def test_mongodb_fail_point_closes_the_connection_once(private_mongodb: PrivateMongoDB) -> None:
    # retryWrites=False: with retries on, the driver would quietly resend the failed insert.
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        private_mongodb.url, serverSelectionTimeoutMS=5000, retryWrites=False
    )
    try:
        coll = client[_name('failpoint')]['items']
        await coll.insert_one({'n': 0})  # create the collection before the fail point is armed
        await client.admin.command(
            {
                'configureFailPoint': 'failCommand',
                'mode': {'times': 1},
                'data': {'failCommands': ['insert'], 'closeConnection': True},
            }
        )
        try:
            with pytest.raises(AutoReconnect):  # a ConnectionFailure: the server hung up
                await coll.insert_one({'n': 1})
            await coll.insert_one({'n': 2})
        finally:
            await client.admin.command({'configureFailPoint': 'failCommand', 'mode': 'off'})
        assert sorted([d['n'] async for d in coll.find({}, {'_id': 0})]) == [0, 2]
        await client.drop_database(coll.database.name)
    finally:
        await client.close()


async def test_mongodb_restart_keeps_written_documents(private_mongodb: PrivateMongoDB) -> None:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(private_mongodb.url, serverSelectionTimeoutMS=10000)
    try:
        coll = client[_name('restart')]['items']
        await coll.insert_many([{'n': 1}, {'n': 2}])

        private_mongodb.restart()

        # The same client reconnects on its own.
        assert await coll.count_documents({}) == 2
        await client.drop_database(coll.database.name)
    finally:
        await client.close()


# ---------------------------------------------------------------- Temporal


@activity.defn
async def greet(name: str) -> str:
    return f'hello {name}'


@workflow.defn(sandboxed=False)
class GreetWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=30))


async def test_temporal_default_namespace_and_a_workflow_with_an_in_process_worker() -> None:
    env = require_env('TEST_TEMPORAL_ADDRESS')
    client = await Client.connect(env['TEST_TEMPORAL_ADDRESS'], namespace='default')
    described = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace='default'))
    assert described.namespace_info.name == 'default'

    task_queue = _name('steps-tests')
    async with Worker(client, task_queue=task_queue, workflows=[GreetWorkflow], activities=[greet]):
        result = await client.execute_workflow(
            GreetWorkflow.run,
            'steps',
            id=_name('greet'),
            task_queue=task_queue,
            execution_timeout=timedelta(seconds=60),
        )
    assert result == 'hello steps'
