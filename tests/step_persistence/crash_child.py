"""Child process for the crash-safety tests: runs persisted agents on command, to be SIGKILLed.

Started once per store kind, it imports everything heavy and then waits on stdin for commands
(one JSON object per line). For each it forks a grandchild that runs one agent and prints the
grandchild's pid, then reaps it and prints how it ended. The test kills grandchildren with
SIGKILL at random moments; forking from an already-imported process keeps each attempt to
milliseconds instead of the second a fresh interpreter needs.

The agent calls the `work` tool once per step (call ids `call-0`, `call-1`, ...). The tool's
body writes `B <call id>` when it begins and `E <call id>` when it ends to a side-channel file,
each line flushed and fsynced, so the test knows which bodies began and finished independently
of the store. `DONE` marks a run that completed.

A command with `"turns": true` runs two turns of one conversation instead: the first completes,
the second's model notes `ASKED` when it is first asked and never answers, to be killed there.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore, StepStore, open_step_store


def make_store(kind: str, location: str, max_snapshots: int | None) -> StepStore:
    if kind == 'file':
        return FileStepStore(location, max_snapshots_per_run=max_snapshots)
    if kind in ('postgres', 'mongodb'):  # location: postgresql://...?table=<prefix>, mongodb://host:port/database
        return open_step_store(location, max_snapshots_per_run=max_snapshots)
    return SqliteStepStore(database=location, max_snapshots_per_run=max_snapshots)


def run_one(command: dict[str, Any]) -> None:
    """The grandchild: one persisted agent run, noting each tool body in the side channel."""
    rng = random.Random(command['seed'])
    steps: int = command['steps']
    side = open(command['side'], 'a', encoding='utf-8')  # noqa: SIM115 - lives until os._exit

    def note(text: str) -> None:
        side.write(text + '\n')
        side.flush()
        os.fsync(side.fileno())

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        done = sum(1 for message in messages if isinstance(message, ModelResponse))
        if done < steps:
            return ModelResponse(parts=[ToolCallPart('work', {'n': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart('finished')])

    store = make_store(command['kind'], command['location'], command['max_snapshots'])
    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=command['run_id'])])

    @agent.tool_plain
    async def work(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        note(f'B call-{n}')
        await asyncio.sleep(rng.uniform(0, command['tool_sleep']))
        note(f'E call-{n}')
        return f'result {n}: ' + 'r' * 512

    async def main() -> None:
        await agent.run('start', usage_limits=UsageLimits(request_limit=None))
        note('DONE')

    asyncio.run(main())


def run_turns(command: dict[str, Any]) -> None:
    """The grandchild: a completed turn, then a turn whose first model request hangs."""
    side = open(command['side'], 'a', encoding='utf-8')  # noqa: SIM115 - lives until os._exit

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del messages, info
        return ModelResponse(parts=[TextPart('turn one answered')])

    async def hang(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del messages, info
        side.write('ASKED\n')
        side.flush()
        os.fsync(side.fileno())
        await asyncio.sleep(3600)
        raise AssertionError('the test kills the process while the model is asked')

    store = make_store(command['kind'], command['location'], None)

    async def main() -> None:
        conversation_id = command['conversation_id']
        first = await Agent(FunctionModel(answer), capabilities=[StepPersistence(store=store)]).run(
            'turn one', conversation_id=conversation_id
        )
        second = Agent(FunctionModel(hang), capabilities=[StepPersistence(store=store)])
        await second.run('turn two', message_history=first.all_messages(), conversation_id=conversation_id)

    asyncio.run(main())


def warm_up() -> None:
    """Run one agent here, so every grandchild starts with pydantic-ai's lazy setup done (and the
    server drivers imported: the zygote itself never connects, so no grandchild inherits a socket)."""
    with contextlib.suppress(ImportError):
        import asyncpg  # noqa: F401  # pyright: ignore[reportUnusedImport]

        import pydantic_ai_steps.store.backends.postgres  # noqa: F401  # pyright: ignore[reportUnusedImport]
    if importlib.util.find_spec('pymongo') is not None:  # imported, not connected: a client opens after the fork
        importlib.import_module('pydantic_ai_steps.store.backends.mongo')
        importlib.import_module('pydantic_ai_steps.media.stores.mongo')
    with tempfile.TemporaryDirectory() as scratch:
        for kind, location in (('file', f'{scratch}/steps'), ('sqlite', f'{scratch}/steps.db')):
            command = {'kind': kind, 'location': location, 'steps': 2, 'tool_sleep': 0.0, 'max_snapshots': None}
            run_one({**command, 'run_id': 'warm-up', 'seed': 0, 'side': f'{scratch}/side'})


def serve() -> None:
    warm_up()
    for line in sys.stdin:
        command = json.loads(line)
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the grandchild
            code = 1
            try:
                (run_turns if command.get('turns') else run_one)(command)
                code = 0
            finally:
                os._exit(code)
        print(json.dumps({'pid': pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - started
        print(json.dumps({'status': status, 'elapsed': elapsed}), flush=True)


if __name__ == '__main__':
    serve()
