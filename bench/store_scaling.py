"""A store's own cost per tool cycle near step 100 and near step 400, outside any agent.

`bench/steps.py` measures persistence inside running agents, where pydantic-ai's own work per
step grows with the history (its agent alone takes about three times as long per step at 400
steps as at 100) and everything else slows with it. This script separates the store: it records
the 400-step history of the benchmark agent once, then replays against each store the writes a
run makes per tool cycle (the `started` ledger entry with the step's events, then the boundary
snapshot with the closed entry and its event, through `write_records`), and prints the median
cycle time around step 100 and over the last twenty cycles. A store whose cost per step grew
with the history would show it in the last column.

    uv run python bench/store_scaling.py
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage

from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    InMemoryStepStore,
    RecordBatchStore,
    RunRecord,
    SqliteStepStore,
    StepEvent,
    ToolEffectRecord,
)
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

STEPS = 400


async def cycle_times(store: RecordBatchStore, history: list[ModelMessage]) -> list[float]:
    """Seconds per tool cycle, for every cycle of the recorded history."""
    opening = StepEvent(run_id='r', kind='run_started', step_index=0, idempotency_key='r:0')
    await store.write_records(run=RunRecord(run_id='r'), events=[opening])
    times: list[float] = []
    for step in range(STEPS - 1):
        call = f'call-{step}'
        events = [
            StepEvent(run_id='r', kind=kind, step_index=step + 1, tool_call_id=call, idempotency_key=f'r:{step}:{kind}')
            for kind in ('model_request_started', 'model_request_completed', 'tool_call_started')
        ]
        started = ToolEffectRecord(tool_call_id=call, tool_name='fetch', run_id='r', status='started')
        closed = ToolEffectRecord(tool_call_id=call, tool_name='fetch', run_id='r', status='completed')
        done = StepEvent(run_id='r', kind='tool_call_completed', step_index=step + 1, idempotency_key=f'r:{step}:done')
        # After cycle `step` the history holds the first request, then a response and a request per cycle.
        snapshot = ContinuableSnapshot(run_id='r', step_index=step + 1, messages=history[: 2 * step + 3])
        start = time.perf_counter()
        await store.write_records(tool_effects=[started], events=events)
        await store.write_records(snapshot=snapshot, tool_effects=[closed], events=[done])
        times.append(time.perf_counter() - start)
    return times


async def main() -> None:
    result = await make_agent(STEPS, []).run('go', usage_limits=UNLIMITED)
    history = result.all_messages()
    stores: dict[str, Callable[[Path], Any]] = {
        'memory': lambda root: InMemoryStepStore(),
        'file': lambda root: FileStepStore(root / 'runs'),
        'sqlite': lambda root: SqliteStepStore(database=root / 'runs.db'),
    }
    print(f'store cost per tool cycle (two writes), {STEPS}-step history, outside any agent')
    print(f'{"store":8} {"steps 90-110":>13} {"last 20":>9} {"last / 100":>11}')
    for name, make in stores.items():
        root = Path(tempfile.mkdtemp(prefix=f'bench-scaling-{name}-'))
        try:
            store = make(root)
            await cycle_times(store, history)  # warm-up run: imports, first-use setup, caches
            store = make(root / 'measured')
            times = await cycle_times(store, history)
            close = getattr(store, 'close', None)
            if callable(close):
                close()
            early, late = statistics.median(times[89:110]), statistics.median(times[-20:])
            print(f'{name:8} {early * 1e6:>10.0f} us {late * 1e6:>6.0f} us {late / early:>10.2f}x')
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    asyncio.run(main())
