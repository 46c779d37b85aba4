"""What media garbage collection costs the Disk and SQLite media stores.

1. A repeat `put` of bytes already stored: it now refreshes the blob's "last put" time (Disk: an
   `os.utime` of the file; SQLite: an `UPDATE` of its `stored_at` column and a commit) where it
   used to only look the blob up. Timed per call, with the refresh and with the lookup it
   replaced (the old behaviour, patched in), on the same store; the difference is the refresh.
   A whole put is dominated by hashing and the hop to a worker thread, so the refresh step is
   also timed alone, called directly: the new step against the lookup it replaced.
2. `list_blobs()` over a store of `--blobs` blobs (10,000 by default): the whole listing.
3. `delete()` of every one of them with a cutoff, one by one (what `collect_garbage` does).

Each row is the median of `--runs` runs. Run with `uv run python bench/media_gc.py [--blobs 10000] [--runs 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.to_thread

from pydantic_ai_steps.media import DiskMediaStore, MediaContext, SqliteMediaStore
from pydantic_ai_steps.media.stores import disk
from pydantic_ai_steps.media.stores import sqlite as sqlite_media

Store = DiskMediaStore | SqliteMediaStore


@contextmanager
def without_refresh(store: Store) -> Generator[None]:
    """The old repeat put: look the blob up, write nothing."""
    if isinstance(store, DiskMediaStore):
        refresh = disk.refresh

        def look_up(blob: Path, size: int) -> bool:
            return blob.is_file()

        disk.refresh = look_up
        try:
            yield
        finally:
            disk.refresh = refresh
        return
    store._refresh_sync = lambda conn, digest, now: store._exists_sync(conn, digest, sqlite_media.COLUMNS)  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        del store._refresh_sync  # pyright: ignore[reportPrivateUsage, reportAttributeAccessIssue]


async def repeat_put_us(store: Store, data: bytes, calls: int) -> float:
    await store.put(data)
    start = time.perf_counter()
    for _ in range(calls):
        await store.put(data)
    return (time.perf_counter() - start) / calls * 1e6


def step_us(store: Store, uri: str, calls: int, refresh: bool) -> float:
    """The repeat put's own step for a stored blob, called directly: the refresh, or the old lookup."""
    if isinstance(store, DiskMediaStore):
        path = store._path(uri, MediaContext())  # pyright: ignore[reportPrivateUsage]
        size = path.stat().st_size
        step: Callable[[], object] = (lambda: disk.refresh(path, size)) if refresh else path.is_file
    else:
        conn = store._conn()  # pyright: ignore[reportPrivateUsage]
        digest = uri[-64:]
        if refresh:
            step = lambda: store._refresh_sync(conn, digest, time.time())  # pyright: ignore[reportPrivateUsage]  # noqa: E731
        else:
            step = lambda: store._exists_sync(conn, digest, sqlite_media.COLUMNS)  # pyright: ignore[reportPrivateUsage]  # noqa: E731
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls * 1e6


async def fill(store: Store, count: int) -> None:
    for index in range(count):
        await store.put(f'blob {index:08d} '.encode() * 4)


async def list_seconds(store: Store) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    async for _ in store.list_blobs():
        count += 1
    return time.perf_counter() - start, count


async def delete_seconds(store: Store) -> float:
    cutoff = datetime.now(UTC) + timedelta(seconds=1)
    uris = [blob.uri async for blob in store.list_blobs()]
    start = time.perf_counter()
    for uri in uris:
        assert await store.delete(uri, stored_before=cutoff)
    return time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--blobs', type=int, default=10_000, help='blobs to list and delete (default 10000)')
    parser.add_argument('--runs', type=int, default=5, help='runs per row; medians are shown (default 5)')
    parser.add_argument('--calls', type=int, default=2000, help='repeat puts timed per run (default 2000)')
    args = parser.parse_args()
    kinds: list[tuple[str, Callable[[Path], Store]]] = [
        ('Disk', lambda root: DiskMediaStore(root / 'media')),
        ('Disk durable', lambda root: DiskMediaStore(root / 'media', durable=True)),
        ('SQLite', lambda root: SqliteMediaStore(database=root / 'media.db')),
        ('SQLite durable', lambda root: SqliteMediaStore(database=root / 'media.db', durable=True)),
    ]
    payload = bytes(range(256)) * 256  # 64 KiB, the step stores' default threshold

    print(f'repeat put of a 64 KiB blob, microseconds per call (median of {args.runs} runs of {args.calls})')
    print(f'{"store":<16} {"refresh":>9} {"lookup only":>12} {"refresh costs":>14}')
    for name, make in kinds:
        refreshing: list[float] = []
        looking: list[float] = []
        with tempfile.TemporaryDirectory(prefix='media-gc-bench-') as directory:
            store = make(Path(directory))
            for _ in range(args.runs):
                refreshing.append(await repeat_put_us(store, payload, args.calls))
                with without_refresh(store):
                    looking.append(await repeat_put_us(store, payload, args.calls))
            if isinstance(store, SqliteMediaStore):
                await store.aclose()
        new, old = statistics.median(refreshing), statistics.median(looking)
        print(f'{name:<16} {new:>9.1f} {old:>12.1f} {new - old:>14.1f}')

    print(f'\nthe step alone, called directly, microseconds per call (median of {args.runs} runs of {args.calls})')
    print(f'{"store":<16} {"refresh":>9} {"lookup only":>12} {"refresh costs":>14}')
    for name, make in kinds:
        refreshing: list[float] = []
        looking: list[float] = []
        with tempfile.TemporaryDirectory(prefix='media-gc-bench-') as directory:
            store = make(Path(directory))
            uri = await store.put(payload)
            for _ in range(args.runs):
                refreshing.append(await anyio.to_thread.run_sync(step_us, store, uri, args.calls, True))
                looking.append(await anyio.to_thread.run_sync(step_us, store, uri, args.calls, False))
            if isinstance(store, SqliteMediaStore):
                await store.aclose()
        new, old = statistics.median(refreshing), statistics.median(looking)
        print(f'{name:<16} {new:>9.1f} {old:>12.1f} {new - old:>14.1f}')

    print(f'\n{args.blobs:,} blobs: list_blobs() whole, then delete(stored_before=) of each (median of {args.runs})')
    print(f'{"store":<16} {"list s":>8} {"blobs/s":>10} {"delete all s":>13} {"per delete us":>14}')
    for name, make in kinds[::2]:
        listing: list[float] = []
        deleting: list[float] = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix='media-gc-bench-') as directory:
                store = make(Path(directory))
                await fill(store, args.blobs)
                seconds, count = await list_seconds(store)
                assert count == args.blobs, count
                listing.append(seconds)
                deleting.append(await delete_seconds(store))
                if isinstance(store, SqliteMediaStore):
                    await store.aclose()
        listed, deleted = statistics.median(listing), statistics.median(deleting)
        print(
            f'{name:<16} {listed:>8.3f} {args.blobs / listed:>10,.0f} {deleted:>13.3f} '
            f'{deleted / args.blobs * 1e6:>14.1f}'
        )


if __name__ == '__main__':
    anyio.run(main)
