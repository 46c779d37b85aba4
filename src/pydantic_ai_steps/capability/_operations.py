"""The capability's durable operations: every store call, as a unit a durability engine can journal.

Under Temporal, DBOS or Prefect each of these runs as an activity or step, and its name (with the
capability's `id`, `'step_persistence'`) is recorded in the engine's history: the names are a
compatibility contract for workflows in flight and never change. Every timestamp and id a record
carries is produced inside an operation, so a replay reproduces them from the journal.
"""

from __future__ import annotations

import uuid
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
    utc_now,
)
from ..store.protocol import StepStore
from ._run_ids import claim_run_id


class StoreOperations(AbstractCapability[AgentDepsT]):
    """The durable operations of `StepPersistence` (a base class, so they are collected as its own)."""

    store: StepStore
    _derived_from: tuple[str | None, str | None] | None

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
        await self.store.append_event(
            step_event(
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
                tool_args=tool_args,
            )
        )

    @durable_operation(name='save_snapshot')
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
        await self.store.record_tool_effect(closed_entry(prior, run_id, tool_call_id, tool_name, status, error))


def step_event(*, event_index: int, **fields: Any) -> StepEvent:
    """An event stamped now, keyed `{event_index}:{step_index}:{kind}:{tool_call_id or ''}`."""
    key = f'{event_index}:{fields["step_index"]}:{fields["kind"]}:{fields["tool_call_id"] or ""}'
    return StepEvent(**fields, idempotency_key=key)


def continuable_snapshot(*, snapshot_index: int, **fields: Any) -> ContinuableSnapshot:
    """A snapshot stamped now, keyed `{snapshot_index}:{step_index}:{state}`."""
    return ContinuableSnapshot(**fields, idempotency_key=f'{snapshot_index}:{fields["step_index"]}:{fields["state"]}')


def closed_entry(
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
