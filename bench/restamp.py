"""What a stamped request costs at a boundary, with and without knowing where its parts end.

    uv run python bench/restamp.py              # loop figures, then 100-step runs (about a minute)

pydantic-ai stamps the pending tool-return request after the boundary that saved it, so the next
boundary writes it again, as a patch of the text saved before (`PatchBase.restamped`). Building that
version reuses the base's `parts` member, which needs to know where the member ends: the base
remembers it (`PatchBase.split`, from `request_to_json`), else the member is scanned to its end,
which parses the tool results.

In a loop, per payload (the benchmark's 2 KB string, a 120-row dict of about 8 KB of JSON), the
minimum of five repeats: serializing the stamped request whole, restamping with the known end, and
restamping by scanning for it. Then inside running agents (100 steps, the dict payload, the
in-memory store), the time inside the capability's hooks per step as shipped and with the end of
the parts forgotten (so every restamp scans), alternating, medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import timeit
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelRequest, ToolReturnPart

import pydantic_ai_steps.store.message_log as message_log
from inside_hooks import HookClock, TimedStepPersistence
from pydantic_ai_steps.step_persistence import InMemoryStepStore
from pydantic_ai_steps.store.history import message_to_json, request_tail, request_to_json
from pydantic_ai_steps.store.patch import restamp
from steps import UNLIMITED, make_agent

ROWS = 120


def rows(page: int) -> dict[str, Any]:
    return {
        f'row{i}': {'id': i, 'page': page, 'name': f'item {i}', 'tags': ['a', 'b'], 'score': i * 1.5}
        for i in range(ROWS)
    }


def best(call: Any) -> float:
    """Microseconds a call takes, the minimum of five repeats."""
    return min(timeit.repeat(call, number=2000, repeat=5)) / 2000 * 1e6


def loop_row(label: str, content: object) -> str:
    request = ModelRequest(parts=[ToolReturnPart('fetch', content, tool_call_id='call-0')])
    base, split = request_to_json(request)
    request.timestamp, request.run_id = datetime.now(UTC), 'run'
    tail = request_tail(request)
    assert tail is not None
    whole = best(lambda: message_to_json(request))
    known = best(lambda: restamp(0, base, tail, split))
    scanned = best(lambda: restamp(0, base, tail))
    return f'| {label} ({len(base)} chars) | {whole:.1f} | {known:.1f} | {scanned:.1f} |'


def loop_figures() -> None:
    print('| payload | serialize whole (us) | restamp, end known (us) | restamp, end scanned (us) |')
    print('|---|---|---|---|')
    print(loop_row('2 KB string', 'x' * 2048))
    print(loop_row(f'{ROWS}-row dict', rows(0)))


def forgetting_the_end(request: ModelRequest) -> tuple[str, int | None]:
    return request_to_json(request)[0], None


async def hooks_per_step(steps: int, forget: bool) -> float:
    message_log.request_to_json = forgetting_the_end if forget else request_to_json  # pyright: ignore[reportAttributeAccessIssue]
    try:
        store = InMemoryStepStore()
        clock = HookClock()
        gc.collect()
        await make_agent(
            steps, given_usage=True, result=rows, capabilities=[TimedStepPersistence(store, clock=clock)]
        ).run('go', usage_limits=UNLIMITED)
        return clock.seconds / steps * 1e3
    finally:
        message_log.request_to_json = request_to_json


async def agent_figures(steps: int, rounds: int) -> None:
    shipped: list[float] = []
    scanning: list[float] = []
    await hooks_per_step(2, False)  # imports and first-use costs
    for _ in range(rounds):
        shipped.append(await hooks_per_step(steps, False))
        scanning.append(await hooks_per_step(steps, True))
    print(
        f'\nInside the hooks, {steps} steps, {ROWS}-row dict, in-memory store, median of {rounds} (min-max), ms a step:'
    )
    print(f'- as shipped (end known): {statistics.median(shipped):.3f} ({min(shipped):.3f}-{max(shipped):.3f})')
    print(f'- end scanned:            {statistics.median(scanning):.3f} ({min(scanning):.3f}-{max(scanning):.3f})')


def main() -> None:
    parser = argparse.ArgumentParser(description='What a stamped request costs at a boundary.')
    parser.add_argument('--steps', type=int, default=100)
    parser.add_argument('--rounds', type=int, default=7)
    args = parser.parse_args()
    loop_figures()
    asyncio.run(agent_figures(args.steps, args.rounds))


if __name__ == '__main__':
    main()
