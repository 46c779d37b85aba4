"""A Temporal worker in a child process: the one the Temporal tests start, kill and start again.

    python -m tests.durable.temporal_worker DIR TASK_QUEUE [wrapper|replay]

Connects to `TEST_TEMPORAL_ADDRESS`, builds the test agent (`temporal_agent`, store `DIR/steps.db`)
under `TemporalDurability` (or, with `wrapper`, the deprecated `TemporalAgent` as `temporal_wrapped`)
and serves TASK_QUEUE until it is killed. Prints `READY` once polling. With `replay` the worker
caches no workflow, so every workflow task replays the whole history from the start: the
capability's workflow-side state (its buffers, the message log's delta encoder) is rebuilt from the
journal at every step.

Every activity gets a 2 s heartbeat timeout: pydantic-ai heartbeats its activities in the
background, so a killed worker's activity is retried on the next worker within seconds instead of
after its 60 s start-to-close timeout. The sticky queue gives up after 1 s, so the next worker gets
the workflow's tasks that soon after the first one died (the default is 10 s).
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalDurability
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker
from temporalio.workflow import ActivityConfig

from . import agents
from .temporal_workflows import RunDurableAgent

ACTIVITIES = ActivityConfig(
    start_to_close_timeout=timedelta(seconds=60),
    heartbeat_timeout=timedelta(seconds=2),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=1)),
)


async def main(directory: Path, queue: str, mode: str | None) -> None:
    if os.environ.get('STEPS_DURABLE_LEGACY') == '1':
        agents.write_as_before_write_records()
    store = agents.open_store(directory)
    if mode == 'wrapper':
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            from pydantic_ai.durable_exec.temporal import TemporalAgent

            plain = agents.build('temporal_wrapped', store, None)
            wrapped: Any = TemporalAgent(plain, activity_config=ACTIVITIES)  # pyright: ignore[reportDeprecated]
            agents.AGENTS['temporal_wrapped'] = wrapped
            plugin = AgentPlugin(wrapped)
    else:
        plugin = AgentPlugin(agents.build('temporal_agent', store, TemporalDurability(activity_config=ACTIVITIES)))
    client = await Client.connect(os.environ['TEST_TEMPORAL_ADDRESS'], plugins=[PydanticAIPlugin()])
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[RunDurableAgent],
        plugins=[plugin],
        max_cached_workflows=0 if mode == 'replay' else 1000,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        print('READY', flush=True)
        await asyncio.Event().wait()


if __name__ == '__main__':
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
