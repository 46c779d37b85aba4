"""`StepPersistence` under Temporal (`TemporalDurability`, the dev server of `scripts/services.sh`),
proven by killing the worker.

The worker (`temporal_worker`) runs in a child process; this process is only a client. A worker is
SIGKILLed inside a tool (or kills itself right after a store write commits), a new one is started,
and Temporal retries the interrupted activity there (2 s heartbeat timeout) and finishes the
workflow. The store must then hold exactly what a run without any crash holds.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import require_env

from . import support

pytest.importorskip('temporalio', reason='temporalio is not installed')
temporal_durability = pytest.importorskip(
    'pydantic_ai.durable_exec.temporal', reason='this pydantic-ai has no Temporal integration'
)
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.server]

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowFailureError  # noqa: E402

WORKER = 'tests.durable.temporal_worker'
MODEL_REQUEST = 'temporal_agent__model_request'


@pytest.fixture
async def client() -> Client:
    address = require_env('TEST_TEMPORAL_ADDRESS')['TEST_TEMPORAL_ADDRESS']
    return await Client.connect(address, plugins=[temporal_durability.PydanticAIPlugin()])


@contextmanager
def worker(directory: Path, queue: str, *extra: str, **crash: str) -> Iterator[subprocess.Popen[str]]:
    process = support.spawn(WORKER, [str(directory), queue, *extra], support.child_env(directory, **crash))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != 'READY':
            process.kill()
            _, err = process.communicate()
            raise AssertionError(f'worker did not start: {line!r}\n{err[-6000:]}')
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)


async def activity_names(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        event.activity_task_scheduled_event_attributes.activity_type.name
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def outcome(handle: Any) -> str:
    with anyio.fail_after(120):
        return await handle.result()


async def start(client: Client, queue: str, name: str = 'temporal_agent') -> Any:
    workflow_id = f'steps-{uuid.uuid4().hex[:12]}'
    return await client.start_workflow(
        'RunDurableAgent', args=[name, support.CYCLES], id=workflow_id, task_queue=queue, result_type=str
    )


async def test_a_run_under_temporal_records_what_a_plain_run_records_in_two_activities_per_cycle(
    tmp_path: Path, client: Client
) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'temporal_agent')
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    with worker(tmp_path, queue, 'replay'):  # every workflow task replays the run from its start
        handle = await start(client, queue)
        assert await outcome(handle) == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'temporal_agent')
    names = await activity_names(client, handle.id)
    per_cycle = support.operations_per_cycle(names, MODEL_REQUEST)
    # After each model request that calls a tool: the ledger entry before the tool, the boundary after it.
    assert per_cycle[:-1] == [2] * support.CYCLES, names


async def test_sigkill_inside_a_tool_activity_then_a_new_worker_leaves_one_clean_run(
    tmp_path: Path, client: Client
) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'temporal_agent')
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    with worker(tmp_path, queue, STEPS_DURABLE_HOLD='call-1') as first:
        handle = await start(client, queue)
        support.wait_for_note(tmp_path, 'HOLD call-1', first)
        first.send_signal(signal.SIGKILL)
    with worker(tmp_path, queue, STEPS_DURABLE_HOLD='call-1'):
        assert await outcome(handle) == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'temporal_agent')
    # The tool is an activity: its body began twice (the killed attempt, the retry), nothing else did.
    lines = support.side_lines(tmp_path)
    assert lines.count('B call-1') == 2 and lines.count('B call-0') == 1 and lines.count('B call-2') == 1


async def test_sigkill_right_after_a_store_write_commits_leaves_one_clean_run(tmp_path: Path, client: Client) -> None:
    expected = await support.plain_records(tmp_path / 'plain', 'temporal_agent')
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    with worker(tmp_path, queue, STEPS_DURABLE_KILL_AFTER_WRITE='2') as first:
        handle = await start(client, queue)
        first.communicate(timeout=120)
        assert first.returncode == -signal.SIGKILL
    assert any(line.startswith('KILLED after the write') for line in support.side_lines(tmp_path))
    with worker(tmp_path, queue):
        assert await outcome(handle) == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'temporal_agent')


async def test_the_temporal_agent_wrapper_is_refused_before_anything_is_written(tmp_path: Path, client: Client) -> None:
    """`TemporalAgent` journals none of the capability's writes: they would run in workflow code."""
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    with worker(tmp_path, queue, 'wrapper'):
        handle = await start(client, queue, 'temporal_wrapped')
        with pytest.raises(WorkflowFailureError) as failure:
            await outcome(handle)
    message = str(failure.value.cause)
    assert 'TemporalDurability' in message and 'TemporalAgent' in message, message
    store = support.agents.open_store(tmp_path)
    try:
        assert await store.list_runs() == []
    finally:
        await store.aclose()


async def test_a_workflow_recorded_before_write_records_replays_its_single_record_activities(
    tmp_path: Path, client: Client
) -> None:
    """The operation names are a contract for workflows in flight: one started by a release that wrote
    each record in its own activity, whose worker is killed mid-tool, finishes on a worker of this
    release, which replays those activities (Temporal's patch marker tells the two apart)."""
    expected = await support.plain_records(tmp_path / 'plain', 'temporal_agent')
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    with worker(tmp_path, queue, STEPS_DURABLE_HOLD='call-1', STEPS_DURABLE_LEGACY='1') as first:
        handle = await start(client, queue)
        support.wait_for_note(tmp_path, 'HOLD call-1', first)
        first.send_signal(signal.SIGKILL)
    with worker(tmp_path, queue, STEPS_DURABLE_HOLD='call-1'):
        assert await outcome(handle) == 'finished'
    await support.check_one_clean_run(tmp_path, expected, 'temporal_agent')
    names = [name.rsplit('__', 1)[-1] for name in await activity_names(client, handle.id) if support.OPERATION in name]
    assert 'write_records' not in names and names.count('save_snapshot') == support.CYCLES + 2, names


async def test_a_write_the_store_refuses_fails_the_workflow_instead_of_being_retried_forever(
    tmp_path: Path, client: Client
) -> None:
    """A refusal is deterministic (here a run id given explicitly that an earlier run holds): Temporal
    would retry the activity without end, and the workflow would never finish."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel
    from temporalio.worker import Worker

    from pydantic_ai_steps import StepPersistence
    from pydantic_ai_steps.step_persistence import RunRecord

    from .temporal_worker import ACTIVITIES
    from .temporal_workflows import RunDurableAgent

    store = support.agents.open_store(tmp_path)
    await store.register_run(RunRecord(run_id='taken'))
    agent = Agent(
        TestModel(),
        name='refused_agent',
        capabilities=[
            temporal_durability.TemporalDurability(activity_config=ACTIVITIES),
            StepPersistence(store=store, run_id='taken'),
        ],
    )
    support.agents.AGENTS['refused_agent'] = agent
    queue = f'steps-{uuid.uuid4().hex[:8]}'
    try:
        async with Worker(
            client, task_queue=queue, workflows=[RunDurableAgent], plugins=[temporal_durability.AgentPlugin(agent)]
        ):
            handle = await start(client, queue, 'refused_agent')
            with pytest.raises(WorkflowFailureError) as failure, anyio.fail_after(30):
                await handle.result()
    finally:
        support.agents.AGENTS.pop('refused_agent', None)
        await store.aclose()
    causes: list[str] = []
    cause: BaseException | None = failure.value
    while cause is not None:
        causes.append(f'{type(cause).__name__}: {cause}')
        cause = cause.__cause__
    assert any('RunAlreadyExistsError' in text and 'taken' in text for text in causes), causes
