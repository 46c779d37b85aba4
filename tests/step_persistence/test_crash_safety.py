"""SIGKILL a process in the middle of a persisted agent run, many times, and read what is left.

For each store, 50 runs (seeded; 16 on the MongoDB test server, which is slow) are killed at
random moments; all of them share one store directory or database, as runs of a real deployment
would. After each kill a fresh store opens the location and:

- no read raises (runs, events, snapshots in both modes, tool effects, recovery inspection);
- `continue_run` returns a provider-valid history, or raises `LookupError` only while no tool
  cycle had been settled yet, and the history holds every call that was settled;
- `list_unresolved_tool_effects` names every call whose body began and did not end (known from
  the child's own fsynced side channel), and nothing else except the one call whose ledger
  write may have been in flight at the kill;
- the location still takes new runs.

And once per store, a kill while a turn's model is first asked: the turn's prompt survives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolReturnPart, UserPromptPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    FileStepStore,
    RunRecord,
    SqliteStepStore,
    StepStore,
    continue_conversation,
    continue_run,
    is_provider_valid,
    open_step_store,
)
from pydantic_ai_steps.step_persistence.recovery import inspect_recovery

from ..conftest import require_env
from .agents import scripted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, 'fork'), reason='the crash harness forks a pre-imported child'),
]

KILLS = 50
KILLS_MONGODB = 16
STEPS = 12
CHILD = Path(__file__).with_name('crash_child.py')


class Zygote:
    """The pre-imported child process that forks one agent run per command."""

    def __init__(self) -> None:
        env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def start(self, command: dict[str, Any]) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + '\n')
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())['pid']

    def wait(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, 'crash child died'
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


KINDS = ['file', 'sqlite', 'postgres', 'mongodb']


def make_store(kind: str, location: Path | str) -> StepStore:
    if kind == 'file':
        return FileStepStore(location)
    if kind in ('postgres', 'mongodb'):
        return open_step_store(str(location))
    return SqliteStepStore(database=location)


def crash_location(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path | str:
    """Where the runs of one crash test live: a directory, a database file, a table prefix or a database."""
    if kind == 'mongodb':
        return request.getfixturevalue('mongodb_database')
    if kind != 'postgres':
        return tmp_path / ('steps' if kind == 'file' else 'steps.db')
    from tests.postgres.conftest import drop_prefix

    dsn = require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']
    prefix = f't_crash_{os.getpid()}'
    request.addfinalizer(lambda: drop_prefix(dsn, prefix))
    return f'{dsn}?table={prefix}'


@pytest.fixture
def mongodb_database() -> Iterator[str]:
    """A fresh database on the test MongoDB server (fails under CI without one), dropped afterwards."""
    url = require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL']
    name = f'crash_{os.getpid()}_{int(time.time() * 1000)}'
    yield f'{url}/{name}'
    import pymongo

    with pymongo.MongoClient(url) as client:
        client.drop_database(name)


async def checked_and_closed(store: StepStore, run_id: str, side: Path, reuse: bool) -> str:
    """`check_after_kill`, then the store closed in the same event loop (a server store's pool lives in it)."""
    try:
        return await check_after_kill(store, run_id, side, reuse)
    finally:
        close = getattr(store, 'aclose', None)
        if close is not None:
            await close()


def side_channel(path: Path) -> tuple[list[int], set[int], bool]:
    """Indices of tool bodies that began (in order), those that ended, and whether the run finished."""
    began: list[int] = []
    ended: set[int] = set()
    done = False
    text = path.read_text(encoding='utf-8') if path.exists() else ''
    for line in text.splitlines():
        if line == 'DONE':
            done = True
        elif line.startswith('B call-'):
            began.append(int(line[7:]))
        elif line.startswith('E call-'):
            ended.add(int(line[7:]))
    return began, ended, done


async def check_after_kill(store: StepStore, run_id: str, side: Path, reuse: bool) -> str:
    """Every read works and agrees with the side channel. Returns a word describing the case."""
    began, ended, done = side_channel(side)
    last = max(began, default=-1)

    # Nothing may raise on any read.
    record = await store.get_run(run_id=run_id)
    assert record is None or record.run_id == run_id
    await store.list_runs()
    events = await store.list_events(run_id=run_id)
    keys = [event.idempotency_key for event in events if event.idempotency_key is not None]
    assert len(keys) == len(set(keys)), 'an event was applied twice'
    await store.list_snapshots(run_id=run_id, include_interrupted=True)  # type: ignore[attr-defined]
    await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    await inspect_recovery(store=store, run_id=run_id)
    for index in range(last + 2):
        await store.get_tool_effect(run_id=run_id, tool_call_id=f'call-{index}')

    # The ledger: exactly the bodies that began and did not end, give or take the in-flight call.
    unresolved = {int(r.tool_call_id[5:]) for r in await store.list_unresolved_tool_effects(run_id=run_id)}
    open_bodies = {index for index in began if index not in ended}
    assert open_bodies <= unresolved, f'began but not ended, yet resolved: {open_bodies - unresolved}'
    settled = {index for index in ended if index < last}  # a later body began, so its end was recorded
    assert not unresolved & settled, f'settled calls reported unresolved: {unresolved & settled}'
    in_flight = {last + 1} | ({last} if last in ended else set())
    assert unresolved - open_bodies <= in_flight, f'unexplained unresolved calls: {unresolved - open_bodies}'
    if done:
        assert unresolved == set()

    # Continuing: a provider-valid history holding every settled call, unless none was settled yet.
    try:
        history = await continue_run(store, run_id=run_id)
    except LookupError:
        assert not settled and not done, 'a settled tool cycle has no complete snapshot'
        return 'no-snapshot'
    assert is_provider_valid(history)
    returned = {
        int(part.tool_call_id[5:])
        for message in history
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    assert settled <= returned, f'settled calls missing from the continued history: {settled - returned}'
    if done:
        assert returned == set(range(STEPS))
        assert isinstance(history[-1], ModelResponse) and isinstance(history[-1].parts[0], TextPart)
    if reuse:
        # The continued history is something pydantic-ai accepts, in a new persisted run.
        agent = Agent(scripted('continued'), capabilities=[StepPersistence(store=store)])
        result = await agent.run('go on', message_history=history)
        assert result.output == 'continued'
    return 'done' if done else 'continued'


@pytest.mark.parametrize('kind', KINDS)
def test_sigkill_at_random_points_leaves_a_readable_consistent_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = crash_location(kind, tmp_path, request)
    kills = KILLS_MONGODB if kind == 'mongodb' else KILLS  # the test server is slow: fewer kills, still random
    rng = random.Random(f'crash-{kind}')
    zygote = Zygote()
    outcomes: dict[str, int] = {}
    registered: set[str] = set()  # runs that surely got registered: a tool body began
    try:
        base = {'kind': kind, 'location': str(location), 'steps': STEPS, 'tool_sleep': 0.004}
        # One uninterrupted run tells how long a run takes here, to spread the kills over it.
        calibration = tmp_path / 'side-calibration.txt'
        zygote.start({**base, 'run_id': 'calibration', 'seed': 0, 'side': str(calibration), 'max_snapshots': None})
        duration = zygote.wait()['elapsed']
        assert side_channel(calibration)[2], 'the calibration run did not finish'
        attempt = -1
        # More kills (up to twice as many) when the machine's speed moved since the calibration
        # and too few landed in the middle of a run.
        while (attempt := attempt + 1) < kills or (outcomes.get('continued', 0) < kills // 4 and attempt < 2 * kills):
            run_id = f'crash-{attempt}'
            side = tmp_path / f'side-{attempt}.txt'
            command = {
                **base,
                'run_id': run_id,
                'seed': attempt,
                'side': str(side),
                'max_snapshots': rng.choice([None, None, 2]),
            }
            delay = rng.uniform(0.0, duration * 1.05)
            pid = zygote.start(command)
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):  # the run may have finished already
                os.kill(pid, signal.SIGKILL)
            zygote.wait()
            if side_channel(side)[0]:
                registered.add(run_id)
            store = make_store(kind, location)
            outcome = anyio.run(checked_and_closed, store, run_id, side, attempt % 10 == 0)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        zygote.close()
    # The kills must have landed in the middle of runs, not only before or after them.
    assert outcomes.get('continued', 0) >= kills // 4, outcomes

    async def still_writable() -> None:
        store = make_store(kind, location)
        await store.register_run(RunRecord(run_id='after-the-crashes'))
        assert await store.get_run(run_id='after-the-crashes') is not None
        listed = {record.run_id for record in await store.list_runs()}
        assert registered <= listed, f'runs missing from list_runs: {registered - listed}'
        await store.aclose()

    anyio.run(still_writable)


@pytest.mark.parametrize('kind', KINDS)
def test_a_kill_while_the_model_is_first_asked_leaves_the_turn_to_continue(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The run's input goes with its registration, before the model is asked, so the prompt survives."""
    location = crash_location(kind, tmp_path, request)
    side = tmp_path / 'side-turns.txt'
    zygote = Zygote()
    try:
        command = {'turns': True, 'kind': kind, 'location': str(location), 'conversation_id': 'conv', 'side': str(side)}
        pid = zygote.start(command)
        deadline = time.monotonic() + 60
        while 'ASKED' not in (side.read_text(encoding='utf-8') if side.exists() else ''):
            assert time.monotonic() < deadline, 'the second turn never asked its model'
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        assert zygote.wait()['status'] != 0
    finally:
        zygote.close()

    async def continued() -> None:
        store = make_store(kind, location)
        try:
            assert [run.status for run in await store.list_runs(conversation_id='conv')] == ['completed', 'unfinished']
            history = await continue_conversation(store, conversation_id='conv')
            prompts = [
                part.content for message in history for part in message.parts if isinstance(part, UserPromptPart)
            ]
            assert prompts == ['turn one', 'turn two']
            agent = Agent(scripted('turn two answered'), capabilities=[StepPersistence(store=store)])
            assert (await agent.run(message_history=history)).output == 'turn two answered'
        finally:
            await store.aclose()

    anyio.run(continued)
