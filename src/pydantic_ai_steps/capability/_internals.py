"""The places this package relies on pydantic-ai internals, in one module, each with a fallback.

- `RunContext._durable_operations`: the run's mapping of `(capability id, operation name)` to the
  dispatcher a durability capability (Temporal, DBOS, Prefect) installed. Absent: assume an engine
  may be journaling, which is always safe (records are then written one by one).
- `inspect.unwrap` of a `@durable_operation` method: its undecorated function. pydantic-ai's
  wrapper binds the call signature on every call before it finds that a run without an engine
  runs the call inline; calling the undecorated method directly does the same, minus the binding.
- `BaseDurabilityCapability.in_durable_context` (pydantic-ai's durability capabilities, found in
  the run's capability tree): whether the engine journals the dispatched operations now (inside
  its workflow) or runs them inline (outside one, or inside one of its steps or activities).
  Unknown: assume it journals.
- The engines' own "am I in workflow code" calls (`DBOS.workflow_id` / `DBOS.step_id`,
  `temporalio.workflow.in_workflow()`), asked only of an engine already imported, and what tells
  a workflow recorded before `write_records` from a new one (Temporal's patch marker, DBOS's list
  of recorded steps); and Temporal's non-retryable `ApplicationError`, for a store's refusal.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, TypeVar, cast

from pydantic_ai.tools import RunContext

from .._errors import (
    InvalidRecordError,
    InvalidRunIdError,
    RecordTooLargeError,
    RunAlreadyExistsError,
    RunNotFoundError,
)
from .._records import utc_now

_R = TypeVar('_R')
_P = ParamSpec('_P')
_ABSENT = object()


def engine_free(ctx: RunContext[Any], capability_id: str | None) -> bool:
    """Whether no durability engine dispatches any operation of this capability in this run."""
    operations: Any = getattr(ctx, '_durable_operations', _ABSENT)
    if operations is _ABSENT:
        return False
    return not operations or all(key[0] != capability_id for key in operations)


def runs_inline(ctx: RunContext[Any], capability_id: str | None, name: str) -> bool:
    """Whether no durability engine dispatches operation `name` of capability `capability_id` in this run.

    One mapping is shared by every context of the run, and it is what pydantic-ai's own wrapper
    consults. Should a pydantic-ai release not have that attribute, the answer is no, and the
    wrapper decides.
    """
    operations: Any = getattr(ctx, '_durable_operations', _ABSENT)
    if operations is _ABSENT:
        return False
    return not operations or (capability_id, name) not in operations


async def call_operation(
    owner: Any,
    ctx: RunContext[Any],
    name: str,
    operation: Callable[..., Awaitable[_R]],
    /,
    *args: Any,
    **kwargs: Any,
) -> _R:
    """Call `operation` (a bound method of `owner` decorated `@durable_operation(name=name)`).

    Without an engine dispatching it, the undecorated method runs directly. With one, its dispatcher
    is called with `ctx`, as pydantic-ai's wrapper would call it: the wrapper finds the run context
    in an ambient variable when the operation takes none, and that variable is already reset where
    `wrap_run` handles the run's exit, so through the wrapper the closing write would run inline,
    unjournaled, in workflow code (and during a Temporal cache eviction write a `run_failed` for a
    run that goes on elsewhere).
    """
    operations: Any = getattr(ctx, '_durable_operations', _ABSENT)
    if operations is _ABSENT:
        return await operation(*args, **kwargs)
    dispatcher = operations.get((owner.id, name)) if operations else None
    if dispatcher is None:
        undecorated = cast(Callable[..., Awaitable[_R]], inspect.unwrap(operation))
        return await undecorated(owner, *args, **kwargs)
    return cast(_R, await dispatcher(ctx, args, kwargs))


REFUSALS = (InvalidRecordError, RecordTooLargeError, RunAlreadyExistsError, RunNotFoundError, InvalidRunIdError)
"""A store's refusal of a write: the same every time it is tried."""


def refusals_are_final(operation: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """A durable operation whose store refuses its write fails for good.

    Temporal retries a failed activity without end unless its error is non-retryable, so a refused
    record would leave the workflow retrying it forever instead of failing the run. DBOS records the
    failed step as it is. A run without an engine calls the undecorated method (`call_operation`).
    """

    @functools.wraps(operation)
    async def final(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await operation(*args, **kwargs)
        except REFUSALS as error:
            temporal_activity: Any = sys.modules.get('temporalio.activity')
            if temporal_activity is None or not temporal_activity.in_activity():
                raise
            from temporalio.exceptions import ApplicationError

            raise ApplicationError(str(error), type=type(error).__name__, non_retryable=True) from error

    return final


WRITE_RECORDS_PATCH = 'pydantic-ai-steps:write-records'
"""Temporal's patch marker for workflows recorded with `write_records` (see `_operations`)."""


@dataclass(frozen=True)
class Engine:
    """The durability engine whose workflow code is running now."""

    name: str
    wrapper: str
    """pydantic-ai's deprecated wrapper agent for it, which registers no capability operations."""
    capability: str
    """pydantic-ai's durability capability for it, which does."""
    unit: str
    """What makes code a durable unit of it (where a plain agent run belongs)."""


DBOS_ENGINE = Engine('DBOS', 'DBOSAgent', 'DBOSDurability', 'a DBOS step (`@DBOS.step()`)')
TEMPORAL_ENGINE = Engine('Temporal', 'TemporalAgent', 'TemporalDurability', 'a Temporal activity')


def workflow_engine() -> Engine | None:
    """The engine whose workflow code (not one of its steps or activities) is running, if any."""
    temporal_workflow: Any = sys.modules.get('temporalio.workflow')
    if temporal_workflow is not None and temporal_workflow.in_workflow():
        return TEMPORAL_ENGINE
    dbos: Any = sys.modules.get('dbos')
    if dbos is not None:
        try:
            in_workflow = dbos.DBOS.workflow_id is not None and dbos.DBOS.step_id is None
        except Exception:  # an unlaunched or older DBOS: not in its workflow
            in_workflow = False
        if in_workflow:
            return DBOS_ENGINE
    return None


def journaling(ctx: RunContext[Any]) -> bool:
    """Whether a durability capability of this run journals the operations it dispatches right now."""
    try:
        from pydantic_ai.capabilities.abstract import leaf_capabilities
        from pydantic_ai.durable_exec import BaseDurabilityCapability
    except ImportError:  # pragma: no cover - a pydantic-ai without them: assume it journals
        return True
    root = ctx.root_capability
    if root is None:
        return True
    engines = [leaf for leaf in leaf_capabilities(root) if isinstance(leaf, BaseDurabilityCapability)]
    try:
        return not engines or any(bool(engine.in_durable_context) for engine in engines)
    except Exception:  # pragma: no cover - an engine that cannot tell: assume it journals
        return True


LEGACY_OPERATIONS = ('register_run', 'append_event', 'save_snapshot', 'record_tool_effect', 'finish_tool_effect')
"""The single-record operations only runs recorded before `write_records` dispatch under an engine."""


async def records_batched(ctx: RunContext[Any], capability_id: str | None) -> bool:
    """Whether this engine run writes with `write_records`: every new one; not one recorded before it.

    The answer comes from the journal, so a replay gets the one the run was recorded with: under
    Temporal, the patch marker `WRITE_RECORDS_PATCH` (`workflow.patched`: recorded in new
    workflows, absent from older histories); under DBOS, whether the workflow's recorded steps hold
    any single-record operation of this capability. (DBOS's own `patch_async` and
    `list_workflow_steps_async` would each take a step position of their own, which a workflow
    recorded before them does not have, and concurrent runs in one workflow would race for it; so
    the steps are read from DBOS's system database directly, and only when that is not possible
    does `patch_async` decide.) A recorded workflow replays the single-record operations; a new
    one writes batches.
    """
    del ctx
    engine = workflow_engine()
    if engine is TEMPORAL_ENGINE:
        temporal_workflow: Any = sys.modules['temporalio.workflow']
        return bool(temporal_workflow.patched(WRITE_RECORDS_PATCH))
    if engine is DBOS_ENGINE:
        dbos: Any = sys.modules['dbos']
        workflow_id = dbos.DBOS.workflow_id
        legacy = tuple(f'__capability__{capability_id}.{name}' for name in LEGACY_OPERATIONS)
        try:
            from dbos._dbos import _get_dbos_instance  # pyright: ignore[reportPrivateUsage]

            system_database: Any = _get_dbos_instance()._sys_db  # pyright: ignore[reportPrivateUsage]
            steps: Any = await asyncio.to_thread(system_database.list_workflow_steps, workflow_id, load_output=False)
        except (ImportError, AttributeError, TypeError):  # pragma: no cover - another DBOS release
            patch = getattr(dbos.DBOS, 'patch_async', None)
            return True if patch is None else bool(await patch(WRITE_RECORDS_PATCH))
        return not any(str(step['function_name']).endswith(legacy) for step in steps)
    return True


def run_clock(ctx: RunContext[Any]) -> Callable[[], datetime]:
    """The run's clock: the engine's replay-safe one where it has one (Temporal's workflow time)."""
    root = ctx.root_capability
    clock = root.get_run_clock() if root is not None else None
    return clock if clock is not None else utc_now
