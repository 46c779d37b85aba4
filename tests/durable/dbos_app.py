"""A DBOS application in a child process: the worker the DBOS tests start, kill and start again.

    python -m tests.durable.dbos_app DIR start WORKFLOW_ID CYCLES   # start a workflow, wait for it
    python -m tests.durable.dbos_app DIR wait WORKFLOW_ID           # launch (DBOS recovers pending
                                                                    # workflows), wait for that one
    python -m tests.durable.dbos_app DIR wrapper CYCLES             # the deprecated `DBOSAgent`

DBOS runs with a SQLite system database in DIR; the step store is `DIR/steps.db`. The last line
printed is a JSON object: the workflow's output and the names of its steps, or the error.
`STEPS_DURABLE_DIR` (set by the test) arms the crash points of `tests.durable.agents`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.usage import UsageLimits

from . import agents

AGENT_NAME = 'dbos_agent'


def configure(directory: Path) -> None:
    DBOS(
        config={
            'name': 'steps-durable-test',
            'system_database_url': f'sqlite:///{directory / "dbos.sqlite"}',
            'log_level': 'WARNING',
        }
    )


AGENT: list[Agent[None, str]] = []


@DBOS.workflow(name='run_agent')
async def run_agent(cycles: int) -> str:
    return (await AGENT[0].run(f'cycles={cycles}', usage_limits=UsageLimits(request_limit=None))).output


async def steps_of(workflow_id: str) -> list[str]:
    return [str(step['function_name']) for step in await DBOS.list_workflow_steps_async(workflow_id)]


async def main(directory: Path, command: str, args: list[str]) -> dict[str, Any]:
    configure(directory)
    if os.environ.get('STEPS_DURABLE_LEGACY') == '1':
        agents.write_as_before_write_records()
    store = agents.open_store(directory)
    if command == 'wrapper':
        plain = agents.build('dbos_wrapped', store, None)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            from pydantic_ai.durable_exec.dbos import DBOSAgent

            wrapped = DBOSAgent(plain)  # pyright: ignore[reportDeprecated]
        DBOS.launch()
        try:
            output = (await wrapped.run(f'cycles={args[0]}')).output
        except Exception as error:
            return {'error': f'{type(error).__name__}: {error}'}
        return {'output': output}
    AGENT.append(agents.build(AGENT_NAME, store, DBOSDurability()))
    DBOS.launch()
    if command == 'start':
        workflow_id, cycles = args[0], int(args[1])
        with SetWorkflowID(workflow_id):
            handle = await DBOS.start_workflow_async(run_agent, cycles)
    else:
        workflow_id = args[0]
        handle = await DBOS.retrieve_workflow_async(workflow_id)
    output = await handle.get_result(polling_interval_sec=0.1)
    return {'output': output, 'steps': await steps_of(workflow_id)}


if __name__ == '__main__':
    result = asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
    print(json.dumps(result), flush=True)
    DBOS.destroy()
