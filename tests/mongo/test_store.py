"""MongoStepStore against the test server: what it creates, how many round trips a write takes,
the 16 MiB limit, metadata keys, its client, and the layouts it reads that it did not write."""

from __future__ import annotations

import copy
import pickle
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from bson import ObjectId
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
from pymongo import AsyncMongoClient

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps._errors import InvalidRecordError, RecordTooLargeError
from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    MongoStepStore,
    RunNotFoundError,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    open_step_store,
    run_record_for,
)
from pydantic_ai_steps.store.backends.mongo import MAX_TEXT_BYTES
from pydantic_ai_steps.store.backends.mongo._layout import INDEXES, LAYOUT_VERSION
from pydantic_ai_steps.testing.step_store import T0, dump, snapshot, tool_cycle

from ..step_persistence.agents import call, scripted
from .conftest import Commands

pytestmark = pytest.mark.anyio
RUN_LOOKUPS = {'agent_name_1_started_at_1', 'pydantic_ai_run_id_1', 'status_1_started_at_1', 'status_1_ended_at_1'}
"""The `runs` indexes for `run_record_for` and the `agent_name` / `status` filters (as SQLite and PostgreSQL have)."""
Client = AsyncMongoClient[dict[str, Any]]
WRITES = {'insert', 'update', 'delete', 'findAndModify', 'bulkWrite', 'createIndexes'}


@pytest.fixture
async def listened(url: str) -> AsyncIterator[tuple[Client, Commands]]:
    """A caller-owned client whose every command is counted."""
    commands = Commands()
    client: Client = AsyncMongoClient(url, event_listeners=[commands], serverSelectionTimeoutMS=10_000)
    yield client, commands
    await client.close()


def cycle(store: MongoStepStore, history: list[ModelMessage], step: int) -> list[dict[str, Any]]:
    """The two writes a tool cycle makes through the batching writer, as `write_records` arguments."""
    run_id, call_id = 'r', f'call-{step}'
    events = [
        StepEvent(run_id=run_id, kind=kind, step_index=step, tool_call_id=call_id, idempotency_key=f'{step}:{kind}')
        for kind in ('model_request_started', 'model_request_completed', 'tool_call_started')
    ]
    started = ToolEffectRecord(tool_call_id=call_id, tool_name='fetch', run_id=run_id, status='started')
    closed = ToolEffectRecord(tool_call_id=call_id, tool_name='fetch', run_id=run_id, status='completed')
    done = StepEvent(run_id=run_id, kind='tool_call_completed', step_index=step, idempotency_key=f'{step}:done')
    return [
        {'tool_effects': [started], 'events': events},
        {
            'snapshot': ContinuableSnapshot(run_id=run_id, step_index=step, messages=list(history)),
            'tool_effects': [closed],
            'events': [done],
        },
    ]


def grow(history: list[ModelMessage], step: int) -> list[ModelMessage]:
    return [
        *history,
        ModelResponse(parts=[ToolCallPart('fetch', {'page': step}, tool_call_id=f'call-{step}')], timestamp=T0),
        ModelRequest(parts=[UserPromptPart(f'page {step}: ' + 'text ' * 100, timestamp=T0)], timestamp=T0),
    ]


# --- what the first write creates ------------------------------------------------------------------


async def test_reads_create_nothing_and_the_first_write_creates_the_indexes(url: str, database_name: str) -> None:
    async with MongoStepStore(db_url=url, database=database_name) as store:
        assert await store.get_run(run_id='nobody') is None
        assert await store.list_runs() == []
        assert await store.list_events(run_id='nobody') == []
        assert await store.latest_snapshot(run_id='nobody', include_interrupted=True) is None
        assert await store.list_unresolved_tool_effects(run_id='nobody') == []
        assert not (await store.probe()).exists
        async with AsyncMongoClient(url) as client:
            assert await client[database_name].list_collection_names() == []
            await store.register_run(RunRecord(run_id='r', conversation_id='c', started_at=T0))
            database = client[database_name]
            indexes = {
                name: set(await database[name].index_information()) for name in await database.list_collection_names()
            }
    assert indexes['runs'] >= {'_id_', 'conversation_id_1', 'parent_run_id_1', 'started_at_1', *RUN_LOOKUPS}
    assert indexes['events'] >= {'run_id_1_seq_1', 'run_id_1_idempotency_key_1'}
    assert indexes['snapshots'] >= {'run_id_1_seq_-1', 'run_id_1_state_1_seq_-1', 'run_id_1_idempotency_key_1'}
    assert indexes['tool_effects'] >= {'run_id_1_tool_call_id_1', 'run_id_1_status_1'}
    assert indexes['message_log'] >= {'run_id_1_log_index_1'}
    assert {'runs', 'counters'} <= set(indexes)


async def test_the_first_write_to_a_layout_1_database_adds_the_run_lookup_indexes(url: str, database_name: str) -> None:
    """A database set up before the `runs` lookups were indexed gets them on its first write, as a fresh one does."""
    async with AsyncMongoClient(url) as client:
        database = client[database_name]
        for name, models in INDEXES.items():
            kept = [model for model in models if name != 'runs' or model.document['name'] not in RUN_LOOKUPS]
            await database[name].create_indexes(kept)
        await database['counters'].insert_one({'_id': 'layout', 'version': 1})
        async with MongoStepStore(client, database=database_name) as store:
            await store.register_run(RunRecord(run_id='r', pydantic_ai_run_id='pai-r', started_at=T0))
            assert (await run_record_for(store, 'pai-r')) is not None
        assert set(await database['runs'].index_information()) >= RUN_LOOKUPS
        assert (await database['counters'].find_one({'_id': 'layout'}) or {}).get('version') == LAYOUT_VERSION


async def test_documents_as_the_seed_lays_them_out(listened: tuple[Client, Commands], database_name: str) -> None:
    client, _ = listened
    store = MongoStepStore(client, database=database_name)
    record = RunRecord(run_id='r', metadata={'team': 'docs'}, started_at=T0)
    await store.register_run(record)
    history = tool_cycle()
    await store.save_snapshot(snapshot('r', history))
    database = client[database_name]
    run = await database.runs.find_one({'_id': 'r'})
    assert run is not None and run['run_id'] == 'r' and run['metadata'] == {'team': 'docs'}  # a nested document
    assert run['started_at'] == T0.isoformat()  # ISO text: a BSON date would drop the microseconds
    counter = await database.counters.find_one({'_id': 'run:r'})
    assert counter is not None and (counter['log'], counter['snapshots']) == (3, 1)
    log = await database.message_log.find({'run_id': 'r'}, sort=[('log_index', 1)]).to_list()
    assert [type(entry['message']) for entry in log] == [str, str, str]  # the text verbatim, never a sub-document
    assert [entry['position'] for entry in log] == [0, 1, 2]
    saved = await database.snapshots.find_one({'run_id': 'r'})
    assert saved is not None and (saved['message_count'], saved['log_size'], saved['seq']) == (3, 3, 1)
    assert 'messages' not in saved  # the history is in the log, each message once


# --- round trips -------------------------------------------------------------------------------------


async def test_a_write_takes_two_round_trips_at_step_5_as_at_step_60(
    listened: tuple[Client, Commands], database_name: str
) -> None:
    """`bench/mongo_round_trips.py` counts cycles 5, 100 and 399 of a 400-step run (the test server is slow)."""
    client, commands = listened
    store = MongoStepStore(client, database=database_name)
    await store.write_records(run=RunRecord(run_id='r', started_at=T0))
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go', timestamp=T0)], timestamp=T0)]
    counts: dict[int, list[list[str]]] = {}
    for step in range(1, 61):
        history = grow(history, step)
        for batch in cycle(store, history, step):
            commands.clear()
            await store.write_records(**batch)
            if step in (5, 60):
                counts.setdefault(step, []).append(list(commands.names))
    expected = [['findAndModify', 'bulkWrite'], ['findAndModify', 'bulkWrite']]
    assert counts == {5: expected, 60: expected}
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)


async def test_registration_is_one_round_trip_once_the_database_is_set_up(
    listened: tuple[Client, Commands], database_name: str
) -> None:
    client, commands = listened
    await MongoStepStore(client, database=database_name).register_run(RunRecord(run_id='first'))
    store = MongoStepStore(client, database=database_name)  # a new store: checks the layout once
    commands.clear()
    opening = StepEvent(run_id='r', kind='run_started', step_index=0, idempotency_key='0:run_started')
    await store.write_records(run=RunRecord(run_id='r'), events=[opening])
    assert commands.names == ['find', 'bulkWrite']
    commands.clear()
    await store.write_records(
        run=RunRecord(run_id='r2'), events=[opening.__class__(**{**vars(opening), 'run_id': 'r2'})]
    )
    assert commands.names == ['bulkWrite']


async def test_every_write_of_a_real_agent_run_takes_at_most_three_round_trips(
    listened: tuple[Client, Commands], database_name: str
) -> None:
    client, commands = listened
    store = MongoStepStore(client, database=database_name)
    await store.register_run(RunRecord(run_id='warm-up'))  # the layout check of a new store object
    per_write: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def write_records(self, **records: Any) -> None:
            commands.clear()
            await store.write_records(**records)
            per_write.append(sum(name in WRITES or name == 'find' for name in commands.names))

    steps = [[call('lookup', f'c{index}', q=str(index))] for index in range(8)]
    agent = Agent(scripted(*steps, 'done'), capabilities=[StepPersistence(store=Counting(), run_id='agent')])  # type: ignore[arg-type]

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'found {q}'

    await agent.run('go')
    assert per_write and max(per_write) <= 3, per_write
    assert per_write[0] == 1  # the registration with its opening event
    assert all(count == 2 for count in per_write[1:]), per_write


async def test_before_mongodb_8_the_writes_go_one_collection_at_a_time(
    listened: tuple[Client, Commands], database_name: str
) -> None:
    """The fallback for servers without client-level bulkWrite, forced here (the test server is 8.2)."""
    client, commands = listened
    store = MongoStepStore(client, database=database_name)
    store.backend.writer.client_bulk = False  # type: ignore[attr-defined]
    await store.write_records(
        run=RunRecord(run_id='r'), events=[StepEvent(run_id='r', kind='run_started', step_index=0)]
    )
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go', timestamp=T0)], timestamp=T0)]
    for step in range(1, 4):
        history = grow(history, step)
        started, boundary = cycle(store, history, step)
        commands.clear()
        await store.write_records(**started)
        assert commands.names == ['findAndModify', 'update', 'update', 'update']  # effects, events, guard
        commands.clear()
        await store.write_records(**boundary)
        assert commands.names == ['findAndModify', 'insert', 'insert', 'update', 'update', 'update']
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history)
    assert [event.kind for event in await store.list_events(run_id='r')][:2] == ['run_started', 'model_request_started']
    assert await store.delete_run('r') == ['r'] and await store.get_run(run_id='r') is None


# --- the 16 MiB document limit ------------------------------------------------------------------------


async def test_a_message_just_under_the_limit_is_one_document(url: str, database_name: str) -> None:
    async with MongoStepStore(db_url=url, database=database_name, media_store=None) as store:
        await store.register_run(RunRecord(run_id='r'))
        text = 'x' * (MAX_TEXT_BYTES - 2048)  # its JSON, with the part around it, is just under the limit
        history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(text, timestamp=T0)], timestamp=T0)]
        await store.save_snapshot(snapshot('r', history))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(history)


async def test_a_message_just_over_the_limit_goes_to_the_media_store_below_the_threshold(
    url: str, database_name: str
) -> None:
    async with MongoStepStore(db_url=url, database=database_name, media_threshold_bytes=4 << 20) as store:
        await store.register_run(RunRecord(run_id='r'))
        # 5 parts of 3.4 MB: each below the 4 MiB threshold, together a little over 16 MiB.
        parts = [UserPromptPart(f'{index:03d}' + 'y' * 3_400_000, timestamp=T0) for index in range(5)]
        history: list[ModelMessage] = [ModelRequest(parts=parts, timestamp=T0)]
        await store.save_snapshot(snapshot('r', history))
        assert isinstance(store.media_store, MongoMediaStore)
        assert len([blob async for blob in store.media_store.list_blobs()]) > 0
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(history)


async def test_too_large_with_nowhere_to_move_it_names_the_record_before_sending(
    listened: tuple[Client, Commands], database_name: str
) -> None:
    client, commands = listened
    store = MongoStepStore(client, database=database_name, media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    parts = [UserPromptPart('z' * 56_000, timestamp=T0) for _ in range(310)]
    commands.clear()
    with pytest.raises(RecordTooLargeError, match=r"message 0 of the snapshot of run 'r' at step 1 is \d+ bytes"):
        await store.save_snapshot(snapshot('r', [ModelRequest(parts=parts, timestamp=T0)]))
    huge = {'notes': 'n' * (17 << 20)}
    with pytest.raises(RecordTooLargeError, match=r"run record 'big' is \d+ bytes as a BSON document.*16777216"):
        await store.register_run(RunRecord(run_id='big', metadata=huge))
    with pytest.raises(RecordTooLargeError, match=r"tool_call_failed event of run 'r' is \d+ bytes"):
        await store.append_event(StepEvent(run_id='r', kind='tool_call_failed', step_index=1, error='e' * (17 << 20)))
    assert not WRITES & set(commands.names), commands.names  # refused before anything was sent
    assert await store.get_run(run_id='big') is None
    assert await store.latest_snapshot(run_id='r') is None and await store.list_events(run_id='r') == []


# --- metadata keys -------------------------------------------------------------------------------------


async def test_metadata_keys_with_dots_and_dollars_round_trip_and_filter(url: str, database_name: str) -> None:
    async with MongoStepStore(db_url=url, database=database_name) as store:
        metadata = {'a.b': 'dotted', '$c': 'dollar', 'plain': 'p'}
        await store.register_run(RunRecord(run_id='r', metadata=metadata, run_metadata={'x.y': 1, 'n': 2}))
        await store.register_run(RunRecord(run_id='other', metadata={'a.b': 'else', 'plain': 'p'}))
        record = await store.get_run(run_id='r')
        assert record is not None and record.metadata == metadata and record.run_metadata == {'x.y': 1, 'n': 2}
        assert [r.run_id for r in await store.list_runs(metadata={'a.b': 'dotted'})] == ['r']
        assert [r.run_id for r in await store.list_runs(metadata={'plain': 'p'}, limit=1)] == ['r']
        assert [r.run_id for r in await store.list_runs(run_metadata={'x.y': 1.0, 'n': 2})] == ['r']
        event = StepEvent(run_id='r', kind='run_started', step_index=0, metadata={'k.1': 'v', '$k': 'w'})
        await store.append_event(event)
        assert (await store.list_events(run_id='r'))[0].metadata == {'k.1': 'v', '$k': 'w'}


async def test_a_nul_byte_in_a_metadata_key_is_a_clear_error(url: str, database_name: str) -> None:
    async with MongoStepStore(db_url=url, database=database_name) as store:
        with pytest.raises(InvalidRecordError, match=r"run record 'r' has the key 'a\\x00b'.*NUL byte"):
            await store.register_run(RunRecord(run_id='r', metadata={'a\x00b': 'v'}))
        assert await store.get_run(run_id='r') is None
        await store.register_run(RunRecord(run_id='r'))
        with pytest.raises(InvalidRecordError, match='NUL byte'):
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0, metadata={'\x00': 'v'}))
        assert await store.list_events(run_id='r') == []


# --- the client -------------------------------------------------------------------------------------------


def test_exactly_one_of_client_and_db_url(url: str) -> None:
    with pytest.raises(ValueError, match=r'exactly one of client= .* or db_url='):
        MongoStepStore(database='d')
    with pytest.raises(ValueError, match='exactly one of'):
        MongoStepStore(AsyncMongoClient(url, connect=False), db_url=url, database='d')
    with pytest.raises(ValueError, match="invalid MongoDB database name 'a/b'"):
        MongoStepStore(db_url=url, database='a/b')
    with pytest.raises(ValueError, match='database='):
        MongoStepStore(db_url=url, database='')
    with pytest.raises(TypeError, match='AsyncMongoClient'):
        MongoStepStore('mongodb://x', database='d')  # type: ignore[arg-type]


def test_no_repr_error_or_pickle_shows_a_password() -> None:
    store = MongoStepStore(db_url='mongodb://alice:s3cret@db.example:27017/x?authSource=admin', database='agents')
    assert 's3cret' not in repr(store) and 'alice:***@db.example' in repr(store)
    assert 's3cret' not in repr(store.media_store)
    for attempt in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match='cannot be pickled or copied'):
            attempt(store)
    for bad in ('mongodb://alice:s3cret@db.example:port/x', 'mongodb://alice:s3cret@db.example/x?nosuchoption=1'):
        with pytest.raises(ValueError, match='is not a usable URL') as raised:
            MongoStepStore(db_url=bad, database='agents')
        assert 's3cret' not in str(raised.value) and raised.value.__cause__ is None
        assert raised.value.__suppress_context__


async def test_a_store_from_db_url_owns_its_client_a_callers_client_stays_open(url: str, database_name: str) -> None:
    store = MongoStepStore(db_url=url, database=database_name)
    await store.register_run(RunRecord(run_id='r'))
    owned: Any = store.backend.handle.get()  # type: ignore[attr-defined]
    await store.aclose()
    await store.aclose()
    with pytest.raises(Exception, match=r'closed|Cannot use'):
        await owned[database_name].runs.find_one({})
    assert await store.get_run(run_id='r') is not None  # a later call opens a new client
    await store.aclose()
    async with AsyncMongoClient(url) as client:
        shared = MongoStepStore(client, database=database_name)
        async with shared:
            assert await shared.get_run(run_id='r') is not None
        assert await client[database_name].runs.count_documents({}) == 1  # still open


async def test_open_step_store_takes_the_database_from_the_url(url: str, database_name: str) -> None:
    store = open_step_store(f'{url}/{database_name}', max_snapshots_per_run=2)
    assert isinstance(store, MongoStepStore) and store.database == database_name
    assert store.max_snapshots_per_run == 2
    async with store:
        await store.register_run(RunRecord(run_id='r'))
    with pytest.raises(ValueError, match='names no database'):
        open_step_store(url)


# --- records of runs registered elsewhere, deleted, replayed -----------------------------------------


async def test_a_run_without_a_counter_continues_its_numbers(url: str, database_name: str) -> None:
    """A run registered by the upstream package has no counter: the first write makes one from its records."""
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=T0))
        await store.save_snapshot(snapshot('r', tool_cycle()))
        async with AsyncMongoClient(url) as client:
            await client[database_name].counters.delete_one({'_id': 'run:r'})
            await client[database_name].events.update_many({'run_id': 'r'}, {'$set': {'seq': 41}})
        store._log.forget('r')  # pyright: ignore[reportPrivateUsage]
        await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=1, timestamp=T0))
        longer = [*tool_cycle(), *tool_cycle('c2')]
        await store.save_snapshot(snapshot('r', longer, step_index=2))
        assert [e.kind for e in await store.list_events(run_id='r')] == ['run_started', 'model_request_started']
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and latest.seq == 2 and dump(latest.messages) == dump(longer)
        with pytest.raises(RunNotFoundError):
            await store.append_event(StepEvent(run_id='never', kind='run_started', step_index=0))


async def test_a_counter_behind_its_log_catches_up_and_the_write_lands(url: str, database_name: str) -> None:
    """A log entry already at a reserved index: the write is stale, the counter moves past the log, the redo lands."""
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot('r', tool_cycle()))
        async with AsyncMongoClient(url) as client:
            await client[database_name].counters.update_one({'_id': 'run:r'}, {'$set': {'log': 0}})
        store._log.forget('r')  # pyright: ignore[reportPrivateUsage]
        longer = [*tool_cycle(), *tool_cycle('c2')]
        await store.save_snapshot(snapshot('r', longer, step_index=2))
        saved = await store.list_snapshots(run_id='r')
        assert [dump(item.messages) for item in saved] == [dump(tool_cycle()), dump(longer)]


async def test_a_deleted_run_refuses_writes_and_its_id_can_be_registered_again(url: str, database_name: str) -> None:
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot('r', tool_cycle()))
        assert await store.delete_run('r') == ['r']
        with pytest.raises(RunNotFoundError):
            await store.save_snapshot(snapshot('r', tool_cycle(), step_index=2))
        with pytest.raises(RunNotFoundError):
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        await store.register_run(RunRecord(run_id='r', agent_name='again'))
        await store.save_snapshot(snapshot('r', tool_cycle('c9')))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and latest.seq == 1 and dump(latest.messages) == dump(tool_cycle('c9'))


async def test_a_writer_whose_run_is_deleted_mid_write_removes_what_it_wrote(url: str, database_name: str) -> None:
    """The guard: a batch that claimed before the deletion finds the tombstone at its end and undoes itself."""
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r'))
        backend: Any = store.backend
        original = backend.writer.apply
        deleted: list[bool] = []

        async def delete_first(writes: Any) -> None:
            if not deleted and any(write.role == 'guard' for write in writes):
                deleted.append(True)
                await store.delete_run('r')
            await original(writes)

        backend.writer.apply = delete_first
        with pytest.raises(RunNotFoundError):
            await store.write_records(
                snapshot=snapshot('r', tool_cycle()),
                tool_effects=[ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id='r', status='started')],
                events=[StepEvent(run_id='r', kind='tool_call_started', step_index=1, idempotency_key='k')],
            )
        async with AsyncMongoClient(url) as client:
            database = client[database_name]
            for name in ('runs', 'message_log', 'snapshots', 'events', 'tool_effects'):
                assert await database[name].count_documents({}) == 0, name


async def test_a_deletion_cut_short_leaves_no_snapshot_reading_as_damaged(
    url: str, database_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server (or a client before 8.0, one collection at a time) that stops inside a deletion leaves
    a prefix of its writes: the snapshots go before the log they read, so what is left reads clean."""
    async with MongoStepStore(db_url=url, database=database_name) as store:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(snapshot('r', tool_cycle()))
        backend: Any = store.backend
        original = backend.writer.apply

        async def first_record_collection_only(writes: Any) -> None:
            backend.writer.apply = original
            assert writes[0].collection == 'counters'  # the run's tombstone, then the first of its records
            await original(writes[:2])

        backend.writer.apply = first_record_collection_only
        await store.delete_run('r')
        with caplog.at_level('WARNING'):
            assert await store.latest_snapshot(run_id='r', include_interrupted=True) is None
            assert await store.list_snapshots(run_id='r') == []
        assert not [record for record in caplog.records if record.levelname == 'WARNING'], caplog.text
        assert await store.delete_run('r') == ['r']  # a retry finishes it


async def test_a_replayed_snapshot_is_suppressed_after_pruning_and_the_rest_of_its_batch_written(
    url: str, database_name: str
) -> None:
    async with MongoStepStore(db_url=url, database=database_name, max_snapshots_per_run=1) as store:
        await store.register_run(RunRecord(run_id='r'))
        for step in (1, 2):
            await store.save_snapshot(
                snapshot('r', tool_cycle(f'c{step}'), step_index=step, idempotency_key=f'k{step}')
            )
        async with AsyncMongoClient(url) as client:
            stub = await client[database_name].snapshots.find_one({'idempotency_key': 'k1'})
        assert stub is not None and stub['state'] == 'pruned' and 'message_count' not in stub
        await store.write_records(
            snapshot=snapshot('r', tool_cycle('x'), step_index=9, idempotency_key='k1'),
            events=[StepEvent(run_id='r', kind='run_completed', step_index=9)],
        )
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and latest.step_index == 2
        assert [e.kind for e in await store.list_events(run_id='r')] == ['run_completed']
        record = await store.get_run(run_id='r')
        assert record is not None and record.status == 'completed'


async def test_a_second_put_of_a_blob_refreshes_it_for_garbage_collection(url: str, database_name: str) -> None:
    async with MongoMediaStore(db_url=url, database=database_name, chunk_size_bytes=1000) as media:
        uri = await media.put(b'b' * 2500)
        (first,) = [blob async for blob in media.list_blobs()]
        await anyio.sleep(0.002)  # stored_at has BSON's millisecond precision
        assert await media.put(b'b' * 2500) == uri
        (second,) = [blob async for blob in media.list_blobs()]
        assert second.stored_at > first.stored_at and second.size == 2500
        assert not await media.delete(uri, stored_before=first.stored_at)  # put again since: kept
        assert await media.delete(uri, stored_before=second.stored_at.replace(year=second.stored_at.year + 1))
        assert not await media.exists(uri)
        async with AsyncMongoClient(url) as client:
            assert await client[database_name].media_chunks.count_documents({}) == 0


async def test_blobs_over_16_mib_store_in_chunks_and_a_damaged_chunk_reads_as_missing(
    url: str, database_name: str
) -> None:
    async with MongoMediaStore(db_url=url, database=database_name) as media:
        data = bytes(range(256)) * (17 * 4096 + 3)  # a little over 17 MiB: three chunks of 8 MiB
        uri = await media.put(data)
        assert await media.get(uri) == data
        async with AsyncMongoClient(url) as client:
            chunks = client[database_name].media_chunks
            assert await chunks.count_documents({}) == 3
            await chunks.update_one({'n': 1}, {'$set': {'data': b'damaged'}})
        with pytest.raises(FileNotFoundError, match='damaged'):
            await media.get(uri)


def test_media_store_arguments_are_checked(url: str) -> None:
    with pytest.raises(ValueError, match='exactly one of'):
        MongoMediaStore(database='d')
    with pytest.raises(ValueError, match='invalid collection name'):
        MongoMediaStore(db_url=url, database='d', collection='a-b')
    with pytest.raises(ValueError, match='at most 16711680'):
        MongoMediaStore(db_url=url, database='d', chunk_size_bytes=16 << 20)
    with pytest.raises(ValueError, match='positive'):
        MongoMediaStore(db_url=url, database='d', chunk_size_bytes=0)


async def test_an_upstream_chunk_layout_reads(url: str, database_name: str) -> None:
    """Manifests and chunks without a chunk set, as the upstream package writes them."""
    import hashlib

    data = b'upstream bytes ' * 1000
    digest = hashlib.sha256(data).hexdigest()
    async with AsyncMongoClient(url) as client:
        database = client[database_name]
        await database.media.insert_one(
            {
                '_id': digest,
                'media_type': 'text/plain',
                'size_bytes': len(data),
                'chunk_count': 2,
                'chunk_size': 10_000,
                'metadata': '{"k":"v"}',
            }
        )
        for n in (0, 1):
            piece = data[n * 10_000 : (n + 1) * 10_000]
            await database.media_chunks.insert_one(
                {'_id': f'{digest}:10000:{n}', 'files_id': digest, 'chunk_size': 10_000, 'n': n, 'data': piece}
            )
        await database.media_chunks.insert_one(
            {'_id': ObjectId(), 'files_id': digest, 'chunk_size': 5, 'n': 0, 'data': b'other'}
        )
    async with MongoMediaStore(db_url=url, database=database_name) as media:
        uri = f'media+sha256://{digest}'
        assert await media.get(uri) == data and dict(await media.get_metadata(uri)) == {'k': 'v'}
        (blob,) = [blob async for blob in media.list_blobs()]  # stamped now: collectable one grace period later
        assert blob.uri == uri and blob.size == len(data)
        assert await media.delete(uri)
        assert not await media.exists(uri)
