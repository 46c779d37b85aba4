"""Two processes sharing one PostgreSQL store: concurrent runs, and concurrent writers of one run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from pydantic_ai_steps.step_persistence import RunRecord, open_step_store
from pydantic_ai_steps.testing.step_store import dump

from .same_run_child import history

pytestmark = [pytest.mark.server, pytest.mark.slow]

CHILDREN = Path(__file__).parent.parent / 'step_persistence'


def start_together(commands: list[list[str]], names: list[str], out: Path) -> None:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    processes = [subprocess.Popen(command, env=env) for command in commands]
    deadline = time.monotonic() + 60
    while not all((out / f'{name}.ready').exists() for name in names):
        assert time.monotonic() < deadline, 'children did not start'
        assert all(process.poll() is None for process in processes), 'a child exited early'
        time.sleep(0.01)
    (out / 'go').touch()
    for process in processes:
        assert process.wait(timeout=120) == 0


def test_two_processes_with_concurrent_runs_lose_and_duplicate_nothing(dsn: str, prefix: str, tmp_path: Path) -> None:
    runs, steps = 5, 8
    url = f'{dsn}?table={prefix}'
    child = str(CHILDREN / 'concurrent_child.py')
    start_together(
        [
            [sys.executable, child, 'postgres', url, name, str(runs), str(steps), str(tmp_path)]
            for name in ('alpha', 'beta')
        ],
        ['alpha', 'beta'],
        tmp_path,
    )

    async def check() -> None:
        store = open_step_store(url)
        try:
            for name in ('alpha', 'beta'):
                listed = await store.list_runs(conversation_id=name)
                assert sorted(r.run_id for r in listed) == sorted(f'{name}-{n}' for n in range(runs))
                assert {r.status for r in listed} == {'completed'}
                for n in range(runs):
                    run_id = f'{name}-{n}'
                    events = await store.list_events(run_id=run_id)
                    kinds = [event.kind for event in events]
                    assert kinds[0] == 'run_started' and kinds[-1] == 'run_completed'
                    assert kinds.count('tool_call_completed') == steps
                    assert len(events) == 2 + 2 * (steps + 1) + 2 * steps, kinds
                    keys = [event.idempotency_key for event in events]
                    assert len(set(keys)) == len(keys)
                    assert await store.list_unresolved_tool_effects(run_id=run_id) == []
                    snapshots = await store.list_snapshots(run_id=run_id)  # type: ignore[attr-defined]
                    assert len({s.seq for s in snapshots}) == len(snapshots) == steps + 2  # input, boundaries, end
                    final = ModelMessagesTypeAdapter.validate_json((tmp_path / f'{run_id}.json').read_bytes())
                    assert dump(snapshots[-1].messages) == dump(final)
        finally:
            await store.aclose()

    anyio.run(check)


def test_two_processes_writing_one_run_store_every_history_exactly(dsn: str, prefix: str, tmp_path: Path) -> None:
    """Each writer's view of the run's log goes stale at almost every save: the stale path, across processes."""
    saves = 25
    url = f'{dsn}?table={prefix}'

    async def register() -> None:
        store = open_step_store(url)
        await store.register_run(RunRecord(run_id='shared'))
        await store.aclose()

    anyio.run(register)
    child = str(Path(__file__).with_name('same_run_child.py'))
    start_together(
        [[sys.executable, child, url, 'shared', name, str(saves), str(tmp_path)] for name in ('left', 'right')],
        ['left', 'right'],
        tmp_path,
    )

    async def check() -> None:
        store = open_step_store(url)
        try:
            snapshots = await store.list_snapshots(run_id='shared')  # type: ignore[attr-defined]
            assert len(snapshots) == 2 * saves
            keys = [s.idempotency_key for s in snapshots]
            assert len(set(keys)) == len(keys)
            for item in snapshots:
                writer, n = item.idempotency_key.split(':')
                assert dump(item.messages) == dump(history(writer, int(n)))
            events = await store.list_events(run_id='shared')
            assert sorted(e.idempotency_key for e in events) == sorted(keys)
        finally:
            await store.aclose()

    anyio.run(check)
