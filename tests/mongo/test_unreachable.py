"""A MongoDB server that cannot be reached is `StoreUnavailableError`, as a PostgreSQL one is: from
the step store and the media store, for a client they opened or a caller's, naming the server
without its password; a connection lost mid-command stays pymongo's error (`test_failures`)."""

from __future__ import annotations

import signal
import socket
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import AutoReconnect, ConfigurationError, ServerSelectionTimeoutError

from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import MongoStepStore, RunRecord, StoreUnavailableError

from ..servers.restart import PrivateMongoDB

pytestmark = pytest.mark.anyio
Client = AsyncMongoClient[dict[str, Any]]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


@pytest.fixture
def down_url() -> str:
    return f'mongodb://app:s3cret@127.0.0.1:{closed_port()}/?serverSelectionTimeoutMS=300'


def check(raised: pytest.ExceptionInfo[StoreUnavailableError], cause: type[BaseException]) -> str:
    """The error's message, after checking it keeps pymongo's error and shows no password."""
    message = str(raised.value)
    assert isinstance(raised.value, ConnectionError) and isinstance(raised.value.__cause__, cause)
    assert 's3cret' not in message and 'Topology' not in message and '\n' not in message
    return message


async def test_a_step_store_whose_server_is_down_is_store_unavailable(down_url: str) -> None:
    async with MongoStepStore(db_url=down_url, database='agents') as store:
        with pytest.raises(StoreUnavailableError) as read:
            await store.list_runs()
        with pytest.raises(StoreUnavailableError) as written:
            await store.register_run(RunRecord(run_id='r'))
        with pytest.raises(StoreUnavailableError) as swept:
            async for _ in store.backend.texts_mentioning('media://'):  # an async generator
                pass
    for raised in (read, written, swept):
        message = check(raised, ServerSelectionTimeoutError)
        assert message.startswith(f"the MongoDB server named by db_url='{down_url.replace('s3cret', '***')}' ")
        assert 'could not be reached: 127.0.0.1:' in message and 'Connect call failed' in message


async def test_a_media_store_whose_server_is_down_is_store_unavailable(down_url: str) -> None:
    async with MongoMediaStore(db_url=down_url, database='app') as media:
        with pytest.raises(StoreUnavailableError) as put:
            await media.put(b'bytes')
        with pytest.raises(StoreUnavailableError) as listed:
            async for _ in media.list_blobs():
                pass
    for raised in (put, listed):
        assert 'could not be reached: 127.0.0.1:' in check(raised, ServerSelectionTimeoutError)


async def test_a_callers_client_is_named_by_its_hosts() -> None:
    port = closed_port()
    client: Client = AsyncMongoClient(f'mongodb://app:s3cret@127.0.0.1:{port}', serverSelectionTimeoutMS=300)
    try:
        with pytest.raises(StoreUnavailableError) as raised:
            await MongoStepStore(client, database='agents').list_runs()
    finally:
        await client.close()
    assert check(raised, ServerSelectionTimeoutError).startswith(f'the MongoDB server of client= (127.0.0.1:{port}) ')


async def test_an_srv_host_with_no_dns_record_is_store_unavailable() -> None:
    url = 'mongodb+srv://app:s3cret@no-such-cluster.invalid/agents?connectTimeoutMS=2000'
    async with MongoStepStore(db_url=url, database='agents') as store:
        with pytest.raises(StoreUnavailableError) as raised:
            await store.list_runs()
    assert 'no-such-cluster.invalid' in check(raised, ConfigurationError)


async def test_a_server_gone_since_its_last_answer_refuses_and_is_store_unavailable(
    private_mongodb: PrivateMongoDB,
) -> None:
    """The server answered, then stopped: the next call opens a new connection (the pooled one has been
    idle too long), which is refused before anything is sent; the monitor polls too rarely to have noticed."""
    options = 'serverMonitoringMode=poll&heartbeatFrequencyMS=60000&maxIdleTimeMS=1&serverSelectionTimeoutMS=300'
    url = f'{private_mongodb.url}/?{options}'
    async with MongoStepStore(db_url=url, database='agents') as store:
        await store.list_runs()
        private_mongodb.stop(signal.SIGKILL)
        try:
            with pytest.raises(StoreUnavailableError) as raised:
                await store.list_runs()
        finally:
            private_mongodb.start()
    assert isinstance(raised.value.__cause__, AutoReconnect)
    assert isinstance(raised.value.__cause__.__cause__, ConnectionRefusedError)
