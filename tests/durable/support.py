"""Child processes and record comparisons shared by the DBOS and Temporal tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from pprint import pformat
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.usage import UsageLimits

from pydantic_ai_steps.step_persistence import SqliteStepStore, continue_run, is_provider_valid

from . import agents

ROOT = Path(__file__).resolve().parents[2]
CYCLES = 3
OPERATION = '__capability__step_persistence'


def child_env(directory: Path, **crash: str) -> dict[str, str]:
    env = {**os.environ, 'STEPS_DURABLE_DIR': str(directory), 'PYTHONPATH': str(ROOT)}
    for name in ('STEPS_DURABLE_HOLD', 'STEPS_DURABLE_KILL_AFTER_WRITE', 'STEPS_DURABLE_LEGACY'):
        env.pop(name, None)
    env.update(crash)
    return env


def spawn(module: str, args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, '-m', module, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """Wait for a child and return the JSON object of its last line (its stderr on failure)."""
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith('{')]
    if process.returncode != 0 or not lines:
        raise AssertionError(f'child exited {process.returncode}\nstdout:\n{out}\nstderr:\n{err[-6000:]}')
    return json.loads(lines[-1])


def side_lines(directory: Path) -> list[str]:
    path = directory / 'side.txt'
    return path.read_text().splitlines() if path.exists() else []


def wait_for_note(directory: Path, note: str, process: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while note not in side_lines(directory):
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f'child exited {process.returncode} before {note!r}\n{out}\n{err[-6000:]}')
        if time.monotonic() > deadline:
            raise AssertionError(f'no {note!r} after {timeout} s; side channel: {side_lines(directory)}')
        time.sleep(0.05)


# --- what a run left in its store, without what differs between any two runs ------------------


def _parts(message: ModelMessage) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for part in message.parts:
        if isinstance(part, ToolCallPart):
            parts.append(('call', f'{part.tool_name}:{part.tool_call_id}:{part.args_as_json_str()}'))
        elif isinstance(part, ToolReturnPart):
            parts.append(('return', f'{part.tool_name}:{part.tool_call_id}:{part.content}'))
        elif isinstance(part, TextPart):
            parts.append(('text', part.content))
        else:
            parts.append((part.part_kind, str(getattr(part, 'content', ''))))
    return parts


def history_shape(messages: Sequence[ModelMessage]) -> list[tuple[str, list[tuple[str, str]]]]:
    return [('request' if isinstance(m, ModelRequest) else 'response', _parts(m)) for m in messages]


async def records(store: SqliteStepStore, run_id: str) -> dict[str, Any]:
    """The run's records, minus ids and times: what must match between two runs of one agent."""
    events = await store.list_events(run_id=run_id)
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    effects = await store.list_tool_effects(run_id=run_id)
    run = await store.get_run(run_id=run_id)
    assert run is not None
    return {
        'status': run.status,
        'events': [(e.kind, e.step_index, e.tool_call_id, e.tool_name, e.error) for e in events],
        'snapshots': [(s.step_index, s.state, history_shape(s.messages)) for s in snapshots],
        'effects': [(e.tool_call_id, e.tool_name, e.status, e.idempotency_key, e.effect_summary) for e in effects],
    }


async def plain_records(directory: Path, name: str) -> dict[str, Any]:
    """The same agent run without any engine, in this process, into a store of its own."""
    directory.mkdir()
    store = agents.open_store(directory)
    try:
        agent = agents.build(name, store, None)
        await agent.run(f'cycles={CYCLES}', usage_limits=UsageLimits(request_limit=None))
        (run,) = await store.list_runs()
        return await records(store, run.run_id)
    finally:
        await store.aclose()


async def check_one_clean_run(directory: Path, expected: dict[str, Any], name: str) -> str:
    """The store holds one run, recorded as a run without crash would be, and it can be continued."""
    store = agents.open_store(directory)
    try:
        runs = await store.list_runs()
        assert len(runs) == 1, [run.run_id for run in runs]
        run_id = runs[0].run_id
        events = await store.list_events(run_id=run_id)
        keys = Counter(event.idempotency_key for event in events)
        assert [key for key, count in keys.items() if count > 1] == []
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        snapshot_keys = Counter(snapshot.idempotency_key for snapshot in snapshots)
        assert [key for key, count in snapshot_keys.items() if count > 1] == []
        got = await records(store, run_id)
        for part in ('status', 'events', 'effects', 'snapshots'):
            differ = f'{part} differ:\n{pformat(got[part])}\nexpected:\n{pformat(expected[part])}'
            assert got[part] == expected[part], differ
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []
        assert {effect.status for effect in await store.list_tool_effects(run_id=run_id)} == {'completed'}
        history = await continue_run(store, run_id=run_id)
        assert is_provider_valid(history)
        assert isinstance(history[-1], ModelResponse)
        follow_up = agents.build(f'{name}_follow_up', store, None)
        result = await follow_up.run(f'cycles={CYCLES + 1}', message_history=history)
        assert result.output == 'finished'
        return run_id
    finally:
        await store.aclose()


def operations_per_cycle(names: Sequence[str], model_request: str) -> list[int]:
    """How many capability operations ran after each model request, before the next one."""
    counts: list[int] = []
    for name in names:
        if name.endswith(model_request):
            counts.append(0)
        elif OPERATION in name and counts:
            counts[-1] += 1
    return counts
