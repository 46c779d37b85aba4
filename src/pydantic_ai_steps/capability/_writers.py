"""How a run's records reach its store: one by one (`ImmediateWriter`) or batched (`BatchingWriter`).

The capability decides *what* to record and *when* a boundary is; a writer decides how many
writes that takes. Both write a ledger entry `started` before the tool runs and a boundary's
snapshot before the next model request: that is the crash contract.

- `ImmediateWriter` writes each record on its own, through the capability's durable operations,
  so a durability engine (Temporal, DBOS, Prefect) journals every one. Used under an engine, and
  with a store that cannot write several records at once.
- `BatchingWriter` (a `RecordBatchStore`, no engine): a step's informational events and closed
  ledger entries wait for the next write that must happen anyway: the next call's `started` entry,
  or the boundary snapshot. A tool cycle is two writes instead of eight. A call's entry is closed
  with the snapshot that holds its result, so after a crash a call is `completed` only if a
  snapshot has its return. A run's opening and closing events are written at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic_ai.tools import RunContext

from .._records import CLOSING_EVENTS, ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from ..store.protocol import RecordBatchStore
from ._internals import call_operation
from ._operations import closed_entry, continuable_snapshot, step_event
from ._run_ids import claim_run_id

if TYPE_CHECKING:
    from ._persistence import StepPersistence

Fields = dict[str, Any]
"""The keyword arguments of one durable operation (`append_event`, `save_snapshot`)."""


class ImmediateWriter:
    """Every record on its own, through the durable operations."""

    defers_final_boundary = False

    def __init__(self, persistence: StepPersistence[Any]) -> None:
        self._p = persistence
        self.registered = False
        """The run's registration went through: its log is this writer's to close."""
        self.closed = False
        """A closing event (`run_completed` / `run_failed`) was written."""

    async def register(self, ctx: RunContext[Any], record: RunRecord, opening: Callable[[str], Fields]) -> str:
        p = self._p
        registration_id = await call_operation(p, ctx, 'registration_id', p._new_registration_id)  # pyright: ignore[reportPrivateUsage]
        run_id = await call_operation(
            p,
            ctx,
            'register_run',
            p._register_run,  # pyright: ignore[reportPrivateUsage]
            run_id=record.run_id,
            conversation_id=record.conversation_id,
            parent_run_id=record.parent_run_id,
            agent_name=record.agent_name,
            metadata=dict(record.metadata),
            registration_id=registration_id,
            pydantic_ai_run_id=record.pydantic_ai_run_id,
            run_metadata=dict(record.run_metadata),
            parent_tool_call_id=record.parent_tool_call_id,
            continued_from=record.continued_from,
            forked_from=record.forked_from,
        )
        self.registered = True
        await self.event(ctx, opening(run_id), now=True)
        return run_id

    async def event(self, ctx: RunContext[Any], fields: Fields, *, now: bool) -> None:
        del now  # every event is written at once
        p = self._p
        await call_operation(p, ctx, 'append_event', p._append_event, **fields)  # pyright: ignore[reportPrivateUsage]
        if fields['kind'] in CLOSING_EVENTS:
            self.closed = True

    async def tool_started(self, ctx: RunContext[Any], run_id: str, call_id: str, name: str, event: Fields) -> None:
        """The ledger entry, then the `tool_call_started` event: both before the tool runs."""
        p = self._p
        await call_operation(p, ctx, 'record_tool_effect', p._record_tool_started, run_id, call_id, name)  # pyright: ignore[reportPrivateUsage]
        await self.event(ctx, event, now=True)

    async def tool_closed(
        self,
        ctx: RunContext[Any],
        run_id: str,
        call_id: str,
        name: str,
        status: Literal['completed', 'failed'],
        error: str | None,
    ) -> None:
        p = self._p
        await call_operation(
            p,
            ctx,
            'finish_tool_effect',
            p._finish_tool_effect,  # pyright: ignore[reportPrivateUsage]
            run_id,
            call_id,
            name,
            status,
            error,
        )

    async def snapshot(self, ctx: RunContext[Any], fields: Fields, *, defer: bool = False) -> None:
        del defer  # written at once
        p = self._p
        await call_operation(p, ctx, 'save_snapshot', p._save_snapshot, **fields)  # pyright: ignore[reportPrivateUsage]

    async def flush(self) -> None:
        return None

    def annotated(self, record: ToolEffectRecord) -> None:
        del record  # the entry is read back when it is closed


class BatchingWriter:
    """Records wait for the next write that must happen anyway; see the module docs."""

    defers_final_boundary = True
    """The last boundary's snapshot waits for `run_completed`, so a run ends in one write."""

    def __init__(self, persistence: StepPersistence[Any], store: RecordBatchStore) -> None:
        self._p = persistence
        self._store = store
        self.registered = False
        self.closed = False
        self._events: list[StepEvent] = []
        self._effects: list[ToolEffectRecord] = []
        self._open: dict[str, ToolEffectRecord] = {}
        """The ledger entry of each tool call in flight, as last written."""
        self._deferred: ContinuableSnapshot | None = None

    async def register(self, ctx: RunContext[Any], record: RunRecord, opening: Callable[[str], Fields]) -> str:
        """The registration and `run_started` in one write."""
        store = self._store

        async def register(candidate: RunRecord) -> None:
            await store.write_records(run=candidate, events=[step_event(**opening(candidate.run_id))])

        record.registration_id = str(uuid.uuid4())
        run_id = await claim_run_id(store, record, register, self._p._derived_from)  # pyright: ignore[reportPrivateUsage]
        self.registered = True
        return run_id

    async def event(self, ctx: RunContext[Any], fields: Fields, *, now: bool) -> None:
        self._events.append(step_event(**fields))
        if fields['kind'] in CLOSING_EVENTS:
            self.closed = True
        if now:
            await self.flush()

    async def tool_started(self, ctx: RunContext[Any], run_id: str, call_id: str, name: str, event: Fields) -> None:
        """The ledger entry with the events recorded since the last write, `tool_call_started` last."""
        self._events.append(step_event(**event))
        started = ToolEffectRecord(tool_call_id=call_id, tool_name=name, run_id=run_id, status='started')
        self._open[call_id] = started
        await self._write(tool_effects=[started])

    async def tool_closed(
        self,
        ctx: RunContext[Any],
        run_id: str,
        call_id: str,
        name: str,
        status: Literal['completed', 'failed'],
        error: str | None,
    ) -> None:
        """Known without reading it back: this run wrote it, and `annotated` saw any rewrite."""
        prior = self._open.pop(call_id, None)
        self._effects.append(closed_entry(prior, run_id, call_id, name, status, error))

    async def snapshot(self, ctx: RunContext[Any], fields: Fields, *, defer: bool = False) -> None:
        """Written now, or with `defer` by the next write that must happen anyway (a run's input)."""
        if defer:
            self._deferred = continuable_snapshot(**fields)
            return
        await self._write(snapshot=continuable_snapshot(**fields))

    async def flush(self) -> None:
        await self._write()

    def annotated(self, record: ToolEffectRecord) -> None:
        if record.tool_call_id in self._open:
            self._open[record.tool_call_id] = record

    @property
    def has_closed_entries(self) -> bool:
        return bool(self._effects)

    async def _write(
        self, *, snapshot: ContinuableSnapshot | None = None, tool_effects: list[ToolEffectRecord] | None = None
    ) -> None:
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            if snapshot is None:
                snapshot = deferred
            else:  # two snapshots: the earlier one goes first, on its own
                await self._write(snapshot=deferred)
        events, effects = self._events, self._effects
        self._events, self._effects = [], []
        try:
            await self._store.write_records(
                snapshot=snapshot, tool_effects=[*effects, *(tool_effects or ())], events=events
            )
        except BaseException:
            # Keep them for the write that closes the run (idempotency keys make a repeat
            # harmless), except a `run_completed`: a run whose last write failed did not complete.
            kept = [event for event in events if event.kind != 'run_completed']
            if len(kept) < len(events):
                self.closed = False
            self._events[:0] = kept
            self._effects[:0] = effects
            raise


Writer = ImmediateWriter | BatchingWriter
