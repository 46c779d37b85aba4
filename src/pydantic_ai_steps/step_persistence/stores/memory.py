"""`InMemoryStepStore`: process-local, for tests and short-lived agents."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage

from .._errors import RunAlreadyExistsError, check_max_snapshots
from .._history import HistoryTracker
from .._records import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from .._retention import snapshots_to_keep


class InMemoryStepStore:
    """Keeps everything in dictionaries of this process.

    Snapshots hold private copies of their messages, and a message that did not change between
    boundaries is shared by the snapshots that contain it, so a long run costs memory in
    proportion to its history, not to its history times its steps. Reads return fresh copies,
    so a caller (or a continued run) mutating them cannot rewrite what was saved.
    """

    def __init__(self, *, max_snapshots_per_run: int | None = None) -> None:
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self._runs: dict[str, RunRecord] = {}
        self._events: dict[str, list[StepEvent]] = {}
        self._event_keys: dict[str, set[str]] = {}
        self._snapshots: dict[str, list[tuple[int, ContinuableSnapshot]]] = {}
        self._snapshot_seq: dict[str, int] = {}
        self._snapshot_keys: dict[str, set[str]] = {}
        self._effects: dict[tuple[str, str], ToolEffectRecord] = {}
        self._history: HistoryTracker[ModelMessage] = HistoryTracker()

    def __repr__(self) -> str:
        return f'InMemoryStepStore(runs={len(self._runs)}, max_snapshots_per_run={self.max_snapshots_per_run})'

    async def register_run(self, record: RunRecord) -> None:
        if record.run_id in self._runs:
            raise RunAlreadyExistsError(record.run_id)
        self._runs[record.run_id] = copy.copy(record)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        record = self._runs.get(run_id)
        return copy.copy(record) if record is not None else None

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        matches = [
            copy.copy(record)
            for record in self._runs.values()
            if (parent_run_id is None or record.parent_run_id == parent_run_id)
            and (conversation_id is None or record.conversation_id == conversation_id)
        ]
        matches.sort(key=lambda record: record.started_at)
        return matches

    async def append_event(self, event: StepEvent) -> None:
        key = event.idempotency_key
        if key is not None:
            keys = self._event_keys.setdefault(event.run_id, set())
            if key in keys:
                return
            keys.add(key)
        self._events.setdefault(event.run_id, []).append(copy.copy(event))

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        return [copy.copy(event) for event in self._events.get(run_id, [])]

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        run_id = snapshot.run_id
        key = snapshot.idempotency_key
        if key is not None:
            keys = self._snapshot_keys.setdefault(run_id, set())
            if key in keys:
                return
            keys.add(key)
        delta = self._history.delta(run_id, snapshot.messages)
        copies: dict[int, ModelMessage] = {}
        for position in delta.candidates:
            message = delta.messages[position]
            stored = delta.stored_at(position)
            copies[position] = stored if stored is not None and stored == message else copy.deepcopy(message)
        private = self._history.commit(delta, copies, 0)
        seq = self._snapshot_seq.get(run_id, 0) + 1
        self._snapshot_seq[run_id] = seq
        saved = copy.copy(snapshot)
        saved.messages = list(private)
        entries = self._snapshots.setdefault(run_id, [])
        entries.append((seq, saved))
        keep = snapshots_to_keep(((s, snap.state) for s, snap in entries), self.max_snapshots_per_run)
        if keep is not None:
            entries[:] = [(s, snap) for s, snap in entries if s in keep]

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None:
        """The run, the snapshot, the tool effects, then the events (see `RecordBatchStore`)."""
        if run is not None:
            await self.register_run(run)
        if snapshot is not None:
            await self.save_snapshot(snapshot)
        for record in tool_effects:
            await self.record_tool_effect(record)
        for event in events:
            await self.append_event(event)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        for _, snapshot in reversed(self._snapshots.get(run_id, [])):
            if include_interrupted or snapshot.state == 'complete':
                return _fresh(snapshot)
        return None

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return [
            _fresh(snapshot)
            for _, snapshot in self._snapshots.get(run_id, [])
            if include_interrupted or snapshot.state == 'complete'
        ]

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._effects[(record.run_id, record.tool_call_id)] = copy.copy(record)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        record = self._effects.get((run_id, tool_call_id))
        return copy.copy(record) if record is not None else None

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return [
            copy.copy(record)
            for (owner, _), record in self._effects.items()
            if owner == run_id and record.status == 'started'
        ]


def _fresh(snapshot: ContinuableSnapshot) -> ContinuableSnapshot:
    fresh = copy.copy(snapshot)
    fresh.messages = copy.deepcopy(snapshot.messages)
    return fresh
