"""What a large tool result costs a step, against serializing it: many small values, or one long text.

    uv run python bench/large_result.py              # 30 steps, five rounds (about a minute)

A tool returning a 1,500-row dict (about 100 KB of JSON, no single value near the 64 KiB media
threshold) is over the threshold as a whole, so a boundary must decide whether anything in it goes
to the media store. Parsing and walking the text to find out costs more than serializing it, and
the walk's re-encoded text is not the serialized one, so the request's stamped version was
serialized and walked again at the next boundary. The text check (`might_need_externalizing`:
the longest string in the text) settles it without a parse.

Per step, medians of the rounds: the time inside the capability's hooks (`SqliteStepStore`, its
default SQLite media store) as shipped and with the text check answering "walk it" for every
text over the threshold (the behaviour before it), alternating; and, for scale, serializing the
step's new messages once.

The other workload is a tool returning one 200 KB text full of quotes and backslashes (a page of
HTML or code, as JSON spells it), which does go to the media store: the time inside the hooks,
and serializing the new messages once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic_ai_steps.media._markers as markers
from inside_hooks import HookClock, TimedStepPersistence
from pydantic_ai_steps.step_persistence import SqliteStepStore
from pydantic_ai_steps.store.history import message_to_json
from steps import UNLIMITED, make_agent

ROWS = 1500
PAGE = ('<div class="row" id="r{page}"><a href="/p?q=1">a link to C:\\path\\to\\file</a></div>\n' * 2700)[:200_000]


def rows(page: int) -> dict[str, Any]:
    return {f'row{i}': {'id': i, 'page': page, 'name': f'item {i}', 'tags': ['a', 'b']} for i in range(ROWS)}


def page(number: int) -> str:
    return PAGE.replace('{page}', str(number))


def always_walk(json_text: str, threshold_bytes: int) -> bool:
    del json_text, threshold_bytes
    return True


async def hooks_per_step(
    steps: int, walk_every_large_text: bool, tool_result: Callable[[int], object] = rows
) -> tuple[float, float]:
    """Milliseconds a step inside the hooks, and to serialize the run's new messages once."""
    shipped = markers._holds_a_long_string  # pyright: ignore[reportPrivateUsage]
    if walk_every_large_text:
        markers._holds_a_long_string = always_walk  # pyright: ignore[reportPrivateUsage]
    directory = Path(tempfile.mkdtemp(prefix='large-result-bench-'))
    try:
        store = SqliteStepStore(database=directory / 'steps.db')
        await make_agent(2, given_usage=True, result=tool_result, capabilities=[TimedStepPersistence(store)]).run(
            'go', usage_limits=UNLIMITED
        )
        clock = HookClock()
        gc.collect()
        result = await make_agent(
            steps, given_usage=True, result=tool_result, capabilities=[TimedStepPersistence(store, clock=clock)]
        ).run('go', usage_limits=UNLIMITED)
        await store.aclose()
    finally:
        markers._holds_a_long_string = shipped  # pyright: ignore[reportPrivateUsage]
        shutil.rmtree(directory)
    start = time.perf_counter()
    for message in result.all_messages()[1:]:
        message_to_json(message)
    return clock.seconds / steps * 1e3, (time.perf_counter() - start) / steps * 1e3


async def run(steps: int, rounds: int) -> None:
    shipped: list[float] = []
    walking: list[float] = []
    serializing: list[float] = []
    for _ in range(rounds):
        inside, serialized = await hooks_per_step(steps, False)
        shipped.append(inside)
        serializing.append(serialized)
        walking.append((await hooks_per_step(steps, True))[0])
    print(f'{steps} steps, a {ROWS}-row dict per tool call, median of {rounds} (min-max), ms a step:')
    for label, values in (
        ('inside the hooks, as shipped', shipped),
        ('inside the hooks, every large text walked', walking),
        ('serializing the new messages once', serializing),
    ):
        print(f'- {label}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})')
    texts = [await hooks_per_step(steps, False, page) for _ in range(rounds)]
    print(f'{steps} steps, a {len(PAGE) // 1000} KB text full of quotes and backslashes per tool call, ms a step:')
    for label, values in (
        ('inside the hooks', [inside for inside, _ in texts]),
        ('serializing the new messages once', [serialized for _, serialized in texts]),
    ):
        print(f'- {label}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})')


def main() -> None:
    parser = argparse.ArgumentParser(description='What a large tool result costs a step.')
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.steps, args.rounds))


if __name__ == '__main__':
    main()
