"""Ambient per-run state, carried by ContextVars.

`current_run_id` lets a delegate agent started from inside a tool discover its parent run, and
lets `annotate_tool_effect` find the active run. `live_history` holds a reference to the run's
working message list so `on_run_error` can save what the run had when it failed: the context
given to `on_run_error` still points at the list the run started with, which the graph replaces
once it builds the first request. `open_tool_effects` holds the ledger entries of the run's tool
calls in flight as last written, so `annotate_tool_effect` can update the one it rewrites and the
capability can close it without reading it back. Names are this package's own, so it can share a
process with other step-persistence implementations.
"""

from __future__ import annotations

from contextvars import ContextVar

from pydantic_ai.messages import ModelMessage

from ._records import ToolEffectRecord

current_run_id: ContextVar[str | None] = ContextVar('pydantic_ai_steps.current_run_id', default=None)
live_history: ContextVar[tuple[list[ModelMessage], int] | None] = ContextVar(
    'pydantic_ai_steps.live_history', default=None
)
open_tool_effects: ContextVar[dict[str, ToolEffectRecord] | None] = ContextVar(
    'pydantic_ai_steps.open_tool_effects', default=None
)
