"""Retention on SQLite: disk that comes back after `prune`, exact media garbage collection, and a prune
whose time follows the runs it removes, not the store's size.

1. Fill a store with 2,000 runs, each a few tool cycles and one image of a pool (half the images
   are unique to their run, half shared by several runs, old and new or old only), half of the runs
   closed 40 days ago.
   `prune(older_than=30 days)` then removes those 1,000; `collect_garbage(grace=0, writers_stopped=True)` removes the
   blobs only they referenced. Prints the files' size before and after, and checks that exactly
   the unreferenced blobs went.
2. Prune 10,000 old runs out of a store of 10,000 runs and out of one of 40,000, timed.
3. The WAL while a store writes flat out, and the cost per write of keeping it bounded.

    uv run python bench/retention.py [--runs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, UserPromptPart

from pydantic_ai_steps._records import utc_now
from pydantic_ai_steps.media import media_uri_for
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    SqliteStepStore,
    StepEvent,
    ToolEffectRecord,
)
from pydantic_ai_steps.store.backends.sqlite import _connection as sqlite_connection  # pyright: ignore[reportPrivateUsage]
from pydantic_ai_steps.testing._support import tool_cycle

IMAGE_BYTES = 100 * 1024


def files_size(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.iterdir() if not path.name.endswith('-shm'))


def image(seed: int) -> BinaryContent:
    return BinaryContent(random.Random(seed).randbytes(IMAGE_BYTES), media_type='image/png')


async def write_run(store: SqliteStepStore, run_id: str, picture: BinaryContent | None, *, age_days: int) -> None:
    """A run of three tool cycles (2 KB results), closed `age_days` ago."""
    when = utc_now() - timedelta(days=age_days)
    prompt: list[str | BinaryContent] = ['look at this', *([picture] if picture is not None else [])]
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(prompt, timestamp=when)], timestamp=when)]
    await store.write_records(
        run=RunRecord(run_id=run_id, started_at=when),
        events=[StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=when)],
    )
    for step in range(1, 4):
        history = [*history, *tool_cycle(f'c{step}', 'q' * 2000)[1:]]
        await store.write_records(
            snapshot=ContinuableSnapshot(run_id=run_id, step_index=step, messages=list(history), timestamp=when),
            tool_effects=[
                ToolEffectRecord(
                    tool_call_id=f'c{step}', tool_name='lookup', run_id=run_id, status='completed', started_at=when
                )
            ],
        )
    await store.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=3, timestamp=when))


async def disk_and_garbage(runs: int, root: Path) -> None:
    store = SqliteStepStore(database=root / 'steps.db')
    shared = [image(seed) for seed in range(50)]
    kept_by: dict[int, set[bool]] = {}
    """Image seed -> whether each run referencing it is old: it must go exactly when all are."""
    for index in range(runs):
        old = index % 2 == 0
        if index % 4 < 2:  # a unique image: it goes when its run goes
            seed = 10_000 + index
            picture = image(seed)
        else:  # one of 50 shared images: 0-24 referenced by old and new runs, 25-49 by old runs only
            seed = (index // 4) % (50 if old else 25)
            picture = shared[seed]
        kept_by.setdefault(seed, set()).add(old)
        await write_run(store, f'run-{index}', picture, age_days=40 if old else 1)
    expected_gone = {seed for seed, ages in kept_by.items() if ages == {True}}
    await store.aclose()
    before = files_size(root)
    store = SqliteStepStore(database=root / 'steps.db')
    start = time.perf_counter()
    pruned = await store.prune(older_than=timedelta(days=30))
    prune_seconds = time.perf_counter() - start
    after_prune = files_size(root)
    start = time.perf_counter()
    garbage = await store.collect_garbage(grace=timedelta(0), writers_stopped=True)
    gc_seconds = time.perf_counter() - start
    await store.aclose()
    after_gc = files_size(root)
    wanted = {media_uri_for(random.Random(seed).randbytes(IMAGE_BYTES)) for seed in expected_gone}
    exact = set(garbage.blobs) == wanted
    print(f'## Disk and garbage ({runs:,} runs, half of them 40 days old; images of {IMAGE_BYTES // 1024} KiB)\n')
    print('| | bytes on disk | vs before |')
    print('|---|---|---|')
    print(f'| before | {before:,} | 1.00x |')
    removed = f'{len(pruned.run_ids):,} runs, {prune_seconds:.2f} s'
    print(f'| after prune({removed}) | {after_prune:,} | {after_prune / before:.2f}x |')
    print(
        f'| after collect_garbage({len(garbage.blobs):,} blobs, {garbage.bytes:,} bytes, {gc_seconds:.2f} s) '
        f'| {after_gc:,} | {after_gc / before:.2f}x |'
    )
    counts = f'{len(wanted):,} expected, {len(garbage.blobs):,} removed'
    print(f'\nremoved exactly the unreferenced blobs: {exact} ({counts})\n')


async def prune_timing(total: int, old: int, root: Path) -> float:
    """Seconds to prune `old` old runs out of a store of `total` runs (no media, one event each)."""
    store = SqliteStepStore(database=root / f'prune-{total}.db', media_store=None)
    now = utc_now()
    for index in range(total):
        when = now - timedelta(days=40 if index < old else 1)
        await store.write_records(
            run=RunRecord(run_id=f'r{index}', started_at=when),
            events=[StepEvent(run_id=f'r{index}', kind='run_completed', step_index=0, timestamp=when)],
        )
    start = time.perf_counter()
    pruned = await store.prune(older_than=timedelta(days=30))
    seconds = time.perf_counter() - start
    assert len(pruned.run_ids) == old
    await store.aclose()
    return seconds


async def wal_bound(root: Path) -> None:
    """The WAL while writing flat out: its largest size and the time per write, with two limits."""
    print('## The write-ahead log while a store writes flat out (1,000 boundary writes of 4 KB)\n')
    print('| WAL limit | largest WAL | median write | p99 write |')
    print('|---|---|---|---|')
    for limit in (64 << 20, 4 << 20):
        sqlite_connection.WAL_LIMIT_BYTES = limit
        directory = root / f'wal-{limit}'
        directory.mkdir()
        store = SqliteStepStore(database=directory / 'steps.db', media_store=None)
        await store.register_run(RunRecord(run_id='r'))
        largest, times = 0, list[float]()
        history: list[ModelMessage] = []
        for step in range(1000):
            history = [*history, *tool_cycle(f'c{step}', 'x' * 2000)]
            snapshot = ContinuableSnapshot(run_id='r', step_index=step, messages=list(history))
            start = time.perf_counter()
            await store.save_snapshot(snapshot)
            times.append(time.perf_counter() - start)
            wal = directory / 'steps.db-wal'
            largest = max(largest, wal.stat().st_size if wal.exists() else 0)
        await store.aclose()
        times.sort()
        print(
            f'| {limit >> 20} MiB | {largest / 2**20:.1f} MiB | {statistics.median(times) * 1e6:.0f} us '
            f'| {times[int(len(times) * 0.99)] * 1e6:.0f} us |'
        )
    print()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--runs', type=int, default=2000)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix='steps-retention-'))
    try:
        await disk_and_garbage(options.runs, root)
        small = await prune_timing(10_000, 10_000, root)
        large = await prune_timing(40_000, 10_000, root)
        print('## prune() of 10,000 old runs\n')
        print('| store size | prune time |')
        print('|---|---|')
        print(f'| 10,000 runs | {small:.2f} s |')
        print(f'| 40,000 runs | {large:.2f} s ({large / small:.2f}x) |\n')
        await wal_bound(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    asyncio.run(main())
