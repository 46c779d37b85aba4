"""Ambient per-run state, carried by ContextVars (names are this package's own, so it can share a
process with other step-persistence implementations).

- `current_run`: the persisted run in progress (read through `current_run_id()`), so a delegate
  agent started from inside a tool finds its parent, and `annotate_tool_effect` finds the run. It
  holds the run's capability, not its id: a derived id drawn again after a clash is known only in
  the hook that registers the run, whose context the run's tools do not inherit.
- `current_tool_call_id`: the tool call in progress (set around each tool), so a delegate records
  which call of its parent started it.
- `active_ledger`: the run's writer as seen by `annotate_tool_effect`, which tells it about an
  entry it rewrote (a batching writer closes the entry from what it wrote, without reading it back).
- `live_history`: a reference to the run's working message list, so `on_run_error` can save what
  the run had when it failed: the context given to `on_run_error` (and to the hooks around the
  first node) still points at the list the run was given, which the graph replaces with the
  working list as it builds the first request. So it is not taken there: a run that fails in its
  first request leaves its input, not a copy of the history it was given (plus the response that
  request got, when the run fails after it without a node hook: `Snapshots.at_failure`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

from pydantic_ai.messages import ModelMessage

from .._records import ToolEffectRecord


class Run(Protocol):
    run_id: str | None


class Ledger(Protocol):
    def annotated(self, record: ToolEffectRecord) -> None:
        """A tool rewrote its own ledger entry (`annotate_tool_effect`)."""
        ...


current_run: ContextVar[Run | None] = ContextVar('pydantic_ai_steps.current_run', default=None)
current_tool_call_id: ContextVar[str | None] = ContextVar('pydantic_ai_steps.current_tool_call_id', default=None)
active_ledger: ContextVar[Ledger | None] = ContextVar('pydantic_ai_steps.active_ledger', default=None)
live_history: ContextVar[tuple[list[ModelMessage], int] | None] = ContextVar(
    'pydantic_ai_steps.live_history', default=None
)


def current_run_id() -> str | None:
    run = current_run.get()
    return run.run_id if run is not None else None
