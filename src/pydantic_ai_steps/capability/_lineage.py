"""Where a run comes from: the persisted run and tool call that started it, the snapshot it continues
or forks. Found from ambient state and from the history it was given, so callers pass none of it."""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext

from .._errors import check_json_map
from .._records import RunRecord
from . import _context
from ._histories import origin_of


def parent_of(explicit: str | None) -> str | None:
    """`explicit`, else the persisted run in progress around this one (a delegate agent's parent).

    Only `explicit` can name a parent in another process.
    """
    return explicit if explicit is not None else _context.current_run_id()


def run_record(
    ctx: RunContext[Any], run_id: str, parent_run_id: str | None, agent_name: str | None, metadata: dict[str, str]
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
        parent_tool_call_id=_context.current_tool_call_id.get() if parent_run_id is not None else None,
        continued_from=origin[1] if origin is not None and origin[0] == 'continued' else None,
        forked_from=origin[1] if origin is not None and origin[0] == 'forked' else None,
    )
