"""MongoStepStore: round trips per write (counted by a pymongo command listener) and stored bytes.

    uv run python bench/mongo_round_trips.py --url mongodb://127.0.0.1:27017
    uv run python bench/mongo_round_trips.py --url ... --harness-python /tmp/harness-mongo/bin/python

`--url` defaults to `$TEST_MONGODB_URL` (the test server `scripts/services.sh` starts). Every
figure here is a count, never a time: the test server (SecantusDB) is a Python program, so its
speed says nothing about MongoDB's.

- *Round trips per write*: the 400-step history of the benchmark agent (`bench/steps.py`) is
  recorded once, then the writes a run makes per tool cycle are replayed (the `started` ledger
  entry with the step's events; the boundary snapshot with the closed entry and its event, each one
  `write_records`, as the capability's batching writer makes them), and the commands each write
  sends are counted at steps 5, 100 and 400: with MongoDB 8.0's client-level `bulkWrite`, and with
  the fallback for older servers (one `bulk_write` per collection).
- *Every write of a real run*: the 100-step agent with `StepPersistence`, the commands of each
  store write counted: the largest and the most common count.
- *Stored bytes*: `dataSize` (collStats `size`) of every collection the 100-step run left, media
  collections included, over the JSON size of its final history.
- With `--harness-python` (an interpreter where `pydantic-ai-harness` is installed, kept out of
  this project's environment), the upstream package's MongoStepStore replays the same records one
  store call each (it has no batch write) and runs the same 100-step agent, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pymongo import AsyncMongoClient, monitoring

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    MongoStepStore,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
)
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

STEPS = 400
MEASURED = (5, 100, 399)
"""Tool cycles counted: early, at 100, and the last one of the 400-step run (399 tool calls, then the answer)."""
COLLECTIONS_OF_A_STORE = (
    'runs',
    'events',
    'snapshots',
    'tool_effects',
    'counters',
    'message_log',
    'media',
    'media_chunks',
    'snapshot_messages',
    'snapshot_idempotency_keys',
)


class Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        del event

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        del event


def cycle(step: int, history: list[ModelMessage]) -> list[dict[str, Any]]:
    """The two writes of tool cycle `step` (1-based), as `write_records` arguments."""
    call = f'call-{step}'
    events = [
        StepEvent(run_id='r', kind=kind, step_index=step, tool_call_id=call, idempotency_key=f'r:{step}:{kind}')
        for kind in ('model_request_started', 'model_request_completed', 'tool_call_started')
    ]
    started = ToolEffectRecord(tool_call_id=call, tool_name='fetch', run_id='r', status='started')
    closed = ToolEffectRecord(tool_call_id=call, tool_name='fetch', run_id='r', status='completed')
    done = StepEvent(run_id='r', kind='tool_call_completed', step_index=step, idempotency_key=f'r:{step}:done')
    # After cycle `step` the history holds the first request, then a response and a request per cycle.
    snapshot = ContinuableSnapshot(run_id='r', step_index=step, messages=history[: 2 * step + 1])
    return [
        {'tool_effects': [started], 'events': events},
        {'snapshot': snapshot, 'tool_effects': [closed], 'events': [done]},
    ]


async def replay(url: str, history: list[ModelMessage], *, client_bulk: bool) -> dict[int, list[int]]:
    """Commands per write at the measured steps, replaying the run's writes."""
    commands = Commands()
    database = f'bench_rt_{uuid.uuid4().hex[:8]}'
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, event_listeners=[commands])
    try:
        store = MongoStepStore(client, database=database)
        if not client_bulk:
            store.backend.writer.client_bulk = False  # type: ignore[attr-defined]
        await store.write_records(run=RunRecord(run_id='r'))
        counts: dict[int, list[int]] = {}
        for step in range(1, STEPS):
            for batch in cycle(step, history):
                commands.names.clear()
                await store.write_records(**batch)
                if step in MEASURED:
                    counts.setdefault(step, []).append(len(commands.names))
        return counts
    finally:
        await client.drop_database(database)
        await client.close()


async def data_size(client: AsyncMongoClient[dict[str, Any]], database: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for name in await client[database].list_collection_names():
        stats = await client[database].command('collStats', name)
        sizes[name] = int(stats.get('size', 0))
    return sizes


async def real_run(url: str, steps: int) -> tuple[collections.Counter[int], int, dict[str, int]]:
    """A `steps`-step agent over MongoStepStore: commands per store write, final history bytes, dataSize."""
    commands = Commands()
    database = f'bench_run_{uuid.uuid4().hex[:8]}'
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, event_listeners=[commands])
    per_write: collections.Counter[int] = collections.Counter()
    store = MongoStepStore(client, database=database)

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def write_records(self, **records: Any) -> None:
            commands.names.clear()
            await store.write_records(**records)
            per_write[len(commands.names)] += 1

    try:
        agent = make_agent(steps, [StepPersistence(store=Counting(), run_id='bench')])  # type: ignore[arg-type]
        result = await agent.run('go', usage_limits=UNLIMITED)
        return per_write, len(result.all_messages_json()), await data_size(client, database)
    finally:
        await client.drop_database(database)
        await client.close()


HARNESS_SCRIPT = r"""
import asyncio, json, sys, uuid
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pymongo import AsyncMongoClient, monitoring
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot, MongoStepStore, RunRecord, StepEvent, StepPersistence, ToolEffectRecord,
)
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.usage import UsageLimits

MEASURED = (5, 100, 399)
UNLIMITED = UsageLimits(request_limit=None)


def make_agent(steps, capabilities):  # bench/steps.py's agent (that module imports this project)
    def model(messages, info):
        done = sum(1 for message in messages if isinstance(message, ModelResponse))
        if done < steps - 1:
            return ModelResponse(parts=[ToolCallPart('fetch', {'page': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart('done')])

    agent = Agent(FunctionModel(model), capabilities=capabilities)

    @agent.tool_plain
    async def fetch(page: int) -> str:
        return (f'page {page}: ' + 'x' * 2048)[:2048]

    return agent


class Commands(monitoring.CommandListener):
    def __init__(self): self.names = []
    def started(self, event): self.names.append(event.command_name)
    def succeeded(self, event): pass
    def failed(self, event): pass


async def main(url, history_file, steps):
    history = ModelMessagesTypeAdapter.validate_json(open(history_file, 'rb').read())
    commands = Commands()
    client = AsyncMongoClient(url, event_listeners=[commands])
    database = 'bench_harness_' + uuid.uuid4().hex[:8]
    store = MongoStepStore(client=client, database=database)
    await store.register_run(RunRecord(run_id='r'))
    counts = {}
    for step in range(1, steps):
        call = f'call-{step}'
        effect = dict(tool_call_id=call, tool_name='fetch', run_id='r')
        commands.names.clear()
        await store.record_tool_effect(ToolEffectRecord(**effect, status='started'))
        for kind in ('model_request_started', 'model_request_completed', 'tool_call_started'):
            key = f'r:{step}:{kind}'
            event = StepEvent(run_id='r', kind=kind, step_index=step, tool_call_id=call, idempotency_key=key)
            await store.append_event(event)
        first = len(commands.names)
        commands.names.clear()
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=history[: 2 * step + 1]))
        await store.record_tool_effect(ToolEffectRecord(**effect, status='completed'))
        done = StepEvent(run_id='r', kind='tool_call_completed', step_index=step, idempotency_key=f'r:{step}:done')
        await store.append_event(done)
        if step in MEASURED:
            counts[step] = [first, len(commands.names)]
    await client.drop_database(database)
    database = 'bench_harness_run_' + uuid.uuid4().hex[:8]
    agent = make_agent(100, [StepPersistence(MongoStepStore(client=client, database=database), run_id='bench')])
    result = await agent.run('go', usage_limits=UNLIMITED)
    sizes = {}
    for name in await client[database].list_collection_names():
        sizes[name] = int((await client[database].command('collStats', name)).get('size', 0))
    await client.drop_database(database)
    await client.close()
    print(json.dumps({'counts': counts, 'history': len(result.all_messages_json()), 'sizes': sizes}))


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def harness(python: str, url: str, history: list[ModelMessage]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        history_file = Path(scratch) / 'history.json'
        history_file.write_bytes(ModelMessagesTypeAdapter.dump_json(history))
        script = Path(scratch) / 'harness_mongo.py'
        script.write_text(HARNESS_SCRIPT)
        done = subprocess.run(
            [python, str(script), url, str(history_file), str(STEPS)],
            capture_output=True,
            text=True,
            check=False,
            timeout=3600,
        )
    if done.returncode != 0:
        sys.exit(f'the upstream package failed ({python}):\n{done.stderr}')
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ratio(sizes: dict[str, int], history: int) -> str:
    total = sum(sizes.values())
    return f'{total:,} B / {history:,} B = {total / history:.2f}x'


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--url', default=os.environ.get('TEST_MONGODB_URL'))
    parser.add_argument('--harness-python', help='an interpreter with pydantic-ai-harness installed')
    args = parser.parse_args()
    if not args.url:
        sys.exit('give --url mongodb://host:port (or set TEST_MONGODB_URL)')
    url: str = args.url
    probe: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    async with probe:
        info = await probe.server_info()
    print(
        f'server: {url} reports MongoDB {info.get("version")}'
        + (f' ({info["secantusVersion"]} SecantusDB)' if 'secantusVersion' in info else '')
    )
    history = (await make_agent(STEPS, []).run('go', usage_limits=UNLIMITED)).all_messages()

    print(f'\ncommands per write, replaying the writes of the {STEPS}-step run, at three of its tool cycles')
    print('(first: the started ledger entry with its events; second: the boundary snapshot with its entry and event)')
    print(f'{"path":40} ' + ' '.join(f'{"cycle " + str(step):>10}' for step in MEASURED))
    for label, client_bulk in (
        ('client bulkWrite (MongoDB 8.0+)', True),
        ('one bulk_write per collection (< 8.0)', False),
    ):
        counts = await replay(url, history, client_bulk=client_bulk)
        print(f'{label:40} ' + ' '.join(f'{"+".join(map(str, counts[step])):>10}' for step in MEASURED))

    per_write, history_bytes, sizes = await real_run(url, 100)
    common, _ = per_write.most_common(1)[0]
    spread = dict(sorted(per_write.items()))
    print(f'\nthe 100-step agent: {sum(per_write.values())} store writes; commands per write {spread}')
    print(f'(most often {common}, at most {max(per_write)}; the first write also checks the layout once)')
    ours = {name: size for name, size in sizes.items() if name in COLLECTIONS_OF_A_STORE}
    print(
        f'stored bytes (dataSize): {ratio(ours, history_bytes)}  '
        + ', '.join(f'{k} {v:,}' for k, v in sorted(ours.items()))
    )

    if args.harness_python:
        upstream = harness(args.harness_python, url, history)
        counts = {int(step): value for step, value in upstream['counts'].items()}
        print('\nupstream pydantic-ai-harness MongoStepStore, the same records one store call each (7 calls per cycle)')
        print(
            f'{"commands per tool cycle":40} '
            + ' '.join(f'{"+".join(map(str, counts[step])):>10}' for step in MEASURED)
        )
        print(
            f'stored bytes (dataSize), 100-step agent: {ratio(upstream["sizes"], upstream["history"])}  '
            + ', '.join(f'{k} {v:,}' for k, v in sorted(upstream['sizes'].items()))
        )


if __name__ == '__main__':
    asyncio.run(main())
