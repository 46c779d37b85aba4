"""Benchmark: step stores with media in the prompt (not a test; prints a table).

Workload: 50 runs whose prompt carries one of 5 distinct 256 KiB images. For each store it reports
stored bytes against the ideal (the 5 images once, plus every run's history without image bytes)
and time per run against the same agent without persistence, both measured in this one run.
If `pydantic_ai_harness` (the upstream package) is importable, its stores are measured too.

    uv run python bench/media_steps.py
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore

RUNS = 50
IMAGES = [os.urandom(256 * 1024) for _ in range(5)]


def describe(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart('A picture of a cat.')])


def prompt(index: int) -> list[str | BinaryContent]:
    return [f'Describe picture {index}', BinaryContent(IMAGES[index % len(IMAGES)], media_type='image/png')]


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return sum(p.stat().st_size for p in path.parent.glob(path.name + '*'))
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


async def timed_runs(agent: Agent[None, str]) -> tuple[float, list[list[ModelMessage]]]:
    histories: list[list[ModelMessage]] = []
    times: list[float] = []
    for index in range(RUNS):
        start = time.perf_counter()
        result = await agent.run(prompt(index))
        times.append(time.perf_counter() - start)
        histories.append(result.all_messages())
    return statistics.median(times), histories


def history_without_images(histories: list[list[ModelMessage]]) -> int:
    """JSON bytes of the histories with the images' base64 text taken out."""
    encoded = [base64.urlsafe_b64encode(image) for image in IMAGES]
    total = 0
    for history in histories:
        text = ModelMessagesTypeAdapter.dump_json(history)
        total += len(text) - sum(text.count(image) * len(image) for image in encoded)
    return total


def harness_makers() -> dict[str, tuple[Callable[[Path], tuple[Any, Path]], Callable[..., Any]]]:
    """The upstream package's File and SQLite stores with their default media stores, if it is installed."""
    try:
        upstream = importlib.import_module('pydantic_ai_harness.step_persistence')
    except ImportError:
        return {}
    return {
        'harness file': (lambda root: (upstream.FileStepStore(root / 'runs'), root / 'runs'), upstream.StepPersistence),
        'harness sqlite': (
            lambda root: (upstream.SqliteStepStore(database=root / 'runs.db'), root / 'runs.db'),
            upstream.StepPersistence,
        ),
    }


async def main() -> None:
    plain = Agent(FunctionModel(describe))
    await timed_runs(plain)  # warm up imports and pydantic schemas
    baseline, histories = await timed_runs(plain)
    ideal = sum(len(image) for image in IMAGES) + history_without_images(histories)
    makers: dict[str, tuple[Callable[[Path], tuple[Any, Path]], Callable[..., Any]]] = {
        'file': (lambda root: (FileStepStore(root / 'runs'), root / 'runs'), StepPersistence),
        'sqlite': (lambda root: (SqliteStepStore(database=root / 'runs.db'), root / 'runs.db'), StepPersistence),
        **harness_makers(),
    }
    print(f'{RUNS} runs, prompt = text + one of {len(IMAGES)} distinct 256 KiB images')
    print(f'ideal bytes (5 images once + histories without image bytes): {ideal:,}')
    print(f'agent alone: {baseline * 1000:.2f} ms/run (median)')
    print()
    print(f'{"store":14} {"stored bytes":>14} {"/ ideal":>8} {"ms/run":>8} {"/ alone":>8}')
    for name, (make, capability) in makers.items():
        root = Path(tempfile.mkdtemp(prefix=f'bench-media-{name}-'.replace(' ', '-')))
        try:
            store, location = make(root)
            agent = Agent(FunctionModel(describe), capabilities=[capability(store=store, agent_name='viewer')])
            per_run, _ = await timed_runs(agent)
            close = getattr(store, 'close', None)
            if callable(close):
                close()
            size = disk_bytes(location)
            print(f'{name:14} {size:>14,} {size / ideal:>8.2f} {per_run * 1000:>8.2f} {per_run / baseline:>8.2f}')
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    asyncio.run(main())
