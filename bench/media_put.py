"""Throughput of `put` for one large payload, against plain `hashlib.sha256` on the same bytes.

Every `put` has to hash its payload, so hashing alone is the ceiling; the table shows how close
each store gets to it (the ratio is the median of per-run ratios, each against a hash timed just
before the put). Each store writes into a fresh temporary directory, so every put is a
real write (no dedup hit), and the SQLite put includes opening the database and creating its
table. Work a store leaves for later is not hidden: `close` column times closing the store right
after the put (for SQLite that waits for the WAL checkpoint a large put hands to a background
thread), outside the put's own time. If `pydantic_ai_harness` (the upstream package) is
importable, its two stores are measured too. Run with `uv run python bench/media_put.py [--mib 64] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from pydantic_ai_steps.media import DiskMediaStore, MediaStore, SqliteMediaStore


def time_hash(data: bytes) -> float:
    start = time.perf_counter()
    hashlib.sha256(data).digest()
    return time.perf_counter() - start


async def time_put(data: bytes, make_store: Callable[[Path], MediaStore]) -> tuple[float, float]:
    """Seconds for the put, then for closing the store (0 for a store with nothing to close)."""
    with tempfile.TemporaryDirectory(prefix='media-put-bench-') as directory:
        store = make_store(Path(directory))
        start = time.perf_counter()
        await store.put(data)
        elapsed = time.perf_counter() - start
        close: Callable[[], Awaitable[None]] | None = getattr(store, 'aclose', None)
        start = time.perf_counter()
        if close is not None:
            await close()
        closing = time.perf_counter() - start
    return elapsed, closing


def harness_stores() -> list[tuple[str, Callable[[Path], Any]]]:
    """The upstream package's Disk and SQLite media stores, if it is installed."""
    try:
        upstream = importlib.import_module('pydantic_ai_harness.media')
    except ImportError:
        return []
    return [
        ('harness Disk put', lambda root: upstream.DiskMediaStore(root / 'media')),
        ('harness SQLite put', lambda root: upstream.SqliteMediaStore(database=root / 'media.db')),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--mib', type=int, default=64, help='payload size in MiB (default 64)')
    parser.add_argument('--runs', type=int, default=3, help='runs per row; medians are shown (default 3)')
    args = parser.parse_args()
    data = os.urandom(args.mib * 1024 * 1024)
    size_mb = len(data) / 1e6
    stores: list[tuple[str, Callable[[Path], MediaStore]]] = [
        ('DiskMediaStore.put', lambda root: DiskMediaStore(root / 'media')),
        ('SqliteMediaStore.put', lambda root: SqliteMediaStore(database=root / 'media.db')),
        *harness_stores(),
    ]

    # Each run times the hash right before each put, and the ratio is taken per run, so load
    # from other processes that comes and goes skews the comparison as little as possible.
    seconds: dict[str, list[float]] = {'hashlib.sha256 (ceiling)': []}
    ratios: dict[str, list[float]] = {'hashlib.sha256 (ceiling)': []}
    closing: dict[str, list[float]] = {'hashlib.sha256 (ceiling)': []}
    for _ in range(args.runs):
        for name, make_store in stores:
            baseline = time_hash(data)
            elapsed, closed = await time_put(data, make_store)
            seconds['hashlib.sha256 (ceiling)'].append(baseline)
            ratios['hashlib.sha256 (ceiling)'].append(1.0)
            closing['hashlib.sha256 (ceiling)'].append(0.0)
            seconds.setdefault(name, []).append(elapsed)
            ratios.setdefault(name, []).append(baseline / elapsed)
            closing.setdefault(name, []).append(closed)

    print(f'payload {args.mib} MiB, median of {args.runs} runs')
    print(f'{"operation":<26} {"seconds":>8} {"MB/s":>8} {"vs sha256":>10} {"close":>7}')
    for name, timings in seconds.items():
        median = statistics.median(timings)
        ratio, close = statistics.median(ratios[name]), statistics.median(closing[name])
        print(f'{name:<26} {median:>8.3f} {size_mb / median:>8.0f} {ratio:>9.0%} {close:>7.3f}')


if __name__ == '__main__':
    anyio.run(main)
