"""`StepPersistence`: turns pydantic-ai hooks into step records. It knows no storage, and no write policy."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from pydantic_ai import CallToolsNode, ModelRequestNode, UserPromptNode
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, WrapRunHandler
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_graph import End

from .._records import TOOL_ARGS_LIMIT, EventKind
from ..store.backends.memory import InMemoryStepStore
from ..store.protocol import RecordBatchStore, StepStore
from . import _context
from ._histories import describe_exit, describe_tool_error, with_output_tool_returns
from ._internals import Engine, engine_free, journaling, records_batched, workflow_engine
from ._lineage import parent_of, run_record
from ._operations import EventNote, StoreOperations
from ._run_ids import derive_run_id
from ._snapshots import Snapshots
from ._spec import check_arguments, store_from_spec
from ._writers import BatchingWriter, ImmediateWriter, OperationSink, StoreSink, Writer

logger = logging.getLogger('pydantic_ai_steps')
_OPENING_AND_CLOSING: frozenset[EventKind] = frozenset({'run_started', 'run_completed', 'run_failed'})


@dataclass
class StepPersistence(StoreOperations[AgentDepsT]):
    """Durable step records for an agent: event log, continuable snapshots, tool-effect ledger.

    ```python
    from pydantic_ai import Agent
    from pydantic_ai_steps import StepPersistence
    from pydantic_ai_steps.step_persistence import SqliteStepStore

    store = SqliteStepStore(database='runs.db')
    agent = Agent('test', capabilities=[StepPersistence(store=store, agent_name='librarian')])
    ```

    Each `.run()` gets its own run id: the explicit `run_id` (single-shot: a second run with it
    raises `ValueError`), else `'{agent_name}-{8 hex}'` when `agent_name` is set, else pydantic-ai's
    own run id. Store errors are never swallowed: a write that fails fails the run, so a run that
    succeeds has every record it claims to have.
    """

    store: StepStore = field(default_factory=InMemoryStepStore)
    """Where records go. Shared by every run of this capability."""
    agent_name: str | None = None
    """Recorded on every record; also the prefix of derived run ids."""
    run_id: str | None = None
    """An explicit id for exactly one run. Use `conversation_id=` on `Agent.run` to group turns."""
    parent_run_id: str | None = None
    """Overrides the parent inferred from an enclosing persisted run (needed across processes)."""
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    """Copied onto the run record and every event."""
    capture_frontier: bool = False
    """Also snapshot before every model request and after every model response, whatever its state."""

    id: str | None = field(default='step_persistence', kw_only=True)

    # Per-run state: `for_run` builds a fresh instance for every run, so none of it leaks.
    _derived_from: tuple[str | None, str | None] | None = field(default=None, init=False, repr=False)
    """`(agent_name, pydantic-ai run id)` when the run id was derived, so a clash can draw again."""
    _parent_tool_call_id: str | None = field(default=None, init=False, repr=False)
    """The parent's tool call this run was started from, taken where the run starts (`parent_of`)."""
    _writer: Writer | None = field(default=None, init=False, repr=False)
    _snapshots: Snapshots = field(init=False, repr=False, compare=False)
    _event_sequence: int = field(default=0, init=False, repr=False)
    _last_request_step: int | None = field(default=None, init=False, repr=False)
    _output_tool_names: frozenset[str] = field(default=frozenset[str](), init=False, repr=False)

    def __post_init__(self) -> None:
        self.metadata = check_arguments(self)
        self._snapshots = Snapshots(self)

    @classmethod
    def from_spec(cls, *args: Any, **kwargs: Any) -> StepPersistence[Any]:
        """Build from an agent spec: `backend` is `'memory'` (default), `'file'`, `'sqlite'` or `'mongodb'`.

        `directory=` (file), `database=` (sqlite: a path) or `db_url=` and `database=` (mongodb: a
        URL and a database name) locate the store; `max_snapshots_per_run=` bounds it. Other keyword
        arguments go to the capability.
        """
        if args:
            raise TypeError(f'StepPersistence.from_spec takes keyword arguments only, got positional {args!r}')
        return cls(store=store_from_spec(kwargs), **kwargs)

    def compaction_transcript_handle(self) -> str | None:
        """The run id under which this run's history is persisted (`None` before a run starts).

        An identifier, not a promise: retention may have pruned older snapshots.
        """
        return self.run_id

    # --- run identity -------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> StepPersistence[AgentDepsT]:
        """A fresh instance per run, so counters and run ids never leak between runs."""
        parent, parent_tool_call_id = parent_of(self.parent_run_id)
        run_id = self.run_id or derive_run_id(self.agent_name, ctx.run_id, attempt=0)
        agent_name = self.agent_name
        if agent_name is None and ctx.agent is not None:
            agent_name = ctx.agent.name
        instance = replace(
            self, agent_name=agent_name, run_id=run_id, parent_run_id=parent, metadata=dict(self.metadata)
        )
        instance._parent_tool_call_id = parent_tool_call_id
        if not self.run_id and self.agent_name is not None:
            instance._derived_from = (self.agent_name, ctx.run_id)
        return instance

    @property
    def _run_id(self) -> str:
        if self.run_id is None:
            raise RuntimeError('StepPersistence run id was not assigned; hooks must run on the for_run instance')
        return self.run_id

    @property
    def _out(self) -> Writer:
        if self._writer is None:
            raise RuntimeError('StepPersistence wrote before before_run chose how to write')
        return self._writer

    # --- recording ------------------------------------------------------------------------

    def _event(
        self,
        ctx: RunContext[AgentDepsT],
        kind: EventKind,
        *,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: str | None = None,
        tool_args: str | None = None,
        index: int | None = None,
    ) -> EventNote:
        """An event happening now; the run's own fields (id, lineage, metadata) are the writer's to add.
        `index` is one reserved earlier (`_reserve_index`), else the next."""
        if index is None:  # inline: every event of a step comes through here
            index = self._event_sequence
            self._event_sequence += 1
        return EventNote(
            kind=kind,
            step_index=ctx.run_step,
            event_index=index,
            timestamp=self._out.clock(),
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            error=error,
            tool_args=tool_args,
        )

    def _reserve_index(self) -> int:
        index = self._event_sequence
        self._event_sequence += 1
        return index

    async def _record(
        self,
        ctx: RunContext[AgentDepsT],
        kind: EventKind,
        *,
        defer: bool = False,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: str | None = None,
        index: int | None = None,
    ) -> None:
        """Record an event. The run's opening and closing events are written at once unless `defer`
        (a caller that writes right after: the final snapshot)."""
        event = self._event(ctx, kind, tool_call_id=tool_call_id, tool_name=tool_name, error=error, index=index)
        await self._out.event(ctx, event, now=kind in _OPENING_AND_CLOSING and not defer)

    # --- run lifecycle ----------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """Publish this run's id to nested runs and close the log however the run ends.

        pydantic-ai calls neither `after_run` nor `on_run_error` for a run abandoned by its caller
        (an `iter()` loop left early delivers `CancelledError` here), so the closing event for
        those is written here, shielded from the cancellation that is ending the run.
        """
        run_token = _context.current_run.set(self)
        call_token = _context.current_tool_call_id.set(None)  # the parent's call is not this run's
        history_token = _context.live_history.set(None)
        try:
            return await handler()
        except BaseException as error:
            if self._writer is not None and self._writer.registered and not self._writer.closed:
                await self._close_after_escape(ctx, error)
            raise
        finally:
            _context.live_history.reset(history_token)
            _context.current_tool_call_id.reset(call_token)
            _context.current_run.reset(run_token)

    async def _close_after_escape(self, ctx: RunContext[AgentDepsT], error: BaseException) -> None:
        """Record `run_failed` for an exit no other hook saw; never mask the error that ended the run."""
        with anyio.CancelScope(shield=True):
            try:
                await self._snapshots.write_final_boundary(ctx)
                await self._record(ctx, 'run_failed', error=describe_exit(error))
            except Exception:
                logger.warning('could not record run_failed for run %r', self.run_id, exc_info=True)

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        """Choose how to write, then register the run (with `run_started`), unless the writer
        registers it with the run's input, in `before_model_request`."""
        self._writer = await _choose_writer(self, ctx)
        record = run_record(
            ctx, self._run_id, self.parent_run_id, self._parent_tool_call_id, self.agent_name, self.metadata
        )
        await self._out.register(ctx, record, self._event(ctx, 'run_started'))

    def _stored_as(self, run_id: str) -> None:
        """The id the store registered the run under: a derived id that clashed was drawn again."""
        self.run_id = run_id

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """Save the final history unless the last boundary snapshot already holds it (`interrupted`
        when it ends on deferred tool calls).

        `run_stream` never fires the boundary after its final response, and a run can end before
        any boundary, so this is where those histories are saved, at the step of the last model
        request, as `Agent.run` would have saved them.
        """
        messages = with_output_tool_returns(result.all_messages(), self._output_tool_names)
        last_request = self._last_request_step if self._last_request_step is not None else ctx.run_step
        final = await self._snapshots.final_step(ctx, messages, last_request)
        if final is None:
            await self._record(ctx, 'run_completed')
        elif self._out.defers_final_boundary:  # the closing event goes with the final snapshot
            await self._record(ctx, 'run_completed', defer=True)
            await self._snapshots.save(ctx, messages, final[0], valid=final[1])
        else:
            await self._snapshots.save(ctx, messages, final[0], valid=final[1])
            await self._record(ctx, 'run_completed')
        return result

    async def on_run_error(self, ctx: RunContext[AgentDepsT], *, error: BaseException) -> AgentRunResult[Any]:
        """Save the live history at the failure (state by validity), then record `run_failed`."""
        if self._writer is None or not self._writer.registered:
            raise error  # nothing was written (a refused or failed registration): nothing to close
        await self._snapshots.save_input(ctx)
        await self._snapshots.write_final_boundary(ctx)
        live = _context.live_history.get()
        failure = self._snapshots.at_failure(live, self._last_request_step, frontier=self.capture_frontier)
        if failure is not None:
            await self._snapshots.save(ctx, *failure)
        await self._record(ctx, 'run_failed', error=repr(error))
        raise error

    # --- model requests -------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self.capture_frontier:
            _context.live_history.set((ctx.messages, ctx.run_step))
            await self._snapshots.save(ctx, list(ctx.messages), ctx.run_step)
        elif self._last_request_step is None:
            self._snapshots.input = (list(ctx.messages), ctx.run_step)
            self._snapshots.working = ctx.messages
        self._last_request_step = ctx.run_step
        output_tools = request_context.model_request_parameters.output_tools
        if output_tools:
            self._output_tool_names = frozenset(tool.name for tool in output_tools)
        await self._record(ctx, 'model_request_started')
        if self._out.registration_pending:  # registered with the run's input, before the model is first asked
            await self._snapshots.save_input(ctx)
            await self._out.flush(ctx)
        return request_context

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        await self._record(ctx, 'model_request_completed')
        return response

    async def on_model_request_error(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        await self._record(ctx, 'model_request_failed', error=repr(error))
        raise error

    # --- tools: the side-effect ledger ------------------------------------------------------

    async def wrap_tool_execute(
        self, ctx: RunContext[AgentDepsT], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        """Ledger every tool call: `started` before it runs, `completed` or `failed` after.

        Wrapping (rather than the after/error hooks) sees every way out of a tool, including
        `ModelRetry`, which pydantic-ai turns into a retry prompt without calling
        `on_tool_execute_error`; such a call is recorded `failed`, saying it asked for a retry.
        """
        run_id, call_id, name, out = self._run_id, call.tool_call_id, tool_def.name, self._out
        await self._snapshots.save_input(ctx)
        opening = self._event(
            ctx, 'tool_call_started', tool_call_id=call_id, tool_name=name, tool_args=_args_text(call)
        )
        # The closing event's index (in its idempotency key) is taken now: parallel calls end in
        # any order, and a durable replay that ends them in another must key them alike.
        closing = self._reserve_index()
        await out.tool_started(ctx, run_id, call_id, name, opening)
        call_token = _context.current_tool_call_id.set(call_id)
        ledger_token = _context.active_ledger.set(out)
        try:
            result = await handler(args)
        except anyio.get_cancelled_exc_class():
            # Cut off from outside at any await: whether its effect happened is unknown, as after a
            # crash, so the entry stays `started` (and the run's closing event names the cancellation).
            raise
        except BaseException as error:
            reason = describe_tool_error(error)
            with anyio.CancelScope(shield=True):
                await out.tool_closed(ctx, run_id, call_id, name, 'failed', reason)
                await self._record(
                    ctx, 'tool_call_failed', tool_call_id=call_id, tool_name=name, error=reason, index=closing
                )
            raise
        finally:
            _context.active_ledger.reset(ledger_token)
            _context.current_tool_call_id.reset(call_token)
        await out.tool_closed(ctx, run_id, call_id, name, 'completed', None)
        await self._record(ctx, 'tool_call_completed', tool_call_id=call_id, tool_name=name, index=closing)
        return result

    # --- node boundaries ------------------------------------------------------------------

    async def after_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT], result: NodeResult[AgentDepsT]
    ) -> NodeResult[AgentDepsT]:
        """Snapshot after each tool cycle, with the pending tool returns folded in.

        The returns of a `CallToolsNode` travel on the next `ModelRequestNode`'s request, which is
        not in the history yet; folding it in makes the boundary settled the moment the tools end.
        A `ModelRequestNode`'s context still carries the step from before its request, so what it
        leaves is saved at the step of that request.
        """
        step = ctx.run_step
        if isinstance(node, ModelRequestNode) and self._last_request_step is not None:
            step = self._last_request_step
        if not isinstance(node, UserPromptNode):  # its context still holds the list the run was given
            _context.live_history.set((ctx.messages, step))
        if self.capture_frontier and isinstance(node, ModelRequestNode):
            await self._snapshots.save(ctx, list(ctx.messages), step)
        elif isinstance(node, CallToolsNode):
            messages = list(ctx.messages)
            if isinstance(result, ModelRequestNode):
                messages.append(result.request)
            if self._snapshots.validity.check(messages):
                if self._out.defers_final_boundary and isinstance(result, End):
                    self._snapshots.final_boundary = (messages, ctx.run_step)  # written with `run_completed`
                else:
                    await self._snapshots.save(ctx, messages, ctx.run_step, valid=True)
            elif isinstance(self._out, BatchingWriter) and self._out.has_closed_entries:
                await self._out.flush(ctx)  # no settled boundary: close the ledger entries anyway
        return result


# --- which writer a run gets; kept in this module, where its probes are looked up (and patched) --


async def _choose_writer(persistence: StepPersistence[Any], ctx: RunContext[Any]) -> Writer:
    """Batched whenever replay allows it; refuse a workflow that would journal none of the writes.

    - An engine dispatches this capability's operations and journals them now (inside its
      workflow): one `write_records` operation per write (unless the workflow was recorded
      with the single-record operations, which it then replays).
    - Nothing journals the writes: straight to the store, batched if it has `write_records`.
      Inside an engine's workflow that would be wrong: the engine runs the workflow's code
      again after a crash, and the run would be registered and recorded a second time, so
      the run is refused before anything is written (the deprecated wrapper agents register
      no operations; pydantic-ai's durability capabilities do).
    """
    store, capability_id = persistence.store, persistence.id
    if engine_free(ctx, capability_id) or not journaling(ctx):
        engine = workflow_engine() if engine_free(ctx, capability_id) else None
        if engine is not None:
            raise UserError(_unjournaled_message(engine, capability_id))
        if isinstance(store, RecordBatchStore):
            return BatchingWriter(persistence, StoreSink(persistence, store))
        return ImmediateWriter(persistence, ctx)
    if await records_batched(ctx, capability_id):
        return BatchingWriter(persistence, OperationSink(persistence, ctx, store))
    return ImmediateWriter(persistence, ctx)


def _args_text(call: ToolCallPart) -> str | None:
    try:
        text = call.args_as_json_str()
    except (TypeError, ValueError):
        return None
    return (
        text if len(text) <= TOOL_ARGS_LIMIT else text[:TOOL_ARGS_LIMIT] + f'... ({len(text) - TOOL_ARGS_LIMIT} more)'
    )


def _unjournaled_message(engine: Engine, capability_id: str | None) -> str:
    return (
        f'StepPersistence is running in {engine.name} workflow code, but nothing dispatches its durable '
        f'operations (capability id {capability_id!r}) to {engine.name}: this is the deprecated '
        f'`{engine.wrapper}` wrapper, or an agent without `{engine.capability}` run inside a workflow. '
        f'{engine.name} would run this code again after a crash, and the store would get a second copy of '
        f'the run. Use `Agent(..., capabilities=[{engine.capability}(), StepPersistence(...)])` and call '
        f'`agent.run()` in your own workflow instead of `{engine.wrapper}`; or run this agent inside '
        f'{engine.unit}. Nothing was written.'
    )
