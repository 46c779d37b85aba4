"""`StepPersistence`: turns pydantic-ai hooks into step records. It knows no storage."""

from __future__ import annotations

import hashlib
import inspect
import logging
import operator
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, cast

import anyio
from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, WrapRunHandler
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_graph import End

from . import _context
from ._errors import RunAlreadyExistsError
from ._events import SnapshotSaved
from ._helpers import ProviderValidity
from ._protocol import RecordBatchStore, StepStore
from ._records import ContinuableSnapshot, EventKind, RunRecord, SnapshotState, StepEvent, ToolEffectRecord, utc_now
from .stores.memory import InMemoryStepStore

_R = TypeVar('_R')
_DERIVED_ID_ATTEMPTS = 8
_FINAL_RESULT_PROCESSED = 'Final result processed.'
"""The return pydantic-ai gives an output tool call (see `_with_output_tool_returns`)."""
logger = logging.getLogger('pydantic_ai_steps')


@dataclass
class StepPersistence(AbstractCapability[AgentDepsT]):
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
    _event_sequence: int = field(default=0, init=False, repr=False)
    _snapshot_sequence: int = field(default=0, init=False, repr=False)
    _last_saved: list[ModelMessage] | None = field(default=None, init=False, repr=False)
    _validity: ProviderValidity = field(default_factory=ProviderValidity, init=False, repr=False)
    _last_request_step: int | None = field(default=None, init=False, repr=False)
    _output_tool_names: frozenset[str] = field(default=frozenset[str](), init=False, repr=False)
    _registered: bool = field(default=False, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _batched: bool = field(default=False, init=False, repr=False)
    """Whether records wait for the next write that must happen anyway (see `_flush`)."""
    _pending_events: list[StepEvent] = field(default_factory=list[StepEvent], init=False, repr=False)
    _pending_effects: list[ToolEffectRecord] = field(default_factory=list[ToolEffectRecord], init=False, repr=False)
    _final_boundary: tuple[list[ModelMessage], int] | None = field(default=None, init=False, repr=False)
    _open_effects: dict[str, ToolEffectRecord] = field(
        default_factory=dict[str, ToolEffectRecord], init=False, repr=False
    )
    """Batched: the ledger entry of each tool call in flight, as last written (see `_close_tool_call`)."""
    """Batched: the run's last boundary (history, step), written with `run_completed` by `after_run`."""

    @classmethod
    def from_spec(cls, *args: Any, **kwargs: Any) -> StepPersistence[Any]:
        """Build from an agent spec: `backend` is `'memory'` (default), `'file'` or `'sqlite'`.

        `directory=` (file) or `database=` (sqlite) locate the store; `max_snapshots_per_run=` bounds
        it. Other keyword arguments go to the capability. Server-backed stores need a live client,
        so they are built in code, not from a spec.
        """
        if args:
            raise TypeError(f'StepPersistence.from_spec takes keyword arguments only, got positional {args!r}')
        from ._spec import store_from_spec

        store = store_from_spec(kwargs)
        return cls(store=store, **kwargs)

    def compaction_transcript_handle(self) -> str | None:
        """The run id under which this run's history is persisted (`None` before a run starts).

        An identifier, not a promise: retention may have pruned older snapshots.
        """
        return self.run_id

    # --- run identity -------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> StepPersistence[AgentDepsT]:
        """A fresh instance per run, so counters and run ids never leak between runs."""
        parent = self.parent_run_id if self.parent_run_id is not None else _context.current_run_id.get()
        derived = not self.run_id
        run_id = self.run_id or _derive_run_id(self.agent_name, ctx.run_id, attempt=0)
        agent_name = self.agent_name
        if agent_name is None and ctx.agent is not None:
            agent_name = ctx.agent.name
        instance = replace(
            self, agent_name=agent_name, run_id=run_id, parent_run_id=parent, metadata=dict(self.metadata)
        )
        if derived and self.agent_name is not None:
            instance._derived_from = (self.agent_name, ctx.run_id)
        return instance

    @property
    def _run_id(self) -> str:
        if self.run_id is None:
            raise RuntimeError('StepPersistence run id was not assigned; hooks must run on the for_run instance')
        return self.run_id

    # --- durable operations: every timestamp and id is produced inside one -----------------

    async def _durably(
        self,
        ctx: RunContext[AgentDepsT],
        name: str,
        operation: Callable[..., Awaitable[_R]],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> _R:
        """Call `operation` (a bound method decorated `@durable_operation(name=name)`).

        pydantic-ai's wrapper binds the call's signature on every call (tens of microseconds,
        several calls per step) before it finds, in a run without a durability engine, that the
        call runs inline. When the run has no dispatcher for this operation, the undecorated
        method is called directly: what the wrapper would do, minus the binding.
        """
        if _runs_inline(ctx, self.id, name):
            undecorated = cast(Callable[..., Awaitable[_R]], inspect.unwrap(operation))
            return await undecorated(self, *args, **kwargs)
        return await operation(*args, **kwargs)

    @durable_operation(name='registration_id')
    async def _new_registration_id(self) -> str:
        return str(uuid.uuid4())

    @durable_operation(name='register_run')
    async def _register_run(
        self,
        *,
        run_id: str,
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        metadata: dict[str, str],
        registration_id: str,
    ) -> str:
        """Claim the run id; a derived id that clashes with an earlier run is drawn again."""
        record = RunRecord(
            run_id=run_id,
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            metadata=dict(metadata),
            registration_id=registration_id,
        )
        return await self._claim_run_id(record, self.store.register_run)

    async def _claim_run_id(self, record: RunRecord, register: Callable[[RunRecord], Awaitable[None]]) -> str:
        """`register(record)`, drawing a derived id again while it clashes with an earlier run."""
        candidate = record.run_id
        registration_id = record.registration_id
        for attempt in range(1, _DERIVED_ID_ATTEMPTS + 1):
            try:
                await register(replace(record, run_id=candidate, metadata=dict(record.metadata)))
                return candidate
            except RunAlreadyExistsError:
                existing = await self.store.get_run(run_id=candidate)
                if existing is not None and existing.registration_id == registration_id:
                    return candidate  # a durable retry of this very registration
                if self._derived_from is None:
                    raise RunAlreadyExistsError(candidate) from None
                name, source = self._derived_from
                candidate = _derive_run_id(name, source, attempt=attempt)
        raise RunAlreadyExistsError(candidate)

    @durable_operation(name='append_event')
    async def _append_event(
        self,
        *,
        run_id: str,
        kind: EventKind,
        step_index: int,
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: str | None = None,
        metadata: dict[str, str],
        event_index: int,
    ) -> None:
        await self.store.append_event(
            _step_event(
                run_id=run_id,
                kind=kind,
                step_index=step_index,
                conversation_id=conversation_id,
                parent_run_id=parent_run_id,
                agent_name=agent_name,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                error=error,
                metadata=metadata,
                event_index=event_index,
            )
        )

    @durable_operation(name='save_snapshot')
    async def _save_snapshot(
        self,
        *,
        run_id: str,
        step_index: int,
        messages: list[ModelMessage],
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        state: SnapshotState = 'complete',
        snapshot_index: int,
    ) -> None:
        await self.store.save_snapshot(
            _continuable_snapshot(
                run_id=run_id,
                step_index=step_index,
                messages=messages,
                conversation_id=conversation_id,
                parent_run_id=parent_run_id,
                agent_name=agent_name,
                state=state,
                snapshot_index=snapshot_index,
            )
        )

    @durable_operation(name='record_tool_effect')
    async def _record_tool_started(self, run_id: str, tool_call_id: str, tool_name: str) -> None:
        await self.store.record_tool_effect(
            ToolEffectRecord(tool_call_id=tool_call_id, tool_name=tool_name, run_id=run_id, status='started')
        )

    @durable_operation(name='finish_tool_effect')
    async def _finish_tool_effect(
        self,
        run_id: str,
        tool_call_id: str,
        tool_name: str,
        status: Literal['completed', 'failed'],
        error: str | None = None,
    ) -> None:
        """Close a ledger entry, keeping what `annotate_tool_effect` added while the tool ran."""
        prior = await self.store.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
        await self.store.record_tool_effect(_closed_entry(prior, run_id, tool_call_id, tool_name, status, error))

    # --- recording helpers ----------------------------------------------------------------

    async def _record(
        self,
        ctx: RunContext[AgentDepsT],
        kind: EventKind,
        *,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: str | None = None,
        defer: bool = False,
    ) -> None:
        """Record an event; batched, it waits for the next write unless it opens or closes the run.

        `defer=True` lets even those wait, for a caller that writes right after (the final snapshot).
        """
        index = self._event_sequence
        self._event_sequence += 1
        if kind in ('run_completed', 'run_failed'):
            self._closed = True
        fields = self._event_fields(ctx, self._run_id, kind, index, tool_call_id, tool_name, error)
        if self._batched:
            self._pending_events.append(_step_event(**fields))
            if kind in _WRITTEN_AT_ONCE and not defer:
                await self._flush()
            return
        await self._durably(ctx, 'append_event', self._append_event, **fields)

    def _event_fields(
        self,
        ctx: RunContext[AgentDepsT],
        run_id: str,
        kind: EventKind,
        index: int,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        """The `append_event` operation's arguments (and `_step_event`'s) for an event happening now."""
        return {
            'run_id': run_id,
            'kind': kind,
            'step_index': ctx.run_step,
            'conversation_id': ctx.conversation_id,
            'parent_run_id': self.parent_run_id,
            'agent_name': self.agent_name,
            'tool_call_id': tool_call_id,
            'tool_name': tool_name,
            'error': error,
            'metadata': dict(self.metadata),
            'event_index': index,
        }

    async def _snapshot(
        self, ctx: RunContext[AgentDepsT], messages: list[ModelMessage], step_index: int, *, valid: bool | None = None
    ) -> None:
        if valid is None:
            valid = self._validity.check(messages)
        state: SnapshotState = 'complete' if valid else 'interrupted'
        index = self._snapshot_sequence
        self._snapshot_sequence += 1
        fields: dict[str, Any] = {
            'run_id': self._run_id,
            'step_index': step_index,
            'messages': messages,
            'conversation_id': ctx.conversation_id,
            'parent_run_id': self.parent_run_id,
            'agent_name': self.agent_name,
            'state': state,
            'snapshot_index': index,
        }
        if self._batched:
            await self._flush(snapshot=_continuable_snapshot(**fields))
        else:
            await self._durably(ctx, 'save_snapshot', self._save_snapshot, **fields)
        self._last_saved = messages
        await ctx.emit(
            SnapshotSaved(
                persistence_run_id=self._run_id,
                conversation_id=ctx.conversation_id,
                step_index=step_index,
                state=state,
            )
        )

    async def _flush(
        self, *, snapshot: ContinuableSnapshot | None = None, tool_effects: list[ToolEffectRecord] | None = None
    ) -> None:
        """Write the waiting records together with `snapshot` / `tool_effects`, as one unit.

        With a store that can write several records at once (`RecordBatchStore`) and no
        durability engine journaling calls one by one, the informational events and the closed
        ledger entries of a step wait for the next write that must happen anyway: the `started`
        entry of the next tool call, or the boundary snapshot. A tool cycle then costs two writes,
        not eight. A call's ledger entry is closed with the snapshot that holds its result, so
        after a crash a call is `completed` only if a snapshot has its return; a crash in between
        leaves it `started`, reported as possibly done, which it is. The events of a model
        request still in flight at a crash are not in the log; a run's opening and closing
        events are written at once.
        """
        events, effects = self._pending_events, self._pending_effects
        self._pending_events, self._pending_effects = [], []
        store = cast(RecordBatchStore, self.store)
        try:
            await store.write_records(snapshot=snapshot, tool_effects=[*effects, *(tool_effects or ())], events=events)
        except BaseException:
            # Keep them for the write that closes the run (idempotency keys make a repeat
            # harmless), except a `run_completed`: a run whose last write failed did not complete.
            kept = [event for event in events if event.kind != 'run_completed']
            if len(kept) < len(events):
                self._closed = False
            self._pending_events[:0] = kept
            self._pending_effects[:0] = effects
            raise

    def _unchanged_since_last_save(self, messages: list[ModelMessage]) -> bool:
        """Whether the final history is, message for message, the one last saved."""
        return _same_messages(self._last_saved, messages)

    async def _write_final_boundary(self, ctx: RunContext[AgentDepsT]) -> None:
        """Write the last boundary's snapshot if it is still waiting for `after_run`."""
        if self._final_boundary is not None:
            messages, step = self._final_boundary
            self._final_boundary = None
            await self._snapshot(ctx, messages, step, valid=True)

    # --- run lifecycle ----------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """Publish this run's id to nested runs and close the log however the run ends.

        pydantic-ai calls neither `after_run` nor `on_run_error` for a run abandoned by its caller
        (an `iter()` loop left early delivers `CancelledError` here), so the closing event for
        those is written here, shielded from the cancellation that is ending the run.
        """
        run_token = _context.current_run_id.set(self.run_id)
        history_token = _context.live_history.set(None)
        effects_token = _context.open_tool_effects.set(self._open_effects)
        try:
            return await handler()
        except BaseException as error:
            if not self._closed and self._registered:
                await self._close_after_escape(ctx, error)
            raise
        finally:
            _context.open_tool_effects.reset(effects_token)
            _context.live_history.reset(history_token)
            _context.current_run_id.reset(run_token)

    async def _close_after_escape(self, ctx: RunContext[AgentDepsT], error: BaseException) -> None:
        """Record `run_failed` for an exit no other hook saw; never mask the error that ended the run."""
        with anyio.CancelScope(shield=True):
            try:
                await self._write_final_boundary(ctx)
                await self._record(ctx, 'run_failed', error=_describe_exit(error))
            except Exception:
                logger.warning('could not record run_failed for run %r', self.run_id, exc_info=True)

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        self._batched = isinstance(self.store, RecordBatchStore) and _engine_free(ctx, self.id)
        if self._batched:
            await self._register_with_first_event(ctx)
            return
        registration_id = await self._durably(ctx, 'registration_id', self._new_registration_id)
        run_id = await self._durably(
            ctx,
            'register_run',
            self._register_run,
            run_id=self._run_id,
            conversation_id=ctx.conversation_id,
            parent_run_id=self.parent_run_id,
            agent_name=self.agent_name,
            metadata=dict(self.metadata),
            registration_id=registration_id,
        )
        if run_id != self.run_id:
            self.run_id = run_id
            _context.current_run_id.set(run_id)
        self._registered = True
        await self._record(ctx, 'run_started')

    async def _register_with_first_event(self, ctx: RunContext[AgentDepsT]) -> None:
        """Batched: register the run and record `run_started` in one write."""
        store = cast(RecordBatchStore, self.store)
        index = self._event_sequence
        self._event_sequence += 1

        async def register(record: RunRecord) -> None:
            opening = _step_event(**self._event_fields(ctx, record.run_id, 'run_started', index))
            await store.write_records(run=record, events=[opening])

        record = RunRecord(
            run_id=self._run_id,
            conversation_id=ctx.conversation_id,
            parent_run_id=self.parent_run_id,
            agent_name=self.agent_name,
            metadata=dict(self.metadata),
            registration_id=str(uuid.uuid4()),
        )
        run_id = await self._claim_run_id(record, register)
        if run_id != self.run_id:
            self.run_id = run_id
            _context.current_run_id.set(run_id)
        self._registered = True

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """Save the final history unless the last boundary snapshot already holds it.

        `run_stream` never fires the boundary after its final response, and a run can end before
        any boundary, so this is where those histories are saved, at the step of the last model
        request, as `Agent.run` would have saved them.
        """
        messages = _with_output_tool_returns(result.all_messages(), self._output_tool_names)
        step: int | None = None
        if self._final_boundary is not None and _same_messages(self._final_boundary[0], messages):
            step = self._final_boundary[1]  # the last boundary's snapshot, written now
            self._final_boundary = None
        else:
            await self._write_final_boundary(ctx)
            if not self._unchanged_since_last_save(messages) and self._validity.check(messages):
                step = self._last_request_step if self._last_request_step is not None else ctx.run_step
        if step is None:
            await self._record(ctx, 'run_completed')
        elif self._batched:  # the closing event goes with the final snapshot
            await self._record(ctx, 'run_completed', defer=True)
            await self._snapshot(ctx, messages, step, valid=True)
        else:
            await self._snapshot(ctx, messages, step, valid=True)
            await self._record(ctx, 'run_completed')
        return result

    async def on_run_error(self, ctx: RunContext[AgentDepsT], *, error: BaseException) -> AgentRunResult[Any]:
        """Save the live history at the failure (state by validity), then record `run_failed`."""
        await self._write_final_boundary(ctx)
        stashed = _context.live_history.get()
        if stashed is not None:
            live, step = stashed
            captured = list(live)
            has_response = any(isinstance(message, ModelResponse) for message in captured)
            if has_response or (self.capture_frontier and captured):
                await self._snapshot(ctx, captured, step)
        await self._record(ctx, 'run_failed', error=repr(error))
        raise error

    # --- model requests -------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self.capture_frontier:
            _context.live_history.set((ctx.messages, ctx.run_step))
            await self._snapshot(ctx, list(ctx.messages), ctx.run_step)
        self._last_request_step = ctx.run_step
        output_tools = request_context.model_request_parameters.output_tools
        if output_tools:
            self._output_tool_names = frozenset(tool.name for tool in output_tools)
        await self._record(ctx, 'model_request_started')
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
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        """Ledger every tool call: `started` before it runs, `completed` or `failed` after.

        Wrapping (rather than the after/error hooks) sees every way out of a tool, including
        `ModelRetry`, which pydantic-ai turns into a retry prompt without calling
        `on_tool_execute_error`; such a call is recorded `failed`, saying it asked for a retry.
        """
        run_id, call_id, name = self._run_id, call.tool_call_id, tool_def.name
        if self._batched:
            await self._record(ctx, 'tool_call_started', tool_call_id=call_id, tool_name=name)
            started = ToolEffectRecord(tool_call_id=call_id, tool_name=name, run_id=run_id, status='started')
            self._open_effects[call_id] = started
            await self._flush(tool_effects=[started])
        else:
            await self._durably(ctx, 'record_tool_effect', self._record_tool_started, run_id, call_id, name)
            await self._record(ctx, 'tool_call_started', tool_call_id=call_id, tool_name=name)
        try:
            result = await handler(args)
        except BaseException as error:
            reason = _describe_tool_error(error)
            with anyio.CancelScope(shield=True):
                await self._close_tool_call(ctx, call_id, name, 'failed', reason)
                await self._record(ctx, 'tool_call_failed', tool_call_id=call_id, tool_name=name, error=reason)
            raise
        await self._close_tool_call(ctx, call_id, name, 'completed')
        await self._record(ctx, 'tool_call_completed', tool_call_id=call_id, tool_name=name)
        return result

    async def _close_tool_call(
        self,
        ctx: RunContext[AgentDepsT],
        call_id: str,
        name: str,
        status: Literal['completed', 'failed'],
        error: str | None = None,
    ) -> None:
        """Close the call's ledger entry: at once, or (batched) with the boundary snapshot.

        Batched, the entry is known without reading it back: this run wrote it, and
        `annotate_tool_effect` updates `_open_effects` when it rewrites it.
        """
        run_id = self._run_id
        if self._batched:
            prior = self._open_effects.pop(call_id)
            self._pending_effects.append(_closed_entry(prior, run_id, call_id, name, status, error))
            return
        await self._durably(ctx, 'finish_tool_effect', self._finish_tool_effect, run_id, call_id, name, status, error)

    # --- node boundaries ------------------------------------------------------------------

    async def after_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT], result: NodeResult[AgentDepsT]
    ) -> NodeResult[AgentDepsT]:
        """Snapshot after each tool cycle, with the pending tool returns folded in.

        The returns of a `CallToolsNode` travel on the next `ModelRequestNode`'s request, which is
        not in the history yet; folding it in makes the boundary settled the moment the tools end.
        """
        _context.live_history.set((ctx.messages, ctx.run_step))
        if self.capture_frontier and isinstance(node, ModelRequestNode):
            await self._snapshot(ctx, list(ctx.messages), ctx.run_step)
        elif isinstance(node, CallToolsNode):
            messages = list(ctx.messages)
            if isinstance(result, ModelRequestNode):
                messages.append(result.request)
            if self._validity.check(messages):
                if self._batched and isinstance(result, End):
                    # The run ends here: `after_run` writes this snapshot with `run_completed`.
                    self._final_boundary = (messages, ctx.run_step)
                else:
                    await self._snapshot(ctx, messages, ctx.run_step, valid=True)
            elif self._pending_effects:
                await self._flush()  # no settled boundary: close the ledger entries anyway
        return result


_ABSENT = object()
_WRITTEN_AT_ONCE: frozenset[EventKind] = frozenset({'run_started', 'run_completed', 'run_failed'})
"""Events a batched run writes at once: the log shows that a run began, and how it ended."""


def _engine_free(ctx: RunContext[Any], capability_id: str | None) -> bool:
    """Whether no durability engine dispatches any operation of this capability in this run."""
    operations: Any = getattr(ctx, '_durable_operations', _ABSENT)
    if operations is _ABSENT:
        return False
    return not operations or all(key[0] != capability_id for key in operations)


def _runs_inline(ctx: RunContext[Any], capability_id: str | None, name: str) -> bool:
    """Whether no durability engine dispatches operation `name` of capability `capability_id` in this run.

    A durability capability registers its dispatchers in the run context's `_durable_operations`
    mapping (one mapping shared by every context of the run), which is what pydantic-ai's own
    wrapper consults. Should a pydantic-ai release not have that attribute, the answer is no, and
    the wrapper decides.
    """
    operations: Any = getattr(ctx, '_durable_operations', _ABSENT)
    if operations is _ABSENT:
        return False
    return not operations or (capability_id, name) not in operations


def _step_event(*, event_index: int, **fields: Any) -> StepEvent:
    """An event stamped now, keyed `{event_index}:{step_index}:{kind}:{tool_call_id or ''}`."""
    key = f'{event_index}:{fields["step_index"]}:{fields["kind"]}:{fields["tool_call_id"] or ""}'
    return StepEvent(**fields, idempotency_key=key)


def _continuable_snapshot(*, snapshot_index: int, **fields: Any) -> ContinuableSnapshot:
    """A snapshot stamped now, keyed `{snapshot_index}:{step_index}:{state}`."""
    return ContinuableSnapshot(**fields, idempotency_key=f'{snapshot_index}:{fields["step_index"]}:{fields["state"]}')


def _closed_entry(
    prior: ToolEffectRecord | None,
    run_id: str,
    tool_call_id: str,
    tool_name: str,
    status: Literal['completed', 'failed'],
    error: str | None,
) -> ToolEffectRecord:
    """A closed ledger entry that keeps what `annotate_tool_effect` added while the tool ran."""
    return ToolEffectRecord(
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        run_id=run_id,
        status=status,
        started_at=prior.started_at if prior is not None else utc_now(),
        ended_at=utc_now(),
        idempotency_key=prior.idempotency_key if prior is not None else None,
        effect_summary=prior.effect_summary if prior is not None and prior.effect_summary else error,
    )


def _same_messages(saved: list[ModelMessage] | None, messages: list[ModelMessage]) -> bool:
    """Message-for-message identity. Enough to tell a final history from the one saved at the last
    boundary: nothing stamps messages once it has passed, and a capability that rewrites the final
    history builds new message objects."""
    return saved is not None and len(saved) == len(messages) and all(map(operator.is_, saved, messages))


def _derive_run_id(agent_name: str | None, source: str | None, *, attempt: int) -> str:
    """`'{agent_name}-{8 hex}'`, fresh per run yet stable under durable replay.

    The hex comes from pydantic-ai's own run id (new for every `.run()`), so a durable engine
    replaying the run derives the same id; a clash with an earlier run draws again (`attempt`).
    """
    seed = source if source is not None else str(uuid.uuid4())
    if agent_name is None:
        return seed if attempt == 0 else f'{seed}-{attempt}'
    digest = hashlib.sha256(f'{agent_name}\0{seed}\0{attempt}'.encode()).hexdigest()
    return f'{agent_name}-{digest[:8]}'


def _with_output_tool_returns(messages: list[ModelMessage], output_tools: frozenset[str]) -> list[ModelMessage]:
    """Add the output-tool return `run_stream` appends only after `after_run` has run.

    Under `Agent.run` the final history ends with the output tool's return; `run_stream` hands
    `after_run` the history without it (the stream result gains it later). Folding in the same
    return keeps the snapshots of both ways of running identical. Any other unanswered call
    leaves the history as it is.
    """
    if not messages or not isinstance(last := messages[-1], ModelResponse):
        return messages
    calls = [part for part in last.parts if isinstance(part, ToolCallPart)]
    if len(calls) != 1 or calls[0].tool_name not in output_tools:
        return messages
    call = calls[0]
    answer = ToolReturnPart(tool_name=call.tool_name, content=_FINAL_RESULT_PROCESSED, tool_call_id=call.tool_call_id)
    return [*messages, ModelRequest(parts=[answer])]


def _describe_exit(error: BaseException) -> str:
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return f'cancelled: the run was abandoned before it finished ({error!r})'
    return repr(error)


def _describe_tool_error(error: BaseException) -> str:
    from pydantic_ai.exceptions import ToolRetryError

    if isinstance(error, ToolRetryError):
        return f'ModelRetry: the tool asked the model for a retry ({error!r})'
    return _describe_exit(error)
