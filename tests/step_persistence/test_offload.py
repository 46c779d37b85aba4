"""The worker-thread hand-off the File and SQLite stores use for blocking I/O."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.step_persistence import FileStepStore, RunRecord, SqliteStepStore, StepEvent
from pydantic_ai_steps.step_persistence.stores._offload import run_blocking
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
