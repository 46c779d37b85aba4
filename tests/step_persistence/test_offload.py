"""The worker-thread hand-off the File and SQLite stores use for blocking I/O."""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from pydantic_ai_steps import _sqlite as shared_sqlite
from pydantic_ai_steps.step_persistence import FileStepStore, RunRecord, SqliteStepStore, StepEvent, ToolEffectRecord
from pydantic_ai_steps.store.backends import _offload as offload_module
from pydantic_ai_steps.store.backends._offload import held, run_blocking, run_soon
from pydantic_ai_steps.store.backends.file import _backend as file_module
from pydantic_ai_steps.store.backends.sqlite import _connection as sqlite_module
from pydantic_ai_steps.testing.step_store import dump, tool_cycle
from pydantic_ai_steps.testing.step_store import snapshot as make_snapshot


@pytest.mark.anyio
async def test_runs_off_the_event_loop_thread_and_returns_or_raises() -> None:
    loop_thread = threading.get_ident()
    assert await run_blocking(threading.get_ident) != loop_thread
    assert await run_blocking(lambda a, b: a + b, 2, 3) == 5

    def boom() -> None:
        raise KeyError('from the worker')

    with pytest.raises(KeyError, match='from the worker'):
        await run_blocking(boom)


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_for_the_call_to_finish() -> None:
    """As with `anyio.to_thread.run_sync`: no write is still running once the caller is cancelled."""
    started, release = threading.Event(), threading.Event()
    order: list[str] = []
    scopes: list[anyio.CancelScope] = []

    def slow_write() -> None:
        started.set()
        release.wait(5)
        order.append('write finished')

    async def caller() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await run_blocking(slow_write)
        order.append('caller cancelled' if scope.cancelled_caught else 'caller returned')

    async with anyio.create_task_group() as group:
        group.start_soon(caller)
        await anyio.to_thread.run_sync(started.wait, 5)
        scopes[0].cancel()
        await anyio.sleep(0.05)
        assert order == []  # cancelled, yet still waiting for its write
        release.set()
    assert order == ['write finished', 'caller cancelled']


@pytest.mark.parametrize('kind', ['file', 'sqlite'])
def test_stores_work_under_trio(kind: str, tmp_path: Path) -> None:
    """Without asyncio the stores fall back to anyio's own worker threads."""

    async def use_store() -> None:
        store = FileStepStore(tmp_path / 'steps') if kind == 'file' else SqliteStepStore(database=tmp_path / 's.db')
        await store.register_run(RunRecord(run_id='r'))
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        await store.save_snapshot(make_snapshot('r', tool_cycle()))
        latest = await store.latest_snapshot(run_id='r')
        assert latest is not None and dump(latest.messages) == dump(tool_cycle())
        assert len(await store.list_events(run_id='r')) == 1

    anyio.run(use_store, backend='trio')


# --- calls tried on the event loop -------------------------------------------------------------


@pytest.mark.anyio
async def test_run_soon_runs_here_unless_the_call_would_wait() -> None:
    loop_thread = threading.get_ident()
    assert await run_soon(threading.get_ident) == loop_thread

    lock = threading.Lock()
    attempts: list[int] = []

    def guarded() -> int:
        attempts.append(threading.get_ident())
        with held(lock):
            return threading.get_ident()

    lock.acquire()
    try:
        task_result: list[int] = []

        async def call() -> None:
            task_result.append(await run_soon(guarded))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await anyio.sleep(0.05)
            assert task_result == []  # waiting on a worker; the loop is free to run this
            lock.release()
    finally:
        if lock.locked():
            lock.release()
    assert attempts[0] == loop_thread  # tried here first, gave up at the lock
    assert task_result[0] != loop_thread  # and finished on a worker


@pytest.mark.anyio
async def test_sqlite_store_waits_for_another_writer_off_the_loop(tmp_path: Path) -> None:
    """A write lock held by another connection sends the call to a worker; the loop keeps running."""
    store = SqliteStepStore(database=tmp_path / 's.db')
    await store.register_run(RunRecord(run_id='r'))
    other = sqlite3.connect(tmp_path / 's.db', isolation_level=None)
    other.execute('BEGIN IMMEDIATE')
    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0.01)

    async def write() -> None:
        await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        group.start_soon(write)
        await anyio.sleep(0.2)
        assert not done.is_set() and ticks >= 5, ticks
        other.execute('COMMIT')
    other.close()
    assert [event.kind for event in await store.list_events(run_id='r')] == ['run_started']
    store.close()


@pytest.mark.anyio
async def test_file_store_waits_for_another_writers_flock_off_the_loop(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'steps')
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    holder = os.open(tmp_path / 'steps' / 'r' / 'events.jsonl', os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as another process appending would
    done = anyio.Event()

    async def write() -> None:
        await store.append_event(StepEvent(run_id='r', kind='run_completed', step_index=1))
        done.set()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(write)
            await anyio.sleep(0.2)
            assert not done.is_set()  # waiting on a worker, while this coroutine ran
            fcntl.flock(holder, fcntl.LOCK_UN)
    finally:
        os.close(holder)
    assert [event.kind for event in await store.list_events(run_id='r')] == ['run_started', 'run_completed']


@pytest.mark.anyio
async def test_sqlite_store_checkpoints_its_wal_on_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's checkpoints (inside a commit) are off on the store's connection; the store's bound the WAL."""
    monkeypatch.setattr(sqlite_module, 'WAL_LIMIT_BYTES', 4 << 20)
    store = SqliteStepStore(database=tmp_path / 's.db')
    await store.register_run(RunRecord(run_id='r'))
    checkpoints: list[str] = []
    real_checkpoint = shared_sqlite.checkpoint_caught_up

    def checkpoint(connection: sqlite3.Connection) -> None:
        checkpoints.append(threading.current_thread().name)
        real_checkpoint(connection)

    monkeypatch.setattr(shared_sqlite, 'checkpoint_caught_up', checkpoint)
    wal = tmp_path / 's.db-wal'
    largest = 0
    for index in range(2000):  # writing flat out
        await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=index))
        largest = max(largest, wal.stat().st_size)
    assert checkpoints and set(checkpoints) == {'pydantic-ai-steps-checkpoint'}  # never on the writer's path
    # Without checkpoints the WAL grows ~3 pages a commit (24 MB here); it stays near the limit.
    assert 0 < largest < 8 * 1024 * 1024
    assert len(await store.list_events(run_id='r')) == 2000
    store.close()


@pytest.mark.anyio
async def test_a_durable_file_store_never_writes_on_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable File store flushes several files a call: never on the event loop."""
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    real_fsync = os.fsync

    def spying_fsync(fd: int) -> None:
        threads.add(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', spying_fsync)
    store = FileStepStore(tmp_path / 'steps', durable=True)
    calls_here: list[str] = []
    real_soon = offload_module.run_soon

    async def watching(function: Any, *args: Any, inline: bool = True) -> Any:
        if inline:
            calls_here.append(getattr(function, '__name__', '?'))
        return await real_soon(function, *args, inline=inline)

    monkeypatch.setattr(file_module, 'run_soon', watching)
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    await store.save_snapshot(make_snapshot('r', tool_cycle()))
    await store.record_tool_effect(ToolEffectRecord(tool_call_id='c', tool_name='t', run_id='r', status='started'))
    assert calls_here == []
    assert loop_thread not in threads


@pytest.mark.anyio
async def test_a_durable_sqlite_store_commits_on_the_loop_only_while_its_commits_are_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-off to a worker costs a run about what a fast fsync'd commit does; a slow disk moves
    the commits to a worker, so it never holds the loop up for long, and fast ones bring them back."""
    loop_thread = threading.get_ident()
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None, durable=True)
    monkeypatch.setattr(offload_module.FlushTimer, 'LIMIT', 10.0)  # every commit is fast, the first one too
    await store.register_run(RunRecord(run_id='r'))  # opens the connection, on a worker
    conn: sqlite3.Connection = store.backend._connection  # type: ignore[attr-defined]  # pyright: ignore
    commits: list[int] = []
    conn.set_trace_callback(lambda text: commits.append(threading.get_ident()) if text == 'COMMIT' else None)

    async def commit_threads(steps: range) -> list[bool]:
        commits.clear()
        for step in steps:
            await store.save_snapshot(make_snapshot('r', tool_cycle(prompt=f'p{step}'), step_index=step))
        return [thread == loop_thread for thread in commits]

    assert await commit_threads(range(1, 4)) == [True, True, True]
    monkeypatch.setattr(offload_module.FlushTimer, 'LIMIT', 0.0)  # every commit is slow
    assert await commit_threads(range(4, 7)) == [False, False, False]  # the ones measured were slow
    assert conn.execute('PRAGMA busy_timeout').fetchone()[0] == 30_000  # a worker's call waits for the lock
    monkeypatch.setattr(offload_module.FlushTimer, 'LIMIT', 10.0)
    # The first call back finds the worker's busy timeout on the connection: it resets it, on a worker.
    assert await commit_threads(range(7, 10)) == [False, True, True]
    assert conn.execute('PRAGMA busy_timeout').fetchone()[0] == 0  # a call on the loop must not wait
    latest = await SqliteStepStore(database=tmp_path / 's.db').latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(tool_cycle(prompt='p9'))
    store.close()


@pytest.mark.anyio
async def test_a_wal_past_its_limit_is_truncated_without_waiting_for_a_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader in another process that reads again and again can keep the WAL in use for as long
    as it runs; the write that found the WAL too long must not wait for it (it would for the whole
    busy timeout, holding every run of the store up)."""
    monkeypatch.setattr(sqlite_module, 'WAL_LIMIT_BYTES', 0)  # every checkpoint check finds the WAL too long
    monkeypatch.setattr(sqlite_module, '_BUSY_TIMEOUT_MS', 8_000)
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    backend: Any = store.backend
    written = 0
    while not backend._wal_too_long:  # the next write truncates
        assert written < 2 * sqlite_module._CHECKPOINT_EVERY  # pyright: ignore[reportPrivateUsage]
        await store.append_event(StepEvent(run_id='r', kind='model_request_started', step_index=written))
        written += 1
    with closing(sqlite3.connect(tmp_path / 's.db', isolation_level=None)) as reader:
        reader.execute('BEGIN')
        assert reader.execute('SELECT count(*) FROM events').fetchone()[0] == written
        start = time.monotonic()
        await store.append_event(StepEvent(run_id='r', kind='run_completed', step_index=99))
        waited = time.monotonic() - start
        reader.execute('COMMIT')
    assert waited < 4, f'the write waited {waited:.1f} s for the reader'
    assert not backend._wal_too_long  # tried, and given up on until the next check
    assert len(await store.list_events(run_id='r')) == written + 1
    store.close()


@pytest.mark.anyio
async def test_a_wal_a_reader_keeps_growing_is_warned_about_once_per_doubling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing a store does shortens a WAL while a reader holds it: past the warning size the store says
    so, again only when the WAL has doubled since, and starts counting over once it is back under the bound."""
    monkeypatch.setattr(sqlite_module, 'WAL_LIMIT_BYTES', 1 << 20)
    monkeypatch.setattr(sqlite_module, 'WAL_WARNING_BYTES', 3 << 20)
    store = SqliteStepStore(database=tmp_path / 's.db', media_store=None)
    await store.register_run(RunRecord(run_id='r'))
    backend: Any = store.backend
    wal = tmp_path / 's.db-wal'
    written = 0

    async def write_until(done: Callable[[], bool], note: str) -> None:
        nonlocal written
        while not done():
            assert written < 20_000
            event = StepEvent(run_id='r', kind='model_request_started', step_index=written, metadata={'note': note})
            await store.append_event(event)
            written += 1

    caplog.set_level(logging.WARNING, logger='pydantic_ai_steps.sqlite_store')
    with closing(sqlite3.connect(tmp_path / 's.db', isolation_level=None)) as reader:
        reader.execute('BEGIN')
        assert reader.execute('SELECT count(*) FROM events').fetchone()[0] == 0
        await write_until(lambda: wal.stat().st_size > 9 << 20, 'x' * 2000)
        reader.execute('COMMIT')
    warnings = [record.getMessage() for record in caplog.records]
    assert 1 <= len(warnings) <= 2, warnings  # at 3 MiB, at 6 MiB (and at 12 MiB if a check had come that late)
    assert 'read transaction open' in warnings[0] and str(tmp_path / 's.db') in warnings[0]
    # The reader gone, the next check truncates the WAL, and one after it finds it back under the bound.
    await write_until(lambda: backend._wal_warned_at == 0, 'x')
    assert wal.stat().st_size < 1 << 20
    assert len(caplog.records) == len(warnings)
    assert len(await store.list_events(run_id='r')) == written
    store.close()
