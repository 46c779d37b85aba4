"""The one encoding of records into rows and documents, and the strict decoders back.

A row is a `dict` keyed by field name, in the order of the `*_FIELDS` tuples (a SQL backend binds
`tuple(row.values())` to columns listed in that order). Backends differ only in how a value is
represented, which their `Encoding` says: timestamps as ISO text or as aware `datetime`s, string
maps (metadata) as JSON text or as nested mappings, and whether optional fields that are empty
are left out of a document. Key names and order match the published layouts, so stores written
by other implementations of the format stay readable.

Decoders accept every representation and are strict about types: a value of the wrong type
raises `ValueError` naming the record and the field, and the reader decides to skip the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from .. import _json
from .._errors import shortened
from .._json import compact_json
from .._records import (
    EFFECT_RESOLUTIONS,
    EVENT_KINDS,
    RUN_STATUSES,
    SNAPSHOT_STATES,
    TOOL_EFFECT_STATUSES,
    ContinuableSnapshot,
    EffectResolution,
    EventKind,
    RunRecord,
    RunStatus,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)

Row = dict[str, Any]

RUN_FIELDS = (
    'run_id',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'metadata',
    'started_at',
    'registration_id',
    'pydantic_ai_run_id',
    'run_metadata',
    'parent_tool_call_id',
    'continued_from',
    'forked_from',
)
"""What `register_run` stores. A run's `status` and `ended_at` are written later, by its closing event."""
EVENT_FIELDS = (
    'run_id',
    'kind',
    'step_index',
    'timestamp',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'tool_call_id',
    'tool_name',
    'error',
    'metadata',
    'idempotency_key',
    'tool_args',
)
EFFECT_FIELDS = (
    'run_id',
    'tool_call_id',
    'tool_name',
    'status',
    'started_at',
    'ended_at',
    'idempotency_key',
    'effect_summary',
    'resolution',
    'resolved_by',
    'resolved_at',
    'resolution_note',
)
RESOLUTION_FIELDS = EFFECT_FIELDS[8:]
"""A tool effect's resolution (`resolution`, `resolved_by`, `resolved_at`, `resolution_note`): written
only with the entry's first record or by `Backend.resolve_effect`, never by a later upsert."""
SNAPSHOT_FIELDS = (
    'run_id',
    'step_index',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'timestamp',
    'state',
    'idempotency_key',
    'message_count',
    'log_size',
)

_LATER_FIELDS = frozenset(
    {
        'pydantic_ai_run_id',
        'run_metadata',
        'parent_tool_call_id',
        'continued_from',
        'forked_from',
        'tool_args',
        'resolution',
        'resolved_by',
        'resolved_at',
        'resolution_note',
    }
)
"""Fields added after the upstream layout: a document encoding leaves them out while they are empty."""
_EMPTY_MAP = '{}'


@dataclass(frozen=True)
class Encoding:
    """How a backend represents values. The field names and their order never change."""

    native_times: bool = False
    """Aware `datetime`s (a `timestamptz` column, a BSON date) instead of ISO 8601 text."""
    native_maps: bool = False
    """Nested mappings (a JSON document, `jsonb`) instead of compact JSON text."""
    omit_empty: bool = False
    """Leave out fields this format added later while they are empty (None, `{}`)."""

    def time(self, value: datetime | None) -> Any:
        """Aware times are stored in UTC, so stored text sorts in time order."""
        if value is None:
            return None
        if self.native_times:
            return _in_utc(value)
        recent = _RECENT_TEXTS.get(id(value))
        return recent[1] if recent is not None else _utc_text(value)

    def map(self, value: Mapping[str, Any]) -> Any:
        if self.native_maps:
            return dict(value)
        return compact_json(value) if value else _EMPTY_MAP

    def ref(self, value: SnapshotRef | None) -> Any:
        if value is None:
            return None
        return self.map({'run_id': value.run_id, 'seq': value.seq, 'step_index': value.step_index})

    def run(self, record: RunRecord) -> Row:
        row: Row = {
            'run_id': record.run_id,
            'conversation_id': record.conversation_id,
            'parent_run_id': record.parent_run_id,
            'agent_name': record.agent_name,
            'metadata': self.map(record.metadata),
            'started_at': self.time(record.started_at),
            'registration_id': record.registration_id,
            'pydantic_ai_run_id': record.pydantic_ai_run_id,
            'run_metadata': self.map(record.run_metadata),
            'parent_tool_call_id': record.parent_tool_call_id,
            'continued_from': self.ref(record.continued_from),
            'forked_from': self.ref(record.forked_from),
        }
        return self._trimmed(row) if self.omit_empty else row

    def event(self, event: StepEvent) -> Row:
        row: Row = {
            'run_id': event.run_id,
            'kind': event.kind,
            'step_index': event.step_index,
            'timestamp': self.time(event.timestamp),
            'conversation_id': event.conversation_id,
            'parent_run_id': event.parent_run_id,
            'agent_name': event.agent_name,
            'tool_call_id': event.tool_call_id,
            'tool_name': event.tool_name,
            'error': event.error,
            'metadata': self.map(event.metadata),
            'idempotency_key': event.idempotency_key,
            'tool_args': event.tool_args,
        }
        return self._trimmed(row) if self.omit_empty else row

    def effect(self, record: ToolEffectRecord) -> Row:
        row: Row = {
            'run_id': record.run_id,
            'tool_call_id': record.tool_call_id,
            'tool_name': record.tool_name,
            'status': record.status,
            'started_at': self.time(record.started_at),
            'ended_at': self.time(record.ended_at),
            'idempotency_key': record.idempotency_key,
            'effect_summary': record.effect_summary,
            'resolution': record.resolution,
            'resolved_by': record.resolved_by,
            'resolved_at': self.time(record.resolved_at),
            'resolution_note': record.resolution_note,
        }
        return self._trimmed(row) if self.omit_empty else row

    def resolution(self, record: ToolEffectRecord) -> Row:
        """The record's resolution fields (`RESOLUTION_FIELDS`), as `effect` encodes them."""
        return {name: value for name, value in self.effect(record).items() if name in RESOLUTION_FIELDS}

    def snapshot(self, snapshot: ContinuableSnapshot, message_count: int, log_size: int | None) -> Row:
        """A snapshot row; `log_size` is `None` until the backend knows where the log ends."""
        return {
            'run_id': snapshot.run_id,
            'step_index': snapshot.step_index,
            'conversation_id': snapshot.conversation_id,
            'parent_run_id': snapshot.parent_run_id,
            'agent_name': snapshot.agent_name,
            'timestamp': self.time(snapshot.timestamp),
            'state': snapshot.state,
            'idempotency_key': snapshot.idempotency_key,
            'message_count': message_count,
            'log_size': log_size,
        }

    @staticmethod
    def _trimmed(row: Row) -> Row:
        return {
            key: value
            for key, value in row.items()
            if key not in _LATER_FIELDS or (value is not None and value != {} and value != _EMPTY_MAP)
        }


_RECENT_TEXTS: dict[int, tuple[datetime, str]] = {}
"""The ISO text of the last few times formatted, by identity: a tool call's start is written three
times (its event, its `started` entry, its closed entry), as one `datetime` object."""
_RECENT_LIMIT = 16


def _in_utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo is not None and value.tzinfo is not UTC else value


def _utc_text(value: datetime) -> str:
    """A time's ISO text in UTC, remembered: an entry keeps its object alive, so no other object
    can have its id while the entry is looked up by it."""
    text = _in_utc(value).isoformat()
    if len(_RECENT_TEXTS) >= _RECENT_LIMIT:
        _RECENT_TEXTS.clear()
    _RECENT_TEXTS[id(value)] = (value, text)
    return text


TEXT = Encoding()
"""Timestamps as ISO text, maps as JSON text: SQL text columns."""


# === decoding =================================================================================


def decode_run(data: Mapping[str, Any]) -> RunRecord:
    what = 'run record'
    status = data.get('status')
    if status is not None and status not in RUN_STATUSES:
        raise ValueError(f'{what} field "status" must be one of {sorted(RUN_STATUSES)}, got {shortened(status)}')
    ended_at = data.get('ended_at')
    return RunRecord(
        run_id=required_str(data, 'run_id', what),
        conversation_id=optional_str(data, 'conversation_id', what),
        parent_run_id=optional_str(data, 'parent_run_id', what),
        agent_name=optional_str(data, 'agent_name', what),
        metadata=str_map(data.get('metadata'), what),
        started_at=timestamp(data, 'started_at', what),
        parent_tool_call_id=optional_str(data, 'parent_tool_call_id', what),
        registration_id=optional_str(data, 'registration_id', what),
        pydantic_ai_run_id=optional_str(data, 'pydantic_ai_run_id', what),
        run_metadata=json_map(data.get('run_metadata'), what),
        continued_from=snapshot_ref(data.get('continued_from'), 'continued_from', what),
        forked_from=snapshot_ref(data.get('forked_from'), 'forked_from', what),
        status=cast(RunStatus, status) if status is not None else 'unfinished',
        ended_at=parse_time(ended_at, 'ended_at', what) if ended_at is not None else None,
    )


def decode_event(data: Mapping[str, Any]) -> StepEvent:
    what = 'event'
    return StepEvent(
        run_id=required_str(data, 'run_id', what),
        kind=event_kind(data.get('kind')),
        step_index=required_int(data, 'step_index', what),
        timestamp=timestamp(data, 'timestamp', what),
        conversation_id=optional_str(data, 'conversation_id', what),
        parent_run_id=optional_str(data, 'parent_run_id', what),
        agent_name=optional_str(data, 'agent_name', what),
        tool_call_id=optional_str(data, 'tool_call_id', what),
        tool_name=optional_str(data, 'tool_name', what),
        error=optional_str(data, 'error', what),
        metadata=str_map(data.get('metadata'), what),
        idempotency_key=optional_str(data, 'idempotency_key', what),
        tool_args=optional_str(data, 'tool_args', what),
    )


def decode_effect(data: Mapping[str, Any]) -> ToolEffectRecord:
    what = 'tool effect'
    ended_at, resolved_at, resolution = data.get('ended_at'), data.get('resolved_at'), data.get('resolution')
    if resolution is not None and resolution not in EFFECT_RESOLUTIONS:
        raise ValueError(
            f'{what} field "resolution" must be one of {sorted(EFFECT_RESOLUTIONS)}, got {shortened(resolution)}'
        )
    return ToolEffectRecord(
        tool_call_id=required_str(data, 'tool_call_id', what),
        tool_name=required_str(data, 'tool_name', what),
        run_id=required_str(data, 'run_id', what),
        status=tool_effect_status(data.get('status')),
        started_at=timestamp(data, 'started_at', what),
        ended_at=parse_time(ended_at, 'ended_at', what) if ended_at is not None else None,
        idempotency_key=optional_str(data, 'idempotency_key', what),
        effect_summary=optional_str(data, 'effect_summary', what),
        resolution=cast(EffectResolution | None, resolution),
        resolved_by=optional_str(data, 'resolved_by', what),
        resolved_at=parse_time(resolved_at, 'resolved_at', what) if resolved_at is not None else None,
        resolution_note=optional_str(data, 'resolution_note', what),
    )


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """A stored snapshot's fields apart from its messages, and where its history is in the log."""

    step_index: int
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    timestamp: datetime
    state: SnapshotState
    idempotency_key: str | None
    message_count: int | None
    log_size: int | None
    """`(message_count, log_size)` name the history in the message log; both `None` for a layout that
    kept the history elsewhere (the backend then hands over the texts itself)."""


def decode_snapshot_meta(data: Mapping[str, Any]) -> SnapshotMeta:
    what = 'snapshot'
    count, size = data.get('message_count'), data.get('log_size')
    if count is not None or size is not None:
        count = required_int(data, 'message_count', what)
        size = required_int(data, 'log_size', what)
        if count < 0 or size < 0:
            raise ValueError(f'{what} message_count/log_size must be non-negative, got {count}, {size}')
    return SnapshotMeta(
        step_index=required_int(data, 'step_index', what),
        conversation_id=optional_str(data, 'conversation_id', what),
        parent_run_id=optional_str(data, 'parent_run_id', what),
        agent_name=optional_str(data, 'agent_name', what),
        timestamp=timestamp(data, 'timestamp', what),
        state=snapshot_state(data.get('state')),
        idempotency_key=optional_str(data, 'idempotency_key', what),
        message_count=count,
        log_size=size,
    )


def event_kind(value: object) -> EventKind:
    if not isinstance(value, str) or value not in EVENT_KINDS:
        raise ValueError(f'unknown event kind: {shortened(value)}; expected one of {sorted(EVENT_KINDS)}')
    return cast(EventKind, value)


def tool_effect_status(value: object) -> ToolEffectStatus:
    if not isinstance(value, str) or value not in TOOL_EFFECT_STATUSES:
        raise ValueError(
            f'unknown tool effect status: {shortened(value)}; expected one of {sorted(TOOL_EFFECT_STATUSES)}'
        )
    return cast(ToolEffectStatus, value)


def snapshot_state(value: object) -> SnapshotState:
    """Missing state reads as `complete`: databases written before states existed held only those."""
    if value is None:
        return 'complete'
    if not isinstance(value, str) or value not in SNAPSHOT_STATES:
        raise ValueError(f'unknown snapshot state: {shortened(value)}; expected one of {sorted(SNAPSHOT_STATES)}')
    return cast(SnapshotState, value)


def required_str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be a string, got {shortened(value)}')
    return value


def optional_str(data: Mapping[str, Any], key: str, what: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be a string or null, got {shortened(value)}')
    return value


def required_int(data: Mapping[str, Any], key: str, what: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'{what} field {key!r} must be an integer, got {shortened(value)}')
    return value


def timestamp(data: Mapping[str, Any], key: str, what: str) -> datetime:
    return parse_time(data.get(key), key, what)


def parse_time(value: object, key: str, what: str) -> datetime:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be an ISO timestamp, got {shortened(value)}')
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f'{what} field {key!r} must be an ISO timestamp, got {shortened(value)}') from None


def str_map(value: object, what: str) -> dict[str, str]:
    return _json.str_map(value, f'{what} metadata')


def json_map(value: object, what: str) -> dict[str, Any]:
    mapping = _json.json_object(value, f'{what} run_metadata')
    if mapping is None:
        return {}
    if not all(isinstance(name, str) for name in mapping):
        raise ValueError(f'{what} run_metadata keys must be strings, got {shortened(list(mapping))}')
    return cast(dict[str, Any], mapping)


def snapshot_ref(value: object, key: str, what: str) -> SnapshotRef | None:
    mapping = _json.json_object(value, f'{what} {key}')
    if mapping is None:
        return None
    return SnapshotRef(
        run_id=required_str(mapping, 'run_id', f'{what} {key}'),
        seq=required_int(mapping, 'seq', f'{what} {key}'),
        step_index=required_int(mapping, 'step_index', f'{what} {key}'),
    )


def run_dict(record: RunRecord) -> Row:
    """A run as plain JSON values, for `--json` output and exports."""
    row = Encoding(native_maps=True).run(record)
    row['status'] = record.status
    row['ended_at'] = record.ended_at.isoformat() if record.ended_at is not None else None
    return row


def event_dict(event: StepEvent) -> Row:
    return Encoding(native_maps=True).event(event)


def effect_dict(record: ToolEffectRecord) -> Row:
    return Encoding(native_maps=True).effect(record)
