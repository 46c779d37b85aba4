"""The capability's durable operations: every store call, as a unit a durability engine can journal.

Under Temporal, DBOS or Prefect each of these runs as an activity or step, and its name (with the
capability's `id`, `'step_persistence'`) is recorded in the engine's history: the names, and the
arguments each takes, are a compatibility contract for workflows in flight and never change. An
operation whose arguments must change gets a new name instead; the old one stays for the
workflows that recorded it.

- `write_records` (the current one): a batch of records as one store write: a registration, the
  events and ledger entries recorded since the last write, and a snapshot given as what it adds
  to the run's message log (`SnapshotNote`: new and changed positions only, decided in workflow
  code), so what an operation carries is O(what is new). Two per tool cycle.
- `registration_id`, `register_run`, `append_event`, `save_snapshot` (the whole history),
  `record_tool_effect`, `finish_tool_effect`: one store call each, as written by the releases
  before `write_records`. Workflows whose history holds them replay them (Temporal's patch
  marker `pydantic-ai-steps:write-records`, or under DBOS the recorded steps, tell the two
  apart); runs without an engine whose store lacks `write_records` use them too.
  `registration_id` is shared by both.

Ids are drawn inside an operation (`registration_id`), so a replay reproduces them from the
journal. Times: the single-record operations stamp their records inside the operation;
`write_records` carries the times the hooks saw, from the run's clock (Temporal's replay-safe
workflow clock under Temporal).

The argument types are small dataclasses of plain fields, deliberately: an engine builds a schema
for every operation when the agent is constructed, and one over pydantic-ai's message types takes
seconds. Message histories cross as JSON texts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.tools import AgentDepsT

from .._records import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
    utc_now,
)
from ..store.history import messages_from_json
from ..store.protocol import DeltaSnapshotStore, RecordBatchStore, SnapshotDelta, StepStore
from ._internals import refusals_are_final
from ._run_ids import claim_run_id

# --- the arguments of `write_records` --------------------------------------------------------------


@dataclass(kw_only=True)
class EventNote:
    """An event of the batch; the run's own fields (conversation, agent, metadata) are the batch's."""

    kind: EventKind
    step_index: int
    event_index: int
    timestamp: datetime
    tool_call_id: str | None = None
    tool_name: str | None = None
    error: str | None = None
    tool_args: str | None = None


@dataclass(kw_only=True)
class EffectNote:
    """A ledger entry of the batch."""

    tool_call_id: str
    tool_name: str
    status: ToolEffectStatus
    started_at: datetime
    ended_at: datetime | None = None
    idempotency_key: str | None = None
    effect_summary: str | None = None
    keep_annotation: bool = False
    """A closing entry: keep the idempotency key and summary the stored entry gained while the tool
    ran (`annotate_tool_effect`, which under Temporal writes from the tool's activity)."""


@dataclass(kw_only=True)
class SnapshotNote:
    """A snapshot as what it adds to the run's message log, decided in workflow code.

    `appends` are `(position, text)` for the new and changed positions: full message JSON, or a
    patch of a full text the store reported stored verbatim. For a store without
    `write_snapshot_delta` every position is sent in full, in order, and `expected_log_size` is
    `None`.
    """

    step_index: int
    state: SnapshotState
    snapshot_index: int
    timestamp: datetime
    message_count: int
    appends: list[tuple[int, str]]
    expected_log_size: int | None = None


@dataclass(kw_only=True)
class RegistrationNote:
    """The run's registration: claimed inside the operation, so a clash draws a derived id again there."""

    registration_id: str
    started_at: datetime
    pydantic_ai_run_id: str | None = None
    run_metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    parent_tool_call_id: str | None = None
    continued_from: SnapshotRef | None = None
    forked_from: SnapshotRef | None = None
    derived_from: tuple[str | None, str | None] | None = None


@dataclass(kw_only=True)
class BatchResult:
    """What `write_records` did: the run id (claimed, for a registration) and where the log ends."""

    run_id: str
    log_size: int | None = None
    """After the snapshot's appends; `None` without a snapshot or for a store without deltas."""
    verbatim: list[int] = field(default_factory=list[int])
    """Offsets of the appends stored exactly as sent (the texts later snapshots may patch)."""
    stale: bool = False
    """The store's log did not end at `expected_log_size`: nothing was written; send the whole history."""


class StoreOperations(AbstractCapability[AgentDepsT]):
    """The durable operations of `StepPersistence` (a base class, so they are collected as its own)."""

    store: StepStore
    _derived_from: tuple[str | None, str | None] | None

    @durable_operation(name='registration_id')
    async def _new_registration_id(self) -> str:
        return str(uuid.uuid4())

    @durable_operation(name='register_run')
    @refusals_are_final
    async def _register_run(
        self,
        *,
        run_id: str,
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        metadata: dict[str, str],
        registration_id: str,
        pydantic_ai_run_id: str | None = None,
        run_metadata: dict[str, Any] | None = None,
        parent_tool_call_id: str | None = None,
        continued_from: SnapshotRef | None = None,
        forked_from: SnapshotRef | None = None,
    ) -> str:
        """Claim the run id; a derived id that clashes with an earlier run is drawn again."""
        record = RunRecord(
            run_id=run_id,
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            metadata=dict(metadata),
            registration_id=registration_id,
            pydantic_ai_run_id=pydantic_ai_run_id,
            run_metadata=dict(run_metadata or {}),
            parent_tool_call_id=parent_tool_call_id,
            continued_from=continued_from,
            forked_from=forked_from,
        )
        return await claim_run_id(self.store, record, self.store.register_run, self._derived_from)

    @durable_operation(name='append_event')
    @refusals_are_final
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
        tool_args: str | None = None,
    ) -> None:
        note = EventNote(
            kind=kind,
            step_index=step_index,
            event_index=event_index,
            timestamp=utc_now(),
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            error=error,
            tool_args=tool_args,
        )
        await self.store.append_event(event_record(note, run_id, conversation_id, parent_run_id, agent_name, metadata))

    @durable_operation(name='save_snapshot')
    @refusals_are_final
    async def _save_snapshot(
        self,
        *,
        run_id: str,
        step_index: int,
        messages: list[Any],
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        state: SnapshotState = 'complete',
        snapshot_index: int,
    ) -> None:
        """`messages` is typed loosely so the engine's schema for it costs nothing at agent construction
        (one over pydantic-ai's message types takes seconds to build); it crosses as pydantic-ai's JSON
        form (Temporal) or as the message objects (DBOS), and is validated here."""
        await self.store.save_snapshot(
            continuable_snapshot(
                run_id=run_id,
                step_index=step_index,
                messages=ModelMessagesTypeAdapter.validate_python(messages),
                conversation_id=conversation_id,
                parent_run_id=parent_run_id,
                agent_name=agent_name,
                state=state,
                snapshot_index=snapshot_index,
            )
        )

    @durable_operation(name='record_tool_effect')
    @refusals_are_final
    async def _record_tool_started(self, run_id: str, tool_call_id: str, tool_name: str) -> None:
        await self.store.record_tool_effect(
            ToolEffectRecord(tool_call_id=tool_call_id, tool_name=tool_name, run_id=run_id, status='started')
        )

    @durable_operation(name='finish_tool_effect')
    @refusals_are_final
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
        await self.store.record_tool_effect(closed_entry(prior, run_id, tool_call_id, tool_name, status, error))

    @durable_operation(name='write_records')
    @refusals_are_final
    async def _write_records(
        self,
        *,
        run_id: str,
        conversation_id: str | None,
        parent_run_id: str | None,
        agent_name: str | None,
        metadata: dict[str, str],
        registration: RegistrationNote | None = None,
        snapshot: SnapshotNote | None = None,
        tool_effects: list[EffectNote] | None = None,
        events: list[EventNote] | None = None,
    ) -> BatchResult:
        """One batch as one store write (several calls for a store without `write_records`).

        Everything is keyed, so running it again after it committed (an engine that did not record
        the first attempt) changes nothing: events and snapshots by idempotency key, ledger entries
        by upsert, the registration by its id.
        """
        store = self.store
        lineage: dict[str, Any] = {
            'conversation_id': conversation_id,
            'parent_run_id': parent_run_id,
            'agent_name': agent_name,
        }
        event_records = [
            event_record(note, run_id, conversation_id, parent_run_id, agent_name, metadata) for note in events or ()
        ]
        if registration is not None:
            record = RunRecord(
                run_id=run_id,
                **lineage,
                metadata=dict(metadata),
                started_at=registration.started_at,
                registration_id=registration.registration_id,
                pydantic_ai_run_id=registration.pydantic_ai_run_id,
                run_metadata=dict(registration.run_metadata),
                parent_tool_call_id=registration.parent_tool_call_id,
                continued_from=registration.continued_from,
                forked_from=registration.forked_from,
            )

            with_events: set[str] = set()

            async def register(candidate: RunRecord) -> None:
                if isinstance(store, RecordBatchStore):
                    opening = [replace(event, run_id=candidate.run_id) for event in event_records]
                    await store.write_records(run=candidate, events=opening)
                    with_events.add(candidate.run_id)
                else:
                    await store.register_run(candidate)

            claimed = await claim_run_id(store, record, register, registration.derived_from)
            if claimed not in with_events:  # single calls, or a retry that found the run registered, maybe without them
                await _write(store, None, [], [replace(event, run_id=claimed) for event in event_records])
            return BatchResult(run_id=claimed)
        effects = [await self._effect(run_id, note) for note in tool_effects or ()]
        if snapshot is None:
            await _write(store, None, effects, event_records)
            return BatchResult(run_id=run_id)
        key = snapshot_key(snapshot.snapshot_index, snapshot.step_index, snapshot.state)
        if isinstance(store, DeltaSnapshotStore):
            delta = SnapshotDelta(
                run_id=run_id,
                **lineage,
                step_index=snapshot.step_index,
                message_count=snapshot.message_count,
                appends=snapshot.appends,
                expected_log_size=snapshot.expected_log_size,
                state=snapshot.state,
                timestamp=snapshot.timestamp,
                idempotency_key=key,
            )
            outcome = await store.write_snapshot_delta(delta, tool_effects=effects, events=event_records)
            if outcome.log_size is None:
                return BatchResult(run_id=run_id, stale=True)
            return BatchResult(run_id=run_id, log_size=outcome.log_size, verbatim=list(outcome.verbatim))
        texts = dict(snapshot.appends)
        if sorted(texts) != list(range(snapshot.message_count)):
            raise ValueError(
                f'a snapshot for a store without write_snapshot_delta must carry every position in full; '
                f'got {len(texts)} of {snapshot.message_count}'
            )
        whole = ContinuableSnapshot(
            run_id=run_id,
            **lineage,
            step_index=snapshot.step_index,
            messages=messages_from_json(texts[position] for position in range(snapshot.message_count)),
            timestamp=snapshot.timestamp,
            state=snapshot.state,
            idempotency_key=key,
        )
        await _write(store, whole, effects, event_records)
        return BatchResult(run_id=run_id)

    async def _effect(self, run_id: str, note: EffectNote) -> ToolEffectRecord:
        record = ToolEffectRecord(
            tool_call_id=note.tool_call_id,
            tool_name=note.tool_name,
            run_id=run_id,
            status=note.status,
            started_at=note.started_at,
            ended_at=note.ended_at,
            idempotency_key=note.idempotency_key,
            effect_summary=note.effect_summary,
        )
        if note.keep_annotation:
            prior = await self.store.get_tool_effect(run_id=run_id, tool_call_id=note.tool_call_id)
            if prior is not None:
                record.idempotency_key = prior.idempotency_key or record.idempotency_key
                record.effect_summary = prior.effect_summary or record.effect_summary
        return record


async def _write(
    store: StepStore, snapshot: ContinuableSnapshot | None, effects: list[ToolEffectRecord], events: list[StepEvent]
) -> None:
    """`write_records`, or for a store that only has the single calls, those, in the same order."""
    if isinstance(store, RecordBatchStore):
        await store.write_records(snapshot=snapshot, tool_effects=effects, events=events)
        return
    if snapshot is not None:
        await store.save_snapshot(snapshot)
    for effect in effects:
        await store.record_tool_effect(effect)
    for event in events:
        await store.append_event(event)


def snapshot_key(snapshot_index: int, step_index: int, state: str) -> str:
    return f'{snapshot_index}:{step_index}:{state}'


def event_record(
    note: EventNote,
    run_id: str,
    conversation_id: str | None,
    parent_run_id: str | None,
    agent_name: str | None,
    metadata: dict[str, str],
) -> StepEvent:
    """The event of the run that `note` describes, keyed `{event_index}:{step_index}:{kind}:{tool_call_id or ''}`."""
    return StepEvent(
        run_id=run_id,
        kind=note.kind,
        step_index=note.step_index,
        timestamp=note.timestamp,
        conversation_id=conversation_id,
        parent_run_id=parent_run_id,
        agent_name=agent_name,
        tool_call_id=note.tool_call_id,
        tool_name=note.tool_name,
        error=note.error,
        metadata=dict(metadata),
        idempotency_key=f'{note.event_index}:{note.step_index}:{note.kind}:{note.tool_call_id or ""}',
        tool_args=note.tool_args,
    )


def continuable_snapshot(*, snapshot_index: int, **fields: Any) -> ContinuableSnapshot:
    """A snapshot stamped now, keyed `{snapshot_index}:{step_index}:{state}`."""
    return ContinuableSnapshot(
        **fields, idempotency_key=snapshot_key(snapshot_index, fields['step_index'], fields['state'])
    )


def closed_entry(
    prior: ToolEffectRecord | None,
    run_id: str,
    tool_call_id: str,
    tool_name: str,
    status: Literal['completed', 'failed'],
    error: str | None,
    now: datetime | None = None,
) -> ToolEffectRecord:
    """A closed ledger entry that keeps what `annotate_tool_effect` added while the tool ran."""
    ended = now if now is not None else utc_now()
    return ToolEffectRecord(
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        run_id=run_id,
        status=status,
        started_at=prior.started_at if prior is not None else ended,
        ended_at=ended,
        idempotency_key=prior.idempotency_key if prior is not None else None,
        effect_summary=prior.effect_summary if prior is not None and prior.effect_summary else error,
    )
