"""File and SQLite stores under real agents: the stamping trap, from_spec, two processes at once (and MongoDB)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    FileStepStore,
    InMemoryStepStore,
    SqliteStepStore,
    StepStore,
    continue_run,
    open_step_store,
)
from pydantic_ai_steps.testing.step_store import dump

from ..conftest import require_env
from .agents import call, scripted

pytestmark = pytest.mark.anyio

STORES: dict[str, Callable[[Path], Any]] = {
    'file': lambda root: FileStepStore(root / 'steps'),
    'sqlite': lambda root: SqliteStepStore(database=root / 'steps.db'),
}


class Tee:
    """Saves every snapshot in two stores, so what they keep can be compared."""

    def __init__(self, primary: Any, witness: InMemoryStepStore) -> None:
        self.primary = primary
        self.witness = witness

    def __getattr__(self, name: str) -> Any:
        return getattr(self.primary, name)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.primary.save_snapshot(snapshot)
        await self.witness.save_snapshot(snapshot)

    async def write_records(self, *, snapshot: ContinuableSnapshot | None = None, **records: Any) -> None:
        await self.primary.write_records(snapshot=snapshot, **records)
        run = records.get('run')
        if run is not None:
            await self.witness.register_run(run)
        if snapshot is not None:
            await self.witness.save_snapshot(snapshot)


@pytest.mark.parametrize('kind', STORES)
async def test_snapshots_keep_what_the_boundary_saw_not_what_was_stamped_later(kind: str, tmp_path: Path) -> None:
    """pydantic-ai stamps the pending request (timestamp, instructions, run_id) after the boundary saved it."""
    store = STORES[kind](tmp_path)
    witness = InMemoryStepStore()
    agent = Agent(
        scripted([call('lookup', 'c1', q='a')], [call('lookup', 'c2', q='b')], 'done'),
        instructions='be brief',
        capabilities=[StepPersistence(store=Tee(store, witness), run_id='stamped')],  # type: ignore[arg-type]
    )

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'found {q}'

    await agent.run('hi', conversation_id='conv')
    saved = await STORES[kind](tmp_path).list_snapshots(run_id='stamped', include_interrupted=True)
    expected = await witness.list_snapshots(run_id='stamped', include_interrupted=True)
    assert len(saved) == len(expected) == 4  # the run's input, two boundaries, the end
    assert [dump(s.messages) for s in saved] == [dump(s.messages) for s in expected]
    # The trap was really there: the first boundary's pending request was stamped afterwards.
    first_pending, later_same = saved[1].messages[2], saved[2].messages[2]
    assert isinstance(first_pending, ModelRequest) and isinstance(later_same, ModelRequest)
    assert isinstance(first_pending.parts[0], ToolReturnPart)
    assert first_pending.timestamp is None and first_pending.instructions is None
    assert later_same.timestamp is not None and later_same.instructions == 'be brief'


@pytest.mark.parametrize('kind', STORES)
async def test_from_spec_builds_the_store(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    location = {'file': {'directory': 'spec-runs'}, 'sqlite': {'database': 'spec.db'}}[kind]
    capability = StepPersistence.from_spec(backend=kind, max_snapshots_per_run=2, agent_name='spec', **location)
    store = capability.store
    assert type(store).__name__ == {'file': 'FileStepStore', 'sqlite': 'SqliteStepStore'}[kind]
    assert store.max_snapshots_per_run == 2  # type: ignore[attr-defined]
    agent = Agent(scripted([call('lookup', 'c1', q='a')], 'done'), capabilities=[capability])

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return q

    await agent.run('hi')
    (record,) = await store.list_runs()
    assert record.agent_name == 'spec'
    history = await continue_run(store, run_id=record.run_id)
    assert len(history) == 4
    assert (tmp_path / next(iter(location.values()))).exists()


def seqs_of(kind: str, root: Path, run_id: str, location: str = '') -> list[tuple[int, int]]:
    """`(seq, step_index)` of a run's snapshots, in seq order, straight from storage."""
    if kind == 'mongodb':
        import pymongo

        url, database = location.rsplit('/', 1)
        with pymongo.MongoClient(url) as client:
            found = client[database].snapshots.find({'run_id': run_id}, sort=[('seq', 1)])
            return [(document['seq'], document['step_index']) for document in found]
    if kind == 'file':
        directory = root / 'steps' / run_id / 'snapshots'
        pairs = [(int(p.stem), json.loads(p.read_text())['step_index']) for p in directory.glob('*.json')]
        return sorted(pairs)
    with sqlite3.connect(root / 'steps.db') as conn:
        return conn.execute('SELECT seq, step_index FROM snapshots WHERE run_id = ? ORDER BY seq', (run_id,)).fetchall()


@pytest.fixture
def mongodb_location() -> Iterator[str]:
    """A fresh database on the test MongoDB server (fails under CI without one), dropped afterwards."""
    import pymongo

    url = require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL']
    name = f'concurrent_{os.getpid()}_{int(time.time() * 1000)}'
    yield f'{url}/{name}'
    with pymongo.MongoClient(url) as client:
        client.drop_database(name)


@pytest.mark.slow
@pytest.mark.parametrize('kind', [*STORES, 'mongodb'])
def test_two_processes_with_concurrent_runs_lose_and_duplicate_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    runs, steps = 5, 8
    location: Path | str = tmp_path / ('steps' if kind == 'file' else 'steps.db')
    if kind == 'mongodb':
        location = request.getfixturevalue('mongodb_location')
    child = Path(__file__).with_name('concurrent_child.py')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(child), kind, str(location), prefix, str(runs), str(steps), str(tmp_path)], env=env
        )
        for prefix in ('alpha', 'beta')
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f'{prefix}.ready').exists() for prefix in ('alpha', 'beta')):
        assert time.monotonic() < deadline, 'children did not start'
        assert all(process.poll() is None for process in processes), 'a child exited early'
        time.sleep(0.01)
    (tmp_path / 'go').touch()
    for process in processes:
        assert process.wait(timeout=120) == 0
    anyio.run(check_concurrent_runs, kind, tmp_path, runs, steps, str(location))


async def check_concurrent_runs(kind: str, tmp_path: Path, runs: int, steps: int, location: str) -> None:
    store: StepStore = open_step_store(location) if kind == 'mongodb' else STORES[kind](tmp_path)
    for prefix in ('alpha', 'beta'):
        listed = await store.list_runs(conversation_id=prefix)
        assert sorted(r.run_id for r in listed) == sorted(f'{prefix}-{n}' for n in range(runs))
        for n in range(runs):
            run_id = f'{prefix}-{n}'
            events = await store.list_events(run_id=run_id)
            kinds = [event.kind for event in events]
            assert kinds[0] == 'run_started' and kinds[-1] == 'run_completed'
            assert kinds.count('tool_call_completed') == steps
            assert kinds.count('model_request_started') == steps + 1
            assert len(events) == 2 + 2 * (steps + 1) + 2 * steps, kinds
            keys = [event.idempotency_key for event in events]
            assert len(set(keys)) == len(keys)
            assert all(event.run_id == run_id for event in events)
            assert await store.list_unresolved_tool_effects(run_id=run_id) == []
            pairs = seqs_of(kind, tmp_path, run_id, location)
            assert len({seq for seq, _ in pairs}) == len(pairs) == steps + 2  # the input, the boundaries, the end
            assert [step for _, step in pairs] == sorted(step for _, step in pairs)
            final = ModelMessagesTypeAdapter.validate_json((tmp_path / f'{run_id}.json').read_bytes())
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None and dump(latest.messages) == dump(final)
    close = getattr(store, 'close', None)
    if callable(close):
        close()
    else:
        await store.aclose()  # type: ignore[attr-defined]
