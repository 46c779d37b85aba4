"""Write `harness-0.62.0.json.gz`: what the upstream package's Mongo stores leave in a database.

Run it with the upstream package, in a virtual environment of its own (never this project's):

    python3 -m venv /tmp/harness-mongo
    /tmp/harness-mongo/bin/pip install pydantic-ai-harness==0.62.0 'pymongo>=4.17'
    TEST_MONGODB_URL=mongodb://127.0.0.1:PORT /tmp/harness-mongo/bin/python tests/mongo/upstream/generate.py

It drives `pydantic_ai_harness`'s public API only: agents with `StepPersistence` over its
`MongoStepStore` (so its `runs`, `events`, `snapshots` with `message_refs`, `snapshot_messages`,
`snapshot_idempotency_keys`, `tool_effects` and global `counters`), and its `MongoMediaStore`
(manifests and chunks: an image above the externalization threshold through a snapshot, and a
blob over 16 MiB put directly). Then it dumps every collection as MongoDB extended JSON
(canonical, so int32/int64 and binaries keep their types), the index specifications, and what
the upstream stores themselves read back (the expectation the test compares with).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from bson import json_util
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_harness.media import MediaContext, MongoMediaStore
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot,
    MongoStepStore,
    RunRecord,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
)
from pymongo import AsyncMongoClient

DATABASE = 'harness_fixture'
OUT = Path(__file__).with_name('harness-0.62.0.json.gz')
IMAGE = bytes(range(256)) * 320  # 81,920 bytes: above the 64 KiB threshold, so it goes to the media store
BIG_BLOB = bytes(range(256)) * (17 * 4096 + 5)  # a little over 17 MiB: three chunks of 8 MiB
ALL_COLLECTIONS = (
    'runs',
    'events',
    'snapshots',
    'snapshot_messages',
    'snapshot_idempotency_keys',
    'tool_effects',
    'counters',
    'media',
    'media_chunks',
)


def agent_with_lookup(steps: int, persistence: StepPersistence[Any], prefix: str) -> Agent[None, str]:
    """An agent whose model calls `lookup` `steps` times, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        done = sum(isinstance(message, ModelResponse) for message in messages)
        if done < steps:
            return ModelResponse(parts=[ToolCallPart('lookup', {'n': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart('all looked up')])

    agent = Agent(FunctionModel(respond), capabilities=[persistence])

    @agent.tool_plain
    def lookup(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{prefix} {n}: ' + 'r' * 200

    return agent


async def write(client: AsyncMongoClient[dict[str, Any]]) -> None:
    store = MongoStepStore(client=client, database=DATABASE)
    pruned = MongoStepStore(client=client, database=DATABASE, max_snapshots_per_run=2)

    # 1. An orchestrator run; its prompt carries an image above the threshold (to the media store).
    metadata = {'team': 'docs', 'a.b': 'dotted'}
    first = agent_with_lookup(3, StepPersistence(store, 'orchestrator', 'orchestrator-1', metadata=metadata), 'result')
    await first.run(['look at this', BinaryContent(IMAGE, media_type='image/png')], conversation_id='conv-1')

    # 2. A second turn of the conversation, with retention: its pruned snapshots' keys stay claimed.
    second = agent_with_lookup(4, StepPersistence(pruned, 'orchestrator', 'orchestrator-2'), 'again')
    await second.run('second turn', conversation_id='conv-1')

    # 3. A delegate run and a run that crashed mid-tool, written record by record.
    await store.register_run(RunRecord(run_id='delegate-1', parent_run_id='orchestrator-1', agent_name='librarian'))
    await store.append_event(
        StepEvent(run_id='delegate-1', kind='run_started', step_index=0, idempotency_key='0:run_started')
    )
    await store.record_tool_effect(
        ToolEffectRecord(
            tool_call_id='c-crash',
            tool_name='open_issue',
            run_id='delegate-1',
            status='started',
            idempotency_key='issue-7',
        )
    )
    await store.save_snapshot(
        ContinuableSnapshot(
            run_id='delegate-1',
            step_index=1,
            messages=ModelMessagesTypeAdapter.validate_python(
                [
                    {'kind': 'request', 'parts': [{'part_kind': 'user-prompt', 'content': 'find it'}]},
                    {
                        'kind': 'response',
                        'parts': [
                            {'part_kind': 'tool-call', 'tool_name': 'open_issue', 'args': {}, 'tool_call_id': 'c-crash'}
                        ],
                    },
                ]
            ),
            state='interrupted',
            idempotency_key='0:1:interrupted',
        )
    )

    # 4. A blob over 16 MiB and a small one with metadata, straight into the media store.
    media = MongoMediaStore(client=client, database=DATABASE)
    await media.put(BIG_BLOB, context=MediaContext(media_type='application/octet-stream'))
    await media.put(b'small note', context=MediaContext(media_type='text/plain', metadata={'source': 'generate.py'}))


async def expectations(client: AsyncMongoClient[dict[str, Any]]) -> dict[str, Any]:
    """What the upstream stores read back, to compare with what this project's stores read."""
    store = MongoStepStore(client=client, database=DATABASE)
    media = MongoMediaStore(client=client, database=DATABASE)
    runs: dict[str, Any] = {}
    for record in await store.list_runs():
        run_id = record.run_id
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        runs[run_id] = {
            'record': {
                'conversation_id': record.conversation_id,
                'parent_run_id': record.parent_run_id,
                'agent_name': record.agent_name,
                'metadata': record.metadata,
                'started_at': record.started_at.isoformat(),
            },
            'events': [
                [event.kind, event.step_index, event.idempotency_key]
                for event in await store.list_events(run_id=run_id)
            ],
            'unresolved': [effect.tool_call_id for effect in await store.list_unresolved_tool_effects(run_id=run_id)],
            'snapshots': [
                [
                    item.step_index,
                    item.state,
                    item.idempotency_key,
                    ModelMessagesTypeAdapter.dump_json(item.messages).decode(),
                ]
                for item in snapshots
            ],
        }
    blobs = {
        'big': {'uri': 'media+sha256://' + hashlib.sha256(BIG_BLOB).hexdigest(), 'size': len(BIG_BLOB)},
        'small': {
            'uri': 'media+sha256://' + hashlib.sha256(b'small note').hexdigest(),
            'metadata': {'source': 'generate.py'},
        },
        'image': {'uri': 'media+sha256://' + hashlib.sha256(IMAGE).hexdigest(), 'size': len(IMAGE)},
    }
    assert await media.get(blobs['big']['uri']) == BIG_BLOB
    return {'runs': runs, 'blobs': blobs}


async def main() -> None:
    url = os.environ['TEST_MONGODB_URL']
    async with AsyncMongoClient(url) as client:
        await client.drop_database(DATABASE)
        await write(client)
        database = client[DATABASE]
        dump: dict[str, Any] = {'written_by': 'pydantic-ai-harness 0.62.0', 'collections': {}, 'indexes': {}}
        for name in ALL_COLLECTIONS:
            dump['collections'][name] = [document async for document in database[name].find({}, sort=[('_id', 1)])]
            dump['indexes'][name] = [
                {'key': list(spec['key']), **{k: v for k, v in spec.items() if k not in ('key', 'v', 'ns')}}
                for spec in (await database[name].index_information()).values()
            ]
        dump['expected'] = await expectations(client)
        await client.drop_database(DATABASE)
    text = json_util.dumps(dump, json_options=json_util.CANONICAL_JSON_OPTIONS)
    json.loads(text)  # it is JSON
    with gzip.open(OUT, 'wt', encoding='utf-8', compresslevel=9) as handle:
        handle.write(text)
    print(f'wrote {OUT} ({OUT.stat().st_size} bytes)', file=sys.stderr)


if __name__ == '__main__':
    asyncio.run(main())
