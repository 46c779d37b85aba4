"""MongoStepStore when things go wrong on the real wire: connections closed mid-write (fail points),
error codes injected, the server killed and restarted between calls, two processes on one run.

All on a private SecantusDB server (`tests/servers/restart.py`), not the shared one: a fail point
acts on the whole server and a restart drops every client's connections."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pymongo import AsyncMongoClient
from pymongo.errors import AutoReconnect, OperationFailure

from pydantic_ai_steps.step_persistence import MongoStepStore, RunRecord, StepEvent, ToolEffectRecord
from pydantic_ai_steps.testing.step_store import dump, snapshot, tool_cycle

from ..servers.restart import PrivateMongoDB

pytestmark = pytest.mark.anyio
APP = 'steps-failure-victim'
Client = AsyncMongoClient[dict[str, Any]]


@pytest.fixture
def url(private_mongodb: PrivateMongoDB) -> str:
    """This module's server (`database_name` and every client here use it)."""
    return private_mongodb.url


@pytest.fixture
async def victim(url: str) -> AsyncIterator[Client]:
    """A client the fail points aim at (by its appName); driver retries off, so a failure shows."""
    client: Client = AsyncMongoClient(url, appname=APP, retryWrites=False, serverSelectionTimeoutMS=10_000)
    yield client
    await client.close()


@asynccontextmanager
async def fail_point(client: Client, mode: Any = None, **data: Any) -> AsyncIterator[None]:
    """Arm `failCommand` for the victim's commands (`data`), and always disarm it."""
    command = {'configureFailPoint': 'failCommand', 'mode': mode or {'times': 1}, 'data': {**data, 'appName': APP}}
    await client.admin.command(command)
    try:
        yield
    finally:
        await client.admin.command({'configureFailPoint': 'failCommand', 'mode': 'off'})


def two_steps(run_id: str) -> tuple[list[ModelMessage], list[ModelMessage]]:
    one = tool_cycle('c1', 'first')
    return one, [*one, *tool_cycle('c2', 'second')]


def boundary(run_id: str, history: list[ModelMessage], step: int) -> dict[str, Any]:
    """A boundary write as the capability makes it: the snapshot, the closed ledger entry, a keyed event."""
    return {
        'snapshot': snapshot(run_id, list(history), step_index=step, idempotency_key=f'{step}:complete'),
        'tool_effects': [ToolEffectRecord(tool_call_id=f'c{step}', tool_name='t', run_id=run_id, status='completed')],
        'events': [
            StepEvent(run_id=run_id, kind='tool_call_completed', step_index=step, idempotency_key=f'{step}:done')
        ],
    }


async def read_back(url: str, database: str, run_id: str) -> tuple[list[bytes], list[str | None], list[str]]:
    """What a fresh store sees: each snapshot's history, the event keys, the ledger's statuses."""
    async with MongoStepStore(db_url=url, database=database) as reader:
        snapshots = await reader.list_snapshots(run_id=run_id, include_interrupted=True)
        events = await reader.list_events(run_id=run_id)
        effects = await reader.list_tool_effects(run_id=run_id)
    return [dump(item.messages) for item in snapshots], [e.idempotency_key for e in events], [e.status for e in effects]


@pytest.mark.parametrize('command', ['bulkWrite', 'findAndModify'])
async def test_a_connection_closed_mid_write_leaves_nothing_and_the_retry_is_exact(
    victim: Client, url: str, database_name: str, command: str
) -> None:
    store = MongoStepStore(victim, database=database_name)
    await store.register_run(RunRecord(run_id='r'))
    one, two = two_steps('r')
    await store.write_records(**boundary('r', one, 1))
    async with fail_point(victim, failCommands=[command], closeConnection=True):
        with pytest.raises(AutoReconnect):
            await store.write_records(**boundary('r', two, 2))
    histories, keys, statuses = await read_back(url, database_name, 'r')
    assert (histories, keys, statuses) == ([dump(one)], ['1:done'], ['completed'])
    await store.write_records(**boundary('r', two, 2))  # what a durable operation's retry does
    histories, keys, statuses = await read_back(url, database_name, 'r')
    assert (histories, keys, statuses) == ([dump(one), dump(two)], ['1:done', '2:done'], ['completed', 'completed'])


async def test_with_retryable_writes_the_driver_resends_once_and_it_applies_once(url: str, database_name: str) -> None:
    async with AsyncMongoClient(url, appname=APP) as client:  # retryWrites is on by default
        store = MongoStepStore(client, database=database_name)
        await store.register_run(RunRecord(run_id='r'))
        one, two = two_steps('r')
        await store.write_records(**boundary('r', one, 1))
        async with fail_point(client, failCommands=['bulkWrite'], closeConnection=True):
            await store.write_records(**boundary('r', two, 2))
    histories, keys, _ = await read_back(url, database_name, 'r')
    assert histories == [dump(one), dump(two)] and keys == ['1:done', '2:done']


@pytest.mark.parametrize('skip', [0, 1], ids=['the log append', 'the snapshot insert'])
async def test_an_error_code_injected_on_an_insert_leaves_only_invisible_leftovers(
    victim: Client, url: str, database_name: str, skip: int
) -> None:
    """On the one-collection-at-a-time path the log entries and the snapshot are separate inserts."""
    store = MongoStepStore(victim, database=database_name)
    store.backend.writer.client_bulk = False  # type: ignore[attr-defined]
    await store.register_run(RunRecord(run_id='r'))
    one, two = two_steps('r')
    await store.write_records(**boundary('r', one, 1))
    mode = {'times': 1} if skip == 0 else {'skip': skip}
    async with fail_point(victim, mode, failCommands=['insert'], errorCode=2):
        with pytest.raises(OperationFailure, match='failCommand'):
            await store.write_records(**boundary('r', two, 2))
    async with AsyncMongoClient(url) as client:
        entries = await client[database_name].message_log.count_documents({'run_id': 'r'})
    assert entries == (3 if skip == 0 else 3 + 3)  # the second: log entries no snapshot names
    assert (await read_back(url, database_name, 'r'))[0] == [dump(one)]
    await store.write_records(**boundary('r', two, 2))
    histories, keys, statuses = await read_back(url, database_name, 'r')
    assert (histories, keys, statuses) == ([dump(one), dump(two)], ['1:done', '2:done'], ['completed', 'completed'])


async def test_an_error_code_on_the_bulk_write_writes_nothing(victim: Client, url: str, database_name: str) -> None:
    store = MongoStepStore(victim, database=database_name)
    await store.register_run(RunRecord(run_id='r'))
    one, two = two_steps('r')
    await store.write_records(**boundary('r', one, 1))
    async with fail_point(victim, failCommands=['bulkWrite'], errorCode=2):
        with pytest.raises(OperationFailure, match='failCommand'):
            await store.write_records(**boundary('r', two, 2))
    assert await read_back(url, database_name, 'r') == ([dump(one)], ['1:done'], ['completed'])


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL], ids=['shutdown', 'crash'])
async def test_the_server_restarted_between_calls(
    private_mongodb: PrivateMongoDB, url: str, database_name: str, sig: signal.Signals
) -> None:
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r'))
        one, two = two_steps('r')
        await store.write_records(**boundary('r', one, 1))
        await anyio.to_thread.run_sync(private_mongodb.restart, sig)
        await store.write_records(**boundary('r', two, 2))  # the client reconnects on its own
        assert await store.get_run(run_id='r') is not None
    assert await read_back(url, database_name, 'r') == (
        [dump(one), dump(two)],
        ['1:done', '2:done'],
        ['completed', 'completed'],
    )


@pytest.mark.slow
def test_two_processes_writing_one_run_never_mix_their_histories(url: str, database_name: str, tmp_path: Path) -> None:
    steps = 8
    location = f'{url}/{database_name}'

    async def register() -> None:
        async with MongoStepStore(db_url=url, database=database_name) as store:
            await store.register_run(RunRecord(run_id='shared'))

    anyio.run(register)
    child = Path(__file__).with_name('same_run_child.py')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    go = tmp_path / 'go'
    processes = {
        label: subprocess.Popen(
            [
                sys.executable,
                str(child),
                location,
                'shared',
                label,
                str(steps),
                str(tmp_path / label),
                str(go),
            ],
            env=env,
        )
        for label in ('alpha', 'beta')
    }
    deadline = time.monotonic() + 60
    while not all((tmp_path / f'{label}.ready').exists() for label in processes):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes.values()), (
            'a child did not start'
        )
        time.sleep(0.01)
    go.touch()
    for process in processes.values():
        assert process.wait(timeout=300) == 0
    written = {
        json.dumps(json.loads(line), separators=(',', ':')).encode()
        for label in processes
        for line in (tmp_path / label).read_text().splitlines()
    }
    assert len(written) == 2 * steps

    async def check() -> None:
        async with MongoStepStore(db_url=url, database=database_name) as store:
            saved = await store.list_snapshots(run_id='shared')
            events = await store.list_events(run_id='shared')
        assert len(saved) == 2 * steps and len({item.seq for item in saved}) == 2 * steps
        for item in saved:
            text = ModelMessagesTypeAdapter.dump_json(item.messages)
            assert json.dumps(json.loads(text), separators=(',', ':')).encode() in written
        writers = [item.messages[-1].parts[0].tool_call_id.split('-')[0] for item in saved]  # type: ignore[union-attr]
        switches = sum(a != b for a, b in itertools.pairwise(writers))
        assert switches >= 2, f'the two writers did not interleave: {writers}'
        keys = [event.idempotency_key for event in events]
        assert sorted(keys, key=str) == sorted(f'{label}:{step}' for label in processes for step in range(1, steps + 1))

    anyio.run(check)
