"""A run's snapshots: numbered, written, announced, and the two held back until their write is due.

The hooks decide when a boundary is; this decides what its snapshot carries. Held back: the run's
input (saved with the run's registration before its first model request where the writer defers
that, else with the first tool call's ledger entry, or at a failure) and its last boundary (saved
with `run_completed`, so a batching writer ends the run in one write).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.tools import RunContext

from .._records import SnapshotState
from ._events import SnapshotSaved
from ._histories import same_messages
from ._validity import ProviderValidity

if TYPE_CHECKING:
    from ._persistence import StepPersistence

Point = tuple[list[ModelMessage], int]
"""A history and the step it was taken at."""


class Snapshots:
    """One run's snapshots, written through the capability's writer."""

    def __init__(self, persistence: StepPersistence[Any]) -> None:
        self._p = persistence
        self._sequence = 0
        self._last_saved: list[ModelMessage] | None = None
        self.validity = ProviderValidity()
        self.input: Point | None = None
        """The history of the run's first model request, until a write it can go with (see the module docs)."""
        self.final_boundary: Point | None = None
        """The run's last boundary, written with `run_completed` by `after_run`."""
        self.working: list[ModelMessage] | None = None
        """The run's working message list, from its first model request (see `at_failure`)."""

    async def save(
        self,
        ctx: RunContext[Any],
        messages: list[ModelMessage],
        step_index: int,
        *,
        valid: bool | None = None,
        announce: bool = True,
    ) -> None:
        """Write a snapshot, `complete` if provider-valid; `announce` emits `SnapshotSaved` once it is stored."""
        p = self._p
        if valid is None:
            valid = self.validity.check(messages)
        state: SnapshotState = 'complete' if valid else 'interrupted'
        index = self._sequence
        self._sequence += 1
        run_id, out = p._run_id, p._out  # pyright: ignore[reportPrivateUsage]
        fields: dict[str, Any] = {
            'run_id': run_id,
            'step_index': step_index,
            'messages': messages,
            'conversation_id': ctx.conversation_id,
            'parent_run_id': p.parent_run_id,
            'agent_name': p.agent_name,
            'state': state,
            'snapshot_index': index,
        }
        if not announce:
            await out.snapshot(ctx, fields, defer=True)
            return
        await out.snapshot(ctx, fields)
        self._last_saved = messages
        await ctx.emit(
            SnapshotSaved(
                persistence_run_id=run_id, conversation_id=ctx.conversation_id, step_index=step_index, state=state
            )
        )

    async def save_input(self, ctx: RunContext[Any]) -> None:
        """Save the run's input (the history and prompt of its first request) as a continuable point,
        with the writer's next write.

        So a run that dies before its first boundary can still be continued from where it began.
        """
        if self.input is None:
            return
        messages, step = self.input
        self.input = None
        await self.save(ctx, messages, step, announce=False)

    def at_failure(self, live: Point | None, last_request: int | None, *, frontier: bool) -> Point | None:
        """What to save when the run fails, and at which step: `live`, the working list as the last
        node hook (or, under `capture_frontier`, model request) left it, if it holds a response.

        A history that ends with a response is saved at the step of the request it answers, whether
        or not a node hook followed it: `run_stream` runs none after the response that ends the
        stream, the history a refused streamed output fails with (found through `working` when
        that response answers the run's first request, before any node hook took the list).
        """
        messages = list(live[0] if live is not None else self.working or ())
        if messages and isinstance(messages[-1], ModelResponse) and last_request is not None:
            return messages, last_request
        if live is not None and messages and (frontier or any(isinstance(m, ModelResponse) for m in messages)):
            return messages, live[1]
        return None

    async def write_final_boundary(self, ctx: RunContext[Any]) -> None:
        """Write the last boundary's snapshot if it is still waiting for `after_run`."""
        if self.final_boundary is not None:
            messages, step = self.final_boundary
            self.final_boundary = None
            await self.save(ctx, messages, step, valid=True)

    async def final_step(
        self, ctx: RunContext[Any], messages: list[ModelMessage], step: int
    ) -> tuple[int, bool] | None:
        """The step to save the run's final history at and whether it is provider-valid, or `None`
        when a saved snapshot holds it.

        A waiting last boundary of this very history is saved as the final one, at its own step;
        one of another history is written first, and the final history goes at `step`. A final
        history that is not provider-valid is that of a run ending on deferred tool calls (an
        approval, a call run elsewhere): saved `interrupted`, it is what the run is resumed from,
        with `deferred_tool_results=`.
        """
        boundary = self.final_boundary
        if boundary is not None and same_messages(boundary[0], messages):
            self.final_boundary = None  # written now, as the final history
            return boundary[1], True
        await self.write_final_boundary(ctx)
        if same_messages(self._last_saved, messages):
            return None
        return step, self.validity.check(messages)
