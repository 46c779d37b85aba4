"""A store's own cost per tool cycle near step 100 and near step 400, outside any agent.

`bench/steps.py` measures persistence inside running agents, where pydantic-ai's own work per
step grows with the history (its agent alone takes about three times as long per step at 400
steps as at 100) and everything else slows with it. This script separates the store: it records
the 400-step history of the benchmark agent once, then replays against each store the writes a
run makes per tool cycle (the `started` ledger entry with the step's events, then the boundary
snapshot with the closed entry and its event, through `write_records`), and prints the median
cycle time around step 100 and over the last twenty cycles. A store whose cost per step grew
with the history would show it in the last column.

With `TEST_POSTGRES_DSN` set (`scripts/services.sh start` exports it) the PostgreSQL store is
measured too, with two more columns from the same run: the *floor*, the same rows (the ledger
entry and events; the new message texts, the snapshot row, the closed entry and its event)
inserted by the bare driver in one autocommit statement per write, timed cycle by cycle beside
the store's; and the statements the store sent per cycle (each one round trip), counted on the
connections of its pool at every cycle. It runs twice: over a caller's asyncpg pool (whose
connections count the statements), then with `dsn=`, the pool the store owns, which keeps a
connection between operations instead of a pool round trip each time. Over the caller's pool the
floor is timed a second time through that same pool (an acquire and a release per write, as any
statement sent through it pays), so what asyncpg's pool costs shows apart from what the store does.
The two run in turn for `--rounds` rounds (3 by default), and each ratio is given as its median
over the rounds with its range: one run on this machine swings by a fifth either way.

    uv run python bench/store_scaling.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage

import pg_bench  # PostgreSQL helpers, from this directory
from pydantic_ai_steps._json import compact_json
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
from pydantic_ai_steps.store.codec import effect_dict, event_dict
from pydantic_ai_steps.store.history import message_to_json
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

STEPS = 400


class Measured:
    """Per-cycle figures beside the times: the floor's time and the statements sent."""

    def __init__(self) -> None:
        self.floor: list[float] = []
        self.pooled_floor: list[float] = []
        """The floor's writes through the store's own pool (an acquire and a release per write)."""
        self.statements: list[int] = []


async def cycle_times(
    store: RecordBatchStore,
    history: list[ModelMessage],
    floor: Any = None,
    counter: list[int] | None = None,
    measured: Measured | None = None,
    pooled_floor: Any = None,
) -> list[float]:
    """Seconds per tool cycle, for every cycle of the recorded history (and the floors', if given)."""
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
        sent = counter[0] if counter is not None else 0
        start = time.perf_counter()
        await store.write_records(tool_effects=[started], events=events)
        await store.write_records(snapshot=snapshot, tool_effects=[closed], events=[done])
        times.append(time.perf_counter() - start)
        if measured is not None and counter is not None:
            measured.statements.append(counter[0] - sent)
        if floor is not None and measured is not None:
            first = [('effect', compact_json(effect_dict(started)))] + [
                ('event', compact_json(event_dict(event))) for event in events
            ]
            new = history[2 * step + 1 : 2 * step + 3] if step else history[:3]
            second = [('message', message_to_json(message)) for message in new] + [
                (
                    'snapshot',
                    compact_json({'run_id': 'r', 'step_index': step + 1, 'message_count': len(snapshot.messages)}),
                ),
                ('effect', compact_json(effect_dict(closed))),
                ('event', compact_json(event_dict(done))),
            ]
            start = time.perf_counter()
            await floor.write('r', first)
            await floor.write('r', second)
            measured.floor.append(time.perf_counter() - start)
            if pooled_floor is not None:
                start = time.perf_counter()
                await pooled_floor.write('r', first)
                await pooled_floor.write('r', second)
                measured.pooled_floor.append(time.perf_counter() - start)
    return times


async def main(rounds: int) -> None:
    result = await make_agent(STEPS, []).run('go', usage_limits=UNLIMITED)
    history = result.all_messages()
    stores: dict[str, Callable[[Path], Any]] = {
        'memory': lambda root: InMemoryStepStore(),
        'file': lambda root: FileStepStore(root / 'runs'),
        'sqlite': lambda root: SqliteStepStore(database=root / 'runs.db'),
    }
    print(f'store cost per tool cycle (two writes), {STEPS}-step history, outside any agent')
    print(f'{"store":8} {"steps 90-110":>13} {"last 20":>9} {"last / 100":>11}')
    rows: list[str] = []
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
    url = pg_bench.dsn()
    if url is not None:
        rows.append(await postgres_rows(url, history, rounds))
        for row in rows:
            print(row)


@dataclass
class Attempt:
    """One timed run of the PostgreSQL store and its floors: medians near step 100 and over the last 20 cycles."""

    store: tuple[float, float]
    floor: tuple[float, float]
    pooled_floor: tuple[float, float] | None
    statements: tuple[int, int]


def _early_late(times: list[float]) -> tuple[float, float]:
    return statistics.median(times[89:110]), statistics.median(times[-20:])


async def postgres_attempt(url: str, history: list[ModelMessage], mode: str) -> Attempt:
    """The PostgreSQL store beside its floor, cycle by cycle, over a caller's asyncpg pool whose
    connections count the statements sent (`mode='caller pool'`) or with `dsn=` (the pool it owns,
    which keeps a connection between operations; the same backend sends the same statements)."""
    from pydantic_ai_steps.step_persistence import PostgresStepStore

    prefix = pg_bench.fresh_prefix('scaling')
    pool = pg_bench.LazyPool(url, counting=True, store_pool=True)
    store = PostgresStepStore(pool, table=prefix) if mode == 'caller pool' else PostgresStepStore(dsn=url, table=prefix)
    floor = pg_bench.Floor(url, prefix)
    await floor.open()
    pooled = pg_bench.Floor(url, prefix, pool=pool) if mode == 'caller pool' else None
    measured = Measured()
    try:
        await store.list_runs(limit=1)  # the pool opened, the schema read
        times = await cycle_times(store, history, floor, pool.statements, measured, pooled)
    finally:
        await floor.close()
        if pooled is not None:
            await pooled.close()
        await store.aclose()
        await pool.close()
        await pg_bench.drop_prefix(url, prefix)
    counted = measured.statements if mode == 'caller pool' else [0]
    return Attempt(
        _early_late(times),
        _early_late(measured.floor),
        _early_late(measured.pooled_floor) if measured.pooled_floor else None,
        (min(counted), max(counted)),
    )


async def postgres_rows(url: str, history: list[ModelMessage], rounds: int) -> str:
    """`rounds` rounds, each timing the store over a caller's pool then with `dsn=`, beside their
    floors; one line per attempt, then the median of each ratio over the rounds (one run of this
    machine swings by a fifth either way, which a single ratio would carry whole)."""
    await postgres_attempt(url, history, 'dsn=')  # warm-up: imports, the server's caches
    lines = [f'postgres, {rounds} round(s): us per cycle near step 100 / over the last 20 cycles']
    ratios: dict[str, list[float]] = {}
    cycles: dict[str, list[float]] = {}
    for number in range(1, rounds + 1):
        for mode in ('caller pool', 'dsn='):
            found = await postgres_attempt(url, history, mode)
            (early, late), (floor_early, floor_late) = found.store, found.floor
            for name, value in (
                (f'{mode}: store', early),
                (f'{mode}: store, last 20', late),
                (f'{mode}: floor', floor_early),
                (f'{mode}: floor, last 20', floor_late),
            ):
                cycles.setdefault(name, []).append(value)
            line = (
                f'  round {number} {mode:11} store {early * 1e6:5.0f} / {late * 1e6:5.0f}, '
                f'floor {floor_early * 1e6:5.0f} / {floor_late * 1e6:5.0f}'
            )
            for name, value in (
                (f'{mode}: store / floor near step 100', early / floor_early),
                (f'{mode}: store / floor over the last 20', late / floor_late),
                (f'{mode}: store, last 20 / step 100', late / early),
                (f'{mode}: floor, last 20 / step 100', floor_late / floor_early),
            ):
                ratios.setdefault(name, []).append(value)
            if found.pooled_floor is not None:
                pooled_early, pooled_late = found.pooled_floor
                line += f', floor through the same pool {pooled_early * 1e6:5.0f} / {pooled_late * 1e6:5.0f}'
                ratios.setdefault(f'{mode}: store / floor through the same pool near step 100', []).append(
                    early / pooled_early
                )
                ratios.setdefault(f'{mode}: store / floor through the same pool over the last 20', []).append(
                    late / pooled_late
                )
                low, high = found.statements
                line += f'; statements per cycle: {low if low == high else f"{low}-{high}"} at every cycle'
            lines.append(line)
    lines.append('  median over the rounds (min-max), us per cycle:')
    for name, values in cycles.items():
        low, middle, high = (value * 1e6 for value in (min(values), statistics.median(values), max(values)))
        lines.append(f'    {name}: {middle:.0f} us ({low:.0f}-{high:.0f})')
    lines.append('  median over the rounds (min-max), ratios:')
    for name, values in ratios.items():
        lines.append(f'    {name}: {statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})')
    return '\n'.join(lines)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description="A store's own cost per tool cycle near step 100 and step 400.")
    parser.add_argument('--rounds', type=int, default=3, help='PostgreSQL rounds (each: caller pool, then dsn=)')
    asyncio.run(main(parser.parse_args().rounds))
