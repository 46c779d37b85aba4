"""Persistence timed inside its hooks, in running agents: ours, and a floor doing the same writes by hand.

`(persisted run - plain run) / steps` carries the noise of two whole runs, and at 400 steps a
plain run of the benchmark agent takes seconds, so a few percent of drift is as large as the
figure measured. Timing only what runs inside the hooks (the tool itself left out) measures the
same work without that noise. And a floor replayed in a tight loop outside any agent runs with
warm caches: SQLite's pages, the allocator and the CPU caches are all cold again after the
megabytes pydantic-ai allocates between two of our writes. `FloorHooks` runs inside the agent
instead, at the points where ours writes: the transactions a run of ours issued (captured with
`sqlite_floor.RecordingConnection`, texts and all) on a raw `sqlite3` connection, one per write, and
the serialization of each cycle's new messages with pydantic-ai's adapter.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, WrapRunHandler
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext, ToolDefinition

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.store.history import message_to_json

if TYPE_CHECKING:
    from sqlite_floor import Statement


# --- the empty capability: pydantic-ai's own dispatch of our hooks -----------------------------


@dataclass
class EmptyHooks(AbstractCapability[Any]):
    """Overrides exactly the hooks `StepPersistence` overrides, each doing nothing.

    pydantic-ai takes some paths only for a capability that overrides a hook (it checks
    `on_model_request_error`, for one), so the set must match; `check_same_hooks` asserts it.
    """

    id: str | None = field(default='empty_hooks', kw_only=True)

    async def for_run(self, ctx: RunContext[Any]) -> EmptyHooks:
        return replace(self)

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        return await handler()

    async def before_run(self, ctx: RunContext[Any]) -> None:
        return None

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        return result

    async def on_run_error(self, ctx: RunContext[Any], *, error: BaseException) -> AgentRunResult[Any]:
        raise error

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        return request_context

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        return response

    async def on_model_request_error(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        raise error

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        return await handler(args)

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        return result


@dataclass
class HookClock:
    """Seconds spent inside a capability's hooks during one run, the tool's own time left out."""

    seconds: float = 0.0

    async def tool(self, handler: Any, args: Any) -> Any:
        """Call the tool, taking its time back out of the clock."""
        start = time.perf_counter()
        try:
            return await handler(args)
        finally:
            self.seconds -= time.perf_counter() - start


@dataclass
class TimedStepPersistence(StepPersistence[Any]):
    """`StepPersistence` as shipped, with the time inside its per-step hooks added to `clock`."""

    clock: HookClock = field(default_factory=HookClock, kw_only=True)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        start = time.perf_counter()
        try:
            await super().before_run(ctx)
        finally:
            self.clock.seconds += time.perf_counter() - start

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        start = time.perf_counter()
        try:
            return await super().after_run(ctx, result=result)
        finally:
            self.clock.seconds += time.perf_counter() - start

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        start = time.perf_counter()
        try:
            return await super().before_model_request(ctx, request_context)
        finally:
            self.clock.seconds += time.perf_counter() - start

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: Any
    ) -> Any:
        start = time.perf_counter()
        try:
            return await super().after_model_request(ctx, request_context=request_context, response=response)
        finally:
            self.clock.seconds += time.perf_counter() - start

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        clock = self.clock

        async def tool(tool_args: Any) -> Any:
            return await clock.tool(handler, tool_args)

        start = time.perf_counter()
        try:
            return await super().wrap_tool_execute(ctx, call=call, tool_def=tool_def, args=args, handler=tool)
        finally:
            clock.seconds += time.perf_counter() - start

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        start = time.perf_counter()
        try:
            return await super().after_node_run(ctx, node=node, result=result)
        finally:
            self.clock.seconds += time.perf_counter() - start


@dataclass
class FloorState:
    """The captured transactions of one run, replayed in order, one per write point."""

    connection: sqlite3.Connection
    groups: Sequence[Sequence[Statement]]
    clock: HookClock = field(default_factory=HookClock)
    next_group: int = 0
    requested: bool = False

    def write(self, count: int = 1) -> None:
        conn = self.connection
        for group in self.groups[self.next_group : self.next_group + count]:
            for statement in group:
                if statement.many:
                    conn.executemany(statement.sql, statement.params)
                else:
                    conn.execute(statement.sql, statement.params).fetchall()
        self.next_group += count

    def check_replayed(self) -> None:
        if self.next_group != len(self.groups):
            raise SystemExit(
                f'the floor replayed {self.next_group} of {len(self.groups)} captured transactions: '
                'its write points no longer match where StepPersistence writes'
            )


@dataclass
class FloorHooks(EmptyHooks):
    """Does by hand, at the points where ours writes, what ours writes: nothing else.

    An `EmptyHooks`, so pydantic-ai dispatches exactly the hooks ours overrides; the ones ours
    writes from are overridden again here.
    """

    floor: FloorState | None = field(default=None, kw_only=True)

    @property
    def _state(self) -> FloorState:
        assert self.floor is not None
        return self.floor

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        state = self._state
        start = time.perf_counter()
        ModelMessagesTypeAdapter.dump_json(result.all_messages()[-1:])  # the final response
        state.write(len(state.groups) - state.next_group)  # the final boundary with `run_completed`
        state.clock.seconds += time.perf_counter() - start
        state.check_replayed()
        return result

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        state = self._state
        if not state.requested:  # the registration, with the run's input, before the model is first asked
            state.requested = True
            start = time.perf_counter()
            ModelMessagesTypeAdapter.dump_json(list(ctx.messages))
            state.write()
            state.clock.seconds += time.perf_counter() - start
        return request_context

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        state = self._state
        start = time.perf_counter()
        state.write()  # the `started` entry and the events since the last write
        state.clock.seconds += time.perf_counter() - start
        return await handler(args)

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        if isinstance(node, CallToolsNode) and isinstance(result, ModelRequestNode):
            state = self._state
            start = time.perf_counter()
            ModelMessagesTypeAdapter.dump_json([ctx.messages[-1], result.request])  # the cycle's new messages
            state.write()  # the boundary snapshot with the closed entry and its event
            state.clock.seconds += time.perf_counter() - start
        return result


# --- the same, on PostgreSQL ------------------------------------------------------------------

EVENT_ROW = 'e' * 230
"""About the size of one event row of ours as text (its thirteen columns)."""
EFFECT_ROW = 'f' * 170
SNAPSHOT_ROW = 's' * 150
PATCH_ROW = 'p' * 300
"""Ours writes the previous request, which pydantic-ai stamped when it sent it, as a patch this long."""


@dataclass
class PostgresFloorHooks(FloorHooks):
    """The floor on PostgreSQL: at each point where ours writes, one autocommit statement inserting
    rows of the sizes ours writes (`pg_bench.Floor`: the ledger entry and events before the tool;
    the new message texts, the snapshot, the closed entry and its event at the boundary)."""

    postgres: Any = field(default=None, kw_only=True)
    """A `pg_bench.Floor`, opened by the first write."""
    seconds: HookClock = field(default_factory=HookClock, kw_only=True)
    _requested: bool = field(default=False, init=False, repr=False)

    async def _write(self, rows: list[tuple[str, str]]) -> None:
        start = time.perf_counter()
        await self.postgres.write('r', rows)
        self.seconds.seconds += time.perf_counter() - start

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        final = [('message', message_to_json(message)) for message in result.all_messages()[-1:]]
        await self._write([*final, ('snapshot', SNAPSHOT_ROW), ('event', EVENT_ROW)])
        return result

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if not self._requested:  # the registration, with the run's input
            self._requested = True
            texts = [('message', message_to_json(message)) for message in ctx.messages]
            await self._write([('run', 'r' * 300), *texts, ('snapshot', SNAPSHOT_ROW), ('event', EVENT_ROW)])
        return request_context

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        await self._write([('effect', EFFECT_ROW), *[('event', EVENT_ROW)] * 3])
        return await handler(args)

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        if isinstance(node, CallToolsNode) and isinstance(result, ModelRequestNode):
            new = [('message', message_to_json(message)) for message in (ctx.messages[-1], result.request)]
            boundary = [('message', PATCH_ROW), ('snapshot', SNAPSHOT_ROW), ('effect', EFFECT_ROW)]
            await self._write([*new, *boundary, ('event', EVENT_ROW)])
        return result
