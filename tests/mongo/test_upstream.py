"""A database written by the upstream package's Mongo stores (`upstream/harness-0.62.0.json.gz`, made
by `upstream/generate.py` with pydantic-ai-harness 0.62.0) reads through this package's stores,
and takes new writes without losing what was there."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util
from pydantic_ai.messages import ModelMessagesTypeAdapter

from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import MongoStepStore, RunRecord, StepEvent, continue_run, is_provider_valid
from pydantic_ai_steps.testing.step_store import dump, snapshot, tool_cycle

from .conftest import mongo_url, new_database_name

pytestmark = pytest.mark.anyio
FIXTURE = Path(__file__).with_name('upstream') / 'harness-0.62.0.json.gz'


@pytest.fixture(scope='module')
def fixture() -> dict[str, Any]:
    with gzip.open(FIXTURE, 'rt', encoding='utf-8') as handle:
        loaded: dict[str, Any] = json_util.loads(handle.read())
    return loaded


def load(url: str, name: str, fixture: dict[str, Any]) -> str:
    """Fill database `name` with exactly what the upstream package wrote, its indexes included."""
    with pymongo.MongoClient(url) as client:
        database = client[name]
        for collection, documents in fixture['collections'].items():
            for spec in fixture['indexes'][collection]:
                key = [(field, direction) for field, direction in spec['key']]
                if key != [('_id', 1)]:
                    database[collection].create_index(key, **{k: v for k, v in spec.items() if k != 'key'})
            if documents:
                database[collection].insert_many(documents)
    return name


@pytest.fixture
def upstream(url: str, database_name: str, fixture: dict[str, Any]) -> str:
    """A fresh copy of the upstream database, for a test that writes to it."""
    return load(url, database_name, fixture)


@pytest.fixture(scope='module')
def upstream_read_only(fixture: dict[str, Any]) -> Iterator[str]:
    """One copy of the upstream database for the tests that only read it."""
    url = mongo_url()
    name = load(url, new_database_name('upstream'), fixture)
    yield name
    with pymongo.MongoClient(url) as client:
        client.drop_database(name)


def same_history(ours: bytes, theirs: str) -> bool:
    """Equal as pydantic-ai messages (the fixture's JSON was dumped by the pydantic-ai upstream pins)."""
    return ours == dump(ModelMessagesTypeAdapter.validate_json(theirs))


async def test_runs_events_effects_and_snapshots_read_as_upstream_reads_them(
    url: str, upstream_read_only: str, fixture: dict[str, Any]
) -> None:
    upstream = upstream_read_only
    expected = fixture['expected']['runs']
    async with MongoStepStore(db_url=url, database=upstream) as store:
        runs = await store.list_runs()
        assert [run.run_id for run in runs] == list(expected)  # by started_at, as upstream lists them
        for record in runs:
            want = expected[record.run_id]
            got = {
                'conversation_id': record.conversation_id,
                'parent_run_id': record.parent_run_id,
                'agent_name': record.agent_name,
                'metadata': record.metadata,
                'started_at': record.started_at.isoformat(),
            }
            assert got == want['record']
            events = await store.list_events(run_id=record.run_id)
            assert [[e.kind, e.step_index, e.idempotency_key] for e in events] == want['events']
            unresolved = await store.list_unresolved_tool_effects(run_id=record.run_id)
            assert [effect.tool_call_id for effect in unresolved] == want['unresolved']
            saved = await store.list_snapshots(run_id=record.run_id, include_interrupted=True)
            assert [[s.step_index, s.state, s.idempotency_key] for s in saved] == [
                item[:3] for item in want['snapshots']
            ]
            for ours, theirs in zip(saved, want['snapshots'], strict=True):
                assert same_history(dump(ours.messages), theirs[3])
        history = await continue_run(store, run_id='orchestrator-1')
        assert is_provider_valid(history)
        assert [run.run_id for run in await store.list_runs(conversation_id='conv-1')] == [
            'orchestrator-1',
            'orchestrator-2',
        ]
        assert [run.run_id for run in await store.list_runs(parent_run_id='orchestrator-1')] == ['delegate-1']
        assert [run.run_id for run in await store.list_runs(metadata={'a.b': 'dotted'})] == ['orchestrator-1']


async def test_the_chunk_layout_reads_a_blob_over_16_mib(
    url: str, upstream_read_only: str, fixture: dict[str, Any]
) -> None:
    upstream = upstream_read_only
    blobs = fixture['expected']['blobs']
    async with MongoMediaStore(db_url=url, database=upstream) as media:
        big = await media.get(blobs['big']['uri'])
        assert len(big) == blobs['big']['size'] > 16 << 20
        assert dict(await media.get_metadata(blobs['small']['uri'])) == blobs['small']['metadata']
        assert len(await media.get(blobs['image']['uri'])) == blobs['image']['size']


async def test_new_writes_continue_upstream_runs(url: str, upstream: str, fixture: dict[str, Any]) -> None:
    """Indexes of the same specification are not built twice; seqs continue past the upstream ones."""
    async with MongoStepStore(db_url=url, database=upstream) as store:
        await store.register_run(RunRecord(run_id='ours', conversation_id='conv-1'))
        before = await store.list_snapshots(run_id='orchestrator-1')
        await store.append_event(StepEvent(run_id='orchestrator-1', kind='model_request_started', step_index=9))
        history = [*(await continue_run(store, run_id='orchestrator-1')), *tool_cycle('c-ours', 'and now')]
        await store.save_snapshot(snapshot('orchestrator-1', history, step_index=9))
        latest = await store.latest_snapshot(run_id='orchestrator-1')
        assert latest is not None and latest.step_index == 9 and dump(latest.messages) == dump(history)
        assert latest.seq is not None and latest.seq > max(item.seq or 0 for item in before)
        events = await store.list_events(run_id='orchestrator-1')
        assert (
            events[-1].kind == 'model_request_started'
            and len(events) == len(fixture['expected']['runs']['orchestrator-1']['events']) + 1
        )
        # A snapshot key the upstream package claimed, whose snapshot its retention pruned, stays claimed.
        kept = {
            item.idempotency_key
            for item in await store.list_snapshots(run_id='orchestrator-2', include_interrupted=True)
        }
        claimed = [
            document['_id']['key']
            for document in fixture['collections']['snapshot_idempotency_keys']
            if document['_id']['run_id'] == 'orchestrator-2' and document['_id']['key'] not in kept
        ]
        assert claimed
        newest = await store.latest_snapshot(run_id='orchestrator-2')
        await store.save_snapshot(
            snapshot('orchestrator-2', tool_cycle('replayed'), step_index=99, idempotency_key=claimed[0])
        )
        after = await store.latest_snapshot(run_id='orchestrator-2')
        assert after is not None and newest is not None and after.step_index == newest.step_index
        assert [run.run_id for run in await store.list_runs(conversation_id='conv-1')][-1] == 'ours'


async def test_garbage_collection_and_deletion_over_upstream_data(
    url: str, upstream: str, fixture: dict[str, Any]
) -> None:
    blobs = fixture['expected']['blobs']
    async with MongoStepStore(db_url=url, database=upstream) as store:
        planned = await store.collect_garbage(grace=timedelta(0), dry_run=True, writers_stopped=True)
        assert planned.blobs == [] and planned.kept_recent == 3  # undated: listed as just put, and left undated
        with pymongo.MongoClient(url) as client:
            assert client[upstream]['media'].count_documents({'stored_at': {'$exists': True}}) == 0
        first = await store.collect_garbage(
            grace=timedelta(0), writers_stopped=True
        )  # upstream manifests get their stored_at now
        assert first.blobs == [] and first.kept_recent == 3
        second = await store.collect_garbage(grace=timedelta(0), writers_stopped=True)
        assert sorted(second.blobs) == sorted([blobs['big']['uri'], blobs['small']['uri']])  # referenced by no text
        assert second.kept_referenced == 1  # the image, referenced from the upstream snapshot_messages
        latest = await store.latest_snapshot(run_id='orchestrator-1')
        assert latest is not None
        assert await store.delete_run('delegate-1') == ['delegate-1']
        assert await store.get_run(run_id='delegate-1') is None
        assert await store.latest_snapshot(run_id='delegate-1', include_interrupted=True) is None
        assert await store.list_events(run_id='delegate-1') == []
        assert await store.list_tool_effects(run_id='delegate-1') == []
    with pymongo.MongoClient(url) as client:
        keys = client[upstream].snapshot_idempotency_keys
        assert keys.count_documents({'_id.run_id': 'delegate-1'}) == 0
        assert keys.count_documents({'_id.run_id': 'orchestrator-1'}) > 0


async def test_an_inline_history_and_a_dangling_reference_of_older_upstream_releases(
    url: str, database_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before de-duplication the upstream package kept the history as a JSON list in `messages`;
    a reference whose message is gone makes that snapshot unreadable, and the older one is read."""
    inline = tool_cycle('c1', 'inline')
    with pymongo.MongoClient(url) as client:
        database = client[database_name]
        database.runs.insert_one(
            {'_id': 'old', 'run_id': 'old', 'metadata': {}, 'started_at': '2025-01-01T00:00:00+00:00'}
        )
        common = {'run_id': 'old', 'conversation_id': None, 'parent_run_id': None, 'agent_name': None}
        database.snapshots.insert_many(
            [
                {
                    **common,
                    'step_index': 1,
                    'timestamp': '2025-01-01T00:00:01+00:00',
                    'messages': dump(inline).decode(),
                    'seq': 7,
                },
                {
                    **common,
                    'step_index': 2,
                    'timestamp': '2025-01-01T00:00:02+00:00',
                    'state': 'complete',
                    'messages': '{"message_refs": ["' + 'ab' * 32 + '"]}',
                    'seq': 9,
                },
            ]
        )
    async with MongoStepStore(db_url=url, database=database_name) as store:
        latest = await store.latest_snapshot(run_id='old')
        assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(inline)
        assert 'references 1 stored message(s) that are missing' in caplog.text
