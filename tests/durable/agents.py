"""The agents and the store the durable-execution tests run, outside any workflow module.

Temporal's sandbox re-imports a workflow's module on every run, so an agent or a store defined
there fails worker start-up (the store creates its directory: `RestrictedWorkflowAccessError ...
pathlib.Path.mkdir`). The workflow modules import this one with
`workflow.unsafe.imports_passed_through()` and find the agents the worker process built in
`AGENTS`.

The model reads how many tool cycles to make from the prompt (`'cycles=N'`): one call of `work` per
cycle (call ids `call-0`, `call-1`, ...), then the answer `finished`. Every tool body notes
`B <call id>` when it begins and `E <call id>` when it ends in a side-channel file (flushed and
fsynced), so a test knows which bodies ran, independently of the store; before that it annotates its
ledger entry (`annotate_tool_effect`, key `work-<n>`). Two crash points, each
armed by an environment variable and fired once (a tripwire file remembers it fired):

- `STEPS_DURABLE_HOLD=call-1`: that call's body, once begun, waits to be killed.
- `STEPS_DURABLE_KILL_AFTER_WRITE=N`: the process SIGKILLs itself right after the store committed
  the first write that holds a snapshot of step N or later, before the engine hears of it.

`STEPS_DURABLE_LEGACY=1` makes the worker process write as releases before `write_records` did
(`write_as_before_write_records`, called by the worker mains).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import (
    ContinuableSnapshot,
    SqliteStepStore,
    StepEvent,
    ToolEffectRecord,
    annotate_tool_effect,
)

AGENTS: dict[str, Agent[None, str]] = {}
RESULT = 'result {n}: ' + 'r' * 256


def cycles_asked(messages: Sequence[ModelMessage]) -> int:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return int(part.content.removeprefix('cycles='))
    raise ValueError('the prompt names no cycle count')


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    done = sum(1 for message in messages if isinstance(message, ModelResponse))
    if done < cycles_asked(messages):
        return ModelResponse(parts=[ToolCallPart('work', {'n': done}, tool_call_id=f'call-{done}')])
    return ModelResponse(parts=[TextPart('finished')])


def _fire_once(name: str) -> bool:
    """True the first time (per test directory) a crash point named `name` is reached."""
    directory = os.environ.get('STEPS_DURABLE_DIR')
    if directory is None:
        return False
    tripwire = Path(directory) / f'fired-{name}'
    try:
        tripwire.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def note(text: str) -> None:
    directory = os.environ.get('STEPS_DURABLE_DIR')
    if directory is None:
        return
    fd = os.open(Path(directory) / 'side.txt', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (text + '\n').encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class KillingStore(SqliteStepStore):
    """A SQLite store whose process dies right after a chosen write commits (see the module docs)."""

    async def write_records(
        self,
        *,
        run: Any = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None:
        await super().write_records(run=run, snapshot=snapshot, tool_effects=tool_effects, events=events)
        if snapshot is not None:
            self._maybe_die(snapshot.step_index)

    async def write_snapshot_delta(self, delta: Any, **records: Any) -> Any:
        outcome = await super().write_snapshot_delta(delta, **records)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
        self._maybe_die(delta.step_index)
        return outcome  # pyright: ignore[reportUnknownVariableType]

    def _maybe_die(self, step_index: int) -> None:
        armed = os.environ.get('STEPS_DURABLE_KILL_AFTER_WRITE')
        if armed is not None and step_index >= int(armed) and _fire_once('write'):
            note(f'KILLED after the write of step {step_index}')
            os.kill(os.getpid(), signal.SIGKILL)


def build(name: str, store: SqliteStepStore, durability: AbstractCapability[None] | None) -> Agent[None, str]:
    """The test agent `name`, persisted to `store`, under `durability` (or none), registered in `AGENTS`."""
    capabilities: list[AbstractCapability[None]] = [StepPersistence(store=store, agent_name=name)]
    if durability is not None:
        capabilities.insert(0, durability)
    agent = Agent(FunctionModel(model), name=name, capabilities=capabilities)

    @agent.tool
    async def work(ctx: RunContext[None], n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        call = f'call-{n}'
        # Under Temporal this runs in the tool's activity, in the worker: the entry is found by run id.
        await annotate_tool_effect(store, ctx, idempotency_key=f'work-{n}', effect_summary=f'worked on {n}')
        note(f'B {call}')
        if os.environ.get('STEPS_DURABLE_HOLD') == call and _fire_once('hold'):
            note(f'HOLD {call}')
            await asyncio.sleep(3600)  # until the test kills this process
        note(f'E {call}')
        return RESULT.format(n=n)

    AGENTS[name] = agent
    return agent


def write_as_before_write_records() -> None:
    """Make this process write as the releases before `write_records` did (one operation per record),
    to record workflows that a newer worker must then replay: `STEPS_DURABLE_LEGACY=1`."""
    from pydantic_ai_steps.capability import _persistence

    async def never(ctx: Any, capability_id: str | None) -> bool:
        return False

    _persistence.records_batched = never  # pyright: ignore[reportAttributeAccessIssue]


def open_store(directory: str | Path) -> KillingStore:
    return KillingStore(database=str(Path(directory) / 'steps.db'))
