"""Where a run comes from: the persisted run and tool call that started it, the snapshot it continues
or forks. Found from ambient state and from the history it was given, so callers pass none of it."""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext

from .._errors import check_json_map
from .._records import RunRecord
from . import _context
from ._histories import origin_of


def parent_of(explicit: str | None) -> tuple[str | None, str | None]:
    """The parent run and the tool call of it that started this run: `explicit`, else the persisted
    run in progress around this one (a delegate agent's parent).

    Only `explicit` can name a parent in another process. The tool call is the one in progress
    where this run starts, when it is a call of the parent; a run resets it for its own duration
    (`StepPersistence.wrap_run`), so a run its model or a history processor starts names no call
    of the grandparent.
    """
    around = _context.current_run_id()
    parent = explicit if explicit is not None else around
    return parent, _context.current_tool_call_id.get() if parent is not None and parent == around else None


def run_record(
    ctx: RunContext[Any],
    run_id: str,
    parent_run_id: str | None,
    parent_tool_call_id: str | None,
    agent_name: str | None,
    metadata: dict[str, str],
) -> RunRecord:
    """The record a run registers: its identity, its lineage, and the metadata given to `Agent.run`."""
    origin = origin_of(ctx.messages)
    return RunRecord(
        run_id=run_id,
        conversation_id=ctx.conversation_id,
        parent_run_id=parent_run_id,
        agent_name=agent_name,
        metadata=dict(metadata),
        pydantic_ai_run_id=ctx.run_id,
        run_metadata=check_json_map(ctx.metadata, 'Agent.run(metadata=...)'),
        parent_tool_call_id=parent_tool_call_id,
        continued_from=origin[1] if origin is not None and origin[0] == 'continued' else None,
        forked_from=origin[1] if origin is not None and origin[0] == 'forked' else None,
    )
