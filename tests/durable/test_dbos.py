"""`StepPersistence` under DBOS (`DBOSDurability`, SQLite system database), proven by killing the worker.

Each test runs the DBOS application of `dbos_app` in child processes: one that runs the workflow
(and is SIGKILLed, or SIGKILLs itself), then one that launches DBOS again, which recovers the
workflow and finishes it. The store must then hold exactly what a run without any crash holds.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from . import support

pytest.importorskip('dbos', reason='dbos is not installed')
dbos_durability = pytest.importorskip(
    'pydantic_ai.durable_exec.dbos', reason='this pydantic-ai has no DBOS integration'
)
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

APP = 'tests.durable.dbos_app'
MODEL_REQUEST = 'dbos_agent__model.request'


def run_app(directory: Path, *args: str, **crash: str) -> dict[str, object]:
    return support.finish(support.spawn(APP, [str(directory), *args], support.child_env(directory, **crash)))


async def test_a_run_under_dbos_records_what_a_plain_run_records_in_two_operations_per_cycle(tmp_path: Path) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'dbos_agent')
    result = run_app(tmp_path, 'start', 'wf-normal', str(support.CYCLES))
    assert result['output'] == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'dbos_agent')
    steps = result['steps']
    assert isinstance(steps, list)
    per_cycle = support.operations_per_cycle([str(step) for step in steps], MODEL_REQUEST)
    # After each model request that calls a tool: the ledger entry before the tool, the boundary after it.
    assert per_cycle[:-1] == [2] * support.CYCLES, steps


async def test_sigkill_inside_a_tool_then_recovery_leaves_one_clean_run(tmp_path: Path) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'dbos_agent')
    env = support.child_env(tmp_path, STEPS_DURABLE_HOLD='call-1')
    worker = support.spawn(APP, [str(tmp_path), 'start', 'wf-crash', str(support.CYCLES)], env)
    support.wait_for_note(tmp_path, 'HOLD call-1', worker)
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    result = support.finish(support.spawn(APP, [str(tmp_path), 'wait', 'wf-crash'], env))
    assert result['output'] == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'dbos_agent')
    # A plain tool runs in workflow code, so DBOS runs its body again on recovery: tools with side
    # effects belong in steps (the README says so).
    assert support.side_lines(tmp_path).count('B call-1') == 2


async def test_sigkill_right_after_a_store_write_commits_leaves_one_clean_run(tmp_path: Path) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'dbos_agent')
    env = support.child_env(tmp_path, STEPS_DURABLE_KILL_AFTER_WRITE='2')
    worker = support.spawn(APP, [str(tmp_path), 'start', 'wf-write', str(support.CYCLES)], env)
    worker.communicate(timeout=120)
    assert worker.returncode == -signal.SIGKILL
    assert any(line.startswith('KILLED after the write') for line in support.side_lines(tmp_path))
    result = support.finish(support.spawn(APP, [str(tmp_path), 'wait', 'wf-write'], env))
    assert result['output'] == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'dbos_agent')


async def test_the_dbos_agent_wrapper_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`DBOSAgent` journals none of the capability's writes: a recovered run would be a second copy."""
    result = run_app(tmp_path, 'wrapper', str(support.CYCLES))
    error = str(result.get('error'))
    assert 'DBOSDurability' in error and 'DBOSAgent' in error, result
    store = support.agents.open_store(tmp_path)
    try:
        assert await store.list_runs() == []
    finally:
        await store.aclose()


async def test_a_workflow_recorded_before_write_records_recovers_on_its_single_record_steps(tmp_path: Path) -> None:
    """The operation names are a contract for workflows in flight: one started by a release that wrote
    each record in its own step, killed mid-tool, recovers under this one, which replays those steps
    (DBOS's patch marker tells the two apart) and finishes with the same ones."""
    expected = await support.plain_records(tmp_path / 'plain', 'dbos_agent')
    legacy = support.child_env(tmp_path, STEPS_DURABLE_HOLD='call-1', STEPS_DURABLE_LEGACY='1')
    worker = support.spawn(APP, [str(tmp_path), 'start', 'wf-legacy', str(support.CYCLES)], legacy)
    support.wait_for_note(tmp_path, 'HOLD call-1', worker)
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    env = support.child_env(tmp_path, STEPS_DURABLE_HOLD='call-1')
    result = support.finish(support.spawn(APP, [str(tmp_path), 'wait', 'wf-legacy'], env))
    assert result['output'] == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'dbos_agent')
    recorded = result['steps']
    assert isinstance(recorded, list)
    steps = [str(step).rsplit('.', 1)[-1] for step in recorded if support.OPERATION in str(step)]
    assert 'write_records' not in steps and steps.count('save_snapshot') == support.CYCLES + 2, steps
