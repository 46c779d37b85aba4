"""Child process for the concurrency test: several persisted agent runs at once on one store.

Usage: `python concurrent_child.py <file|sqlite|postgres|mongodb> <location> <prefix> <runs> <steps> <out-dir>`.
Each run `<prefix>-<n>` calls the `work` tool `steps` times (yielding to the other runs inside
the tool) and then answers. All start when `<out-dir>/go` appears. A run's final history is
written to `<out-dir>/<run id>.json` so the test can compare it with what the store kept.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore, StepStore, open_step_store


def make_store(kind: str, location: str) -> StepStore:
    if kind == 'file':
        return FileStepStore(location)
    if kind in ('postgres', 'mongodb'):  # location: postgresql://...?table=<prefix>, mongodb://host:port/database
        return open_step_store(location)
    return SqliteStepStore(database=location)


async def main(kind: str, location: str, prefix: str, runs: int, steps: int, out: Path) -> None:
    store = make_store(kind, location)
    rng = random.Random(prefix)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        done = sum(1 for message in messages if isinstance(message, ModelResponse))
        if done < steps:
            return ModelResponse(parts=[ToolCallPart('work', {'n': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart('finished')])

    async def one(index: int) -> None:
        run_id = f'{prefix}-{index}'
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=run_id)])

        @agent.tool_plain
        async def work(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
            await asyncio.sleep(rng.uniform(0, 0.003))
            return f'{run_id} result {n}'

        result = await agent.run('start', conversation_id=prefix, usage_limits=UsageLimits(request_limit=None))
        (out / f'{run_id}.json').write_bytes(result.all_messages_json())

    await asyncio.gather(*(one(index) for index in range(runs)))
    close = getattr(store, 'aclose', None)
    if close is not None:
        await close()


def wait_for_go(out: Path, prefix: str) -> None:
    """Start together with the other process: announce readiness, wait for the go signal."""
    (out / f'{prefix}.ready').touch()
    while not (out / 'go').exists():
        time.sleep(0.005)


if __name__ == '__main__':
    kind, location, prefix, runs, steps, out = sys.argv[1:]
    wait_for_go(Path(out), prefix)
    asyncio.run(main(kind, location, prefix, int(runs), int(steps), Path(out)))
