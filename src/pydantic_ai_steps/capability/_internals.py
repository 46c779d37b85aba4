"""The places this package relies on pydantic-ai internals, in one module, each with a fallback.

- `RunContext._durable_operations`: the run's mapping of `(capability id, operation name)` to the
  dispatcher a durability capability (Temporal, DBOS, Prefect) installed. Absent: assume an engine
  may be journaling, which is always safe (records are then written one by one).
- `inspect.unwrap` of a `@durable_operation` method: its undecorated function. pydantic-ai's
  wrapper binds the call signature on every call before it finds that a run without an engine
  runs the call inline; calling the undecorated method directly does the same, minus the binding.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from pydantic_ai.tools import RunContext

_R = TypeVar('_R')
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
