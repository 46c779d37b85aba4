"""How a run's records reach its store: one by one (`ImmediateWriter`) or batched (`BatchingWriter`).

The capability decides *what* to record and *when* a boundary is; a writer decides how many
writes that takes. Both write a ledger entry `started` before the tool runs and a boundary's
snapshot before the next model request: that is the crash contract.

- `BatchingWriter`: a step's informational events and closed ledger entries wait for the next
  write that must happen anyway: the next call's `started` entry, or the boundary snapshot. A tool
  cycle is two writes instead of eight. A call's entry is closed with the snapshot that holds its
  result, so after a crash a call is `completed` only if a snapshot has its return. A run's
  closing events are written at once; its registration (with `run_started`) too, unless the sink
  defers it. Where a write goes is its sink:
  - `StoreSink` (no engine journals this run, a `RecordBatchStore`): straight to the store, whose
    own encoder decides what a snapshot adds to the message log. It defers the registration to
    the run's first model request, where it goes in one write with the run's input (the history
    and prompt of that request), so a process killed while the model is first asked leaves the
    run with a continuable point, for no write more;
  - `OperationSink` (under a durability engine): each write is one `write_records` durable
    operation. What the writer buffers between writes is rebuilt when the engine replays the
    hooks, so buffering loses nothing; the snapshot's delta (new and changed positions) is decided
    here, in workflow code, from the hooks' messages alone, so a replay sends the same operations,
    and each operation carries what is new, not the whole history. The registration is written in
    `before_run`, as the journals of runs in flight recorded it (after a crash the engine resumes
    the run itself).
- `ImmediateWriter` writes each record on its own, through the single-record durable operations:
  for a store without `write_records` and no engine, and to replay a workflow recorded before
  `write_records` existed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic_ai.tools import RunContext

from .._records import CLOSING_EVENTS, ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, utc_now
from ..store.message_log import DEFAULT_MEDIA_THRESHOLD, MessageLog, PreparedSnapshot
from ..store.protocol import DeltaSnapshotStore, RecordBatchStore, StepStore
from ._internals import call_operation, run_clock
from ._operations import (
    BatchResult,
    EffectNote,
    EventNote,
    RegistrationNote,
    SnapshotNote,
    closed_entry,
    continuable_snapshot,
    event_record,
)
from ._run_ids import claim_run_id

if TYPE_CHECKING:
    from ._persistence import StepPersistence

Fields = dict[str, Any]
"""The keyword arguments of the `save_snapshot` durable operation."""


class ImmediateWriter:
    """Every record on its own, through the durable operations."""

    defers_final_boundary = False

    def __init__(self, persistence: StepPersistence[Any], ctx: RunContext[Any]) -> None:
        self._p = persistence
        self.clock = run_clock(ctx)
        """Stamps the events the capability records; the operations stamp what they store."""
        self.registered = False
        """The run's registration went through: its log is this writer's to close."""
        self.closed = False
        """A closing event (`run_completed` / `run_failed`) was written."""

    registration_pending = False
    """Registered in `before_run`: the input waits for the first tool call or a failure."""

    async def register(self, ctx: RunContext[Any], record: RunRecord, opening: EventNote) -> None:
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
        p._stored_as(run_id)  # pyright: ignore[reportPrivateUsage]
        await self.event(ctx, opening, now=True)

    async def event(self, ctx: RunContext[Any], event: EventNote, *, now: bool) -> None:
        del now  # every event is written at once
        p = self._p
        await call_operation(
            p,
            ctx,
            'append_event',
            p._append_event,  # pyright: ignore[reportPrivateUsage]
            run_id=p._run_id,  # pyright: ignore[reportPrivateUsage]
            kind=event.kind,
            step_index=event.step_index,
            conversation_id=ctx.conversation_id,
            parent_run_id=p.parent_run_id,
            agent_name=p.agent_name,
            tool_call_id=event.tool_call_id,
            tool_name=event.tool_name,
            error=event.error,
            metadata=dict(p.metadata),
            event_index=event.event_index,
            tool_args=event.tool_args,
        )
        if event.kind in CLOSING_EVENTS:
            self.closed = True

    async def tool_started(self, ctx: RunContext[Any], run_id: str, call_id: str, name: str, event: EventNote) -> None:
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

    async def flush(self, ctx: RunContext[Any]) -> None:
        del ctx

    def annotated(self, record: ToolEffectRecord) -> None:
        del record  # the entry is read back when it is closed


class Sink(Protocol):
    """Where a `BatchingWriter`'s writes go."""

    clock: Callable[[], datetime]
    """Stamps the records: the engine's replay-safe clock where it has one."""
    defers_registration: bool
    """The registration waits for the run's first model request, to go with its input."""

    async def register(
        self,
        ctx: RunContext[Any],
        record: RunRecord,
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> str:
        """Register the run with the first records written (`run_started` first); return the id it
        was stored under."""
        ...

    async def write(
        self,
        ctx: RunContext[Any],
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> None: ...


class StoreSink:
    """Writes straight to a `RecordBatchStore` (no engine journals this run)."""

    def __init__(self, persistence: StepPersistence[Any], store: RecordBatchStore) -> None:
        self._p = persistence
        self._store = store
        self.clock: Callable[[], datetime] = utc_now

    defers_registration = True

    async def register(
        self,
        ctx: RunContext[Any],
        record: RunRecord,
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> str:
        """One `write_records`; a derived id drawn again after a clash goes on every record of it."""
        store = self._store

        async def register(candidate: RunRecord) -> None:
            run_id = candidate.run_id
            await store.write_records(
                run=candidate,
                snapshot=continuable_snapshot(**_of_run(snapshot, run_id)) if snapshot is not None else None,
                tool_effects=[replace(effect, run_id=run_id) for effect in tool_effects],
                events=self._records(ctx, run_id, events),
            )

        record.registration_id = str(uuid.uuid4())
        return await claim_run_id(store, record, register, self._p._derived_from)  # pyright: ignore[reportPrivateUsage]

    async def write(
        self,
        ctx: RunContext[Any],
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> None:
        await self._store.write_records(
            snapshot=continuable_snapshot(**snapshot) if snapshot is not None else None,
            tool_effects=tool_effects,
            events=self._records(ctx, self._p._run_id, events),  # pyright: ignore[reportPrivateUsage]
        )

    def _records(self, ctx: RunContext[Any], run_id: str, events: list[EventNote]) -> list[StepEvent]:
        p = self._p
        return [
            event_record(event, run_id, ctx.conversation_id, p.parent_run_id, p.agent_name, p.metadata)
            for event in events
        ]


class OperationSink:
    """Each write is one `write_records` durable operation (under a durability engine).

    Runs in workflow code: it decides a snapshot's delta with a message-once encoder of its own
    (`MessageLog` without a media store: it serializes only what may have changed, and patches a
    re-stamped message against the text the store reported storing as sent), from the hooks'
    messages and the log sizes earlier operations returned (replayed from the journal), so a replay
    computes the same operations. For a store without `write_snapshot_delta` every snapshot carries
    the whole history (as texts).
    """

    def __init__(self, persistence: StepPersistence[Any], ctx: RunContext[Any], store: StepStore) -> None:
        self._p = persistence
        self.clock = run_clock(ctx)
        self._deltas = isinstance(store, DeltaSnapshotStore)
        self._log = MessageLog(None, DEFAULT_MEDIA_THRESHOLD, serialized_full_texts=True)

    defers_registration = False

    async def register(
        self,
        ctx: RunContext[Any],
        record: RunRecord,
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> str:
        """Written in `before_run` (never deferred), so it carries `run_started` alone."""
        assert snapshot is None and not tool_effects, 'an engine run registers before it writes anything else'
        p = self._p
        registration_id = await call_operation(p, ctx, 'registration_id', p._new_registration_id)  # pyright: ignore[reportPrivateUsage]
        registration = RegistrationNote(
            registration_id=registration_id,
            started_at=events[0].timestamp,
            pydantic_ai_run_id=record.pydantic_ai_run_id,
            run_metadata=dict(record.run_metadata),
            parent_tool_call_id=record.parent_tool_call_id,
            continued_from=record.continued_from,
            forked_from=record.forked_from,
            derived_from=p._derived_from,  # pyright: ignore[reportPrivateUsage]
        )
        result = await self._call(ctx, record.run_id, registration=registration, events=events)
        return result.run_id

    async def write(
        self,
        ctx: RunContext[Any],
        snapshot: Fields | None,
        tool_effects: list[ToolEffectRecord],
        events: list[EventNote],
    ) -> None:
        run_id = self._p._run_id  # pyright: ignore[reportPrivateUsage]
        notes = [_effect_note(record) for record in tool_effects]
        event_notes = list(events)
        if snapshot is None:
            await self._call(ctx, run_id, tool_effects=notes, events=event_notes)
            return
        prepared, note = await self._prepare(run_id, snapshot)
        try:
            result = await self._call(ctx, run_id, snapshot=note, tool_effects=notes, events=event_notes)
            if result.stale:  # the store's log moved on without this run: send the whole history
                self._log.forget(run_id)
                prepared, note = await self._prepare(run_id, snapshot)
                result = await self._call(ctx, run_id, snapshot=note, tool_effects=notes, events=event_notes)
        except BaseException:
            self._log.forget(run_id)  # the outcome is unknown: the next snapshot is sent whole
            raise
        if result.stale or result.log_size is None:
            self._log.forget(run_id)
        else:
            self._log.committed(prepared, result.log_size, frozenset(result.verbatim))

    async def _prepare(self, run_id: str, fields: Fields) -> tuple[PreparedSnapshot, SnapshotNote]:
        if not self._deltas:
            self._log.forget(run_id)  # every position in full, for a store that takes whole histories
        whole = ContinuableSnapshot(
            run_id=run_id, step_index=fields['step_index'], messages=fields['messages'], timestamp=fields['timestamp']
        )
        prepared = await self._log.prepare(whole)
        note = SnapshotNote(
            step_index=fields['step_index'],
            state=fields['state'],
            snapshot_index=fields['snapshot_index'],
            timestamp=fields['timestamp'],
            message_count=prepared.message_count,
            appends=prepared.appends,
            expected_log_size=prepared.known_log_size if self._deltas else None,
        )
        return prepared, note

    async def _call(self, ctx: RunContext[Any], run_id: str, **batch: Any) -> BatchResult:
        p = self._p
        return await call_operation(
            p,
            ctx,
            'write_records',
            p._write_records,  # pyright: ignore[reportPrivateUsage]
            run_id=run_id,
            conversation_id=ctx.conversation_id,
            parent_run_id=p.parent_run_id,
            agent_name=p.agent_name,
            metadata=dict(p.metadata),
            **batch,
        )


def _of_run(fields: Fields, run_id: str) -> Fields:
    return {**fields, 'run_id': run_id}


def _effect_note(record: ToolEffectRecord) -> EffectNote:
    return EffectNote(
        tool_call_id=record.tool_call_id,
        tool_name=record.tool_name,
        status=record.status,
        started_at=record.started_at,
        ended_at=record.ended_at,
        idempotency_key=record.idempotency_key,
        effect_summary=record.effect_summary,
        keep_annotation=record.status != 'started',
    )


class BatchingWriter:
    """Records wait for the next write that must happen anyway; see the module docs."""

    defers_final_boundary = True
    """The last boundary's snapshot waits for `run_completed`, so a run ends in one write."""

    def __init__(self, persistence: StepPersistence[Any], sink: Sink) -> None:
        self._p = persistence
        self._sink = sink
        self.clock = sink.clock
        self.registered = False
        self.closed = False
        self._events: list[EventNote] = []
        self._effects: list[ToolEffectRecord] = []
        self._open: dict[str, ToolEffectRecord] = {}
        """The ledger entry of each tool call in flight, as last written."""
        self._deferred: Fields | None = None
        self._registration: RunRecord | None = None
        """The run's record until the write that registers it."""

    @property
    def registration_pending(self) -> bool:
        """The sink defers the registration and nothing was written yet: the next write registers the run."""
        return self._registration is not None

    async def register(self, ctx: RunContext[Any], record: RunRecord, opening: EventNote) -> None:
        """The registration and `run_started` in one write: now, or with the next one if the sink defers it."""
        record.started_at = opening.timestamp
        self._events.append(opening)
        self._registration = record
        self.registered = True  # the run's log is this writer's to close, if need be with the registration
        if not self._sink.defers_registration:
            await self._write(ctx)

    async def event(self, ctx: RunContext[Any], event: EventNote, *, now: bool) -> None:
        self._events.append(event)
        if event.kind in CLOSING_EVENTS:
            self.closed = True
        if now:
            await self.flush(ctx)

    async def tool_started(self, ctx: RunContext[Any], run_id: str, call_id: str, name: str, event: EventNote) -> None:
        """The ledger entry with the events recorded since the last write, `tool_call_started` last."""
        self._events.append(event)
        started = ToolEffectRecord(
            tool_call_id=call_id, tool_name=name, run_id=run_id, status='started', started_at=event.timestamp
        )
        self._open[call_id] = started
        await self._write(ctx, tool_effects=[started], close_entries=False)

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
        self._effects.append(closed_entry(prior, run_id, call_id, name, status, error, self._sink.clock()))

    async def snapshot(self, ctx: RunContext[Any], fields: Fields, *, defer: bool = False) -> None:
        """Written now, or with `defer` by the next write that must happen anyway (a run's input)."""
        stamped = {**fields, 'timestamp': self._sink.clock()}
        if defer:
            self._deferred = stamped
            return
        await self._write(ctx, snapshot=stamped)

    async def flush(self, ctx: RunContext[Any]) -> None:
        await self._write(ctx)

    def annotated(self, record: ToolEffectRecord) -> None:
        if record.tool_call_id in self._open:
            self._open[record.tool_call_id] = record

    @property
    def has_closed_entries(self) -> bool:
        return bool(self._effects)

    async def _write(
        self,
        ctx: RunContext[Any],
        *,
        snapshot: Fields | None = None,
        tool_effects: list[ToolEffectRecord] | None = None,
        close_entries: bool = True,
    ) -> None:
        """Write what waits, with `snapshot` and `tool_effects`. A `started` write (not
        `close_entries`) leaves the closed entries waiting: a sibling call of the same response may
        have ended before it, and no snapshot holds that call's return yet."""
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            if snapshot is None:
                snapshot = deferred
            else:  # two snapshots: the earlier one goes first, on its own
                await self._write(ctx, snapshot=deferred)
        events, self._events = self._events, []
        effects: list[ToolEffectRecord] = []
        if close_entries:
            effects, self._effects = self._effects, []
        registration, self._registration = self._registration, None
        entries = [*effects, *(tool_effects or ())]
        try:
            if registration is None:
                await self._sink.write(ctx, snapshot, entries, events)
            else:
                run_id = await self._sink.register(ctx, registration, snapshot, entries, events)
                self._p._stored_as(run_id)  # pyright: ignore[reportPrivateUsage]
        except BaseException:
            if registration is not None:
                self.registered = False  # nothing of the run was written: no log to close
                raise
            # Keep them for the write that closes the run (idempotency keys make a repeat
            # harmless), except a `run_completed`: a run whose last write failed did not complete.
            kept = [event for event in events if event.kind != 'run_completed']
            if len(kept) < len(events):
                self.closed = False
            self._events[:0] = kept
            self._effects[:0] = effects
            raise


Writer = ImmediateWriter | BatchingWriter
