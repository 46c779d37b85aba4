"""Canonical dictionary encodings of records, shared by every store that writes documents or rows.

Key names and order match the published layouts so stores written by other implementations of
the same format stay readable. Decoders are strict: a value of the wrong type raises `ValueError`
naming the record and field, and readers decide whether to skip the record (see SPEC 3.6).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from ._records import (
    EVENT_KINDS,
    SNAPSHOT_STATES,
    TOOL_EFFECT_STATUSES,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)

Document = dict[str, Any]


def run_to_dict(record: RunRecord) -> Document:
    return {
        'run_id': record.run_id,
        'conversation_id': record.conversation_id,
        'parent_run_id': record.parent_run_id,
        'agent_name': record.agent_name,
        'metadata': dict(record.metadata),
        'started_at': record.started_at.isoformat(),
        'registration_id': record.registration_id,
    }


def event_to_dict(event: StepEvent) -> Document:
    return {
        'run_id': event.run_id,
        'kind': event.kind,
        'step_index': event.step_index,
        'timestamp': event.timestamp.isoformat(),
        'conversation_id': event.conversation_id,
        'parent_run_id': event.parent_run_id,
        'agent_name': event.agent_name,
        'tool_call_id': event.tool_call_id,
        'tool_name': event.tool_name,
        'error': event.error,
        'metadata': dict(event.metadata),
        'idempotency_key': event.idempotency_key,
    }


def tool_effect_to_dict(record: ToolEffectRecord) -> Document:
    return {
        'tool_call_id': record.tool_call_id,
        'tool_name': record.tool_name,
        'run_id': record.run_id,
        'status': record.status,
        'started_at': record.started_at.isoformat(),
        'ended_at': record.ended_at.isoformat() if record.ended_at is not None else None,
        'idempotency_key': record.idempotency_key,
        'effect_summary': record.effect_summary,
    }


def run_from_dict(data: Mapping[str, Any]) -> RunRecord:
    what = 'run record'
    return RunRecord(
        run_id=required_str(data, 'run_id', what),
        conversation_id=optional_str(data, 'conversation_id', what),
        parent_run_id=optional_str(data, 'parent_run_id', what),
        agent_name=optional_str(data, 'agent_name', what),
        metadata=metadata_dict(data.get('metadata'), what),
        started_at=timestamp(data, 'started_at', what),
        registration_id=optional_str(data, 'registration_id', what),
    )


def event_from_dict(data: Mapping[str, Any]) -> StepEvent:
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
        metadata=metadata_dict(data.get('metadata'), what),
        idempotency_key=optional_str(data, 'idempotency_key', what),
    )


def tool_effect_from_dict(data: Mapping[str, Any]) -> ToolEffectRecord:
    what = 'tool effect'
    ended_at = data.get('ended_at')
    return ToolEffectRecord(
        tool_call_id=required_str(data, 'tool_call_id', what),
        tool_name=required_str(data, 'tool_name', what),
        run_id=required_str(data, 'run_id', what),
        status=tool_effect_status(data.get('status')),
        started_at=timestamp(data, 'started_at', what),
        ended_at=parse_time(ended_at, 'ended_at', what) if ended_at is not None else None,
        idempotency_key=optional_str(data, 'idempotency_key', what),
        effect_summary=optional_str(data, 'effect_summary', what),
    )


def event_kind(value: object) -> EventKind:
    if not isinstance(value, str) or value not in EVENT_KINDS:
        raise ValueError(f'unknown event kind: {value!r}; expected one of {sorted(EVENT_KINDS)}')
    return cast(EventKind, value)


def tool_effect_status(value: object) -> ToolEffectStatus:
    if not isinstance(value, str) or value not in TOOL_EFFECT_STATUSES:
        raise ValueError(f'unknown tool effect status: {value!r}; expected one of {sorted(TOOL_EFFECT_STATUSES)}')
    return cast(ToolEffectStatus, value)


def snapshot_state(value: object) -> SnapshotState:
    """Missing state reads as `complete`: databases written before states existed held only those."""
    if value is None:
        return 'complete'
    if not isinstance(value, str) or value not in SNAPSHOT_STATES:
        raise ValueError(f'unknown snapshot state: {value!r}; expected one of {sorted(SNAPSHOT_STATES)}')
    return cast(SnapshotState, value)


def required_str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be a string, got {value!r}')
    return value


def optional_str(data: Mapping[str, Any], key: str, what: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be a string or null, got {value!r}')
    return value


def required_int(data: Mapping[str, Any], key: str, what: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'{what} field {key!r} must be an integer, got {value!r}')
    return value


def timestamp(data: Mapping[str, Any], key: str, what: str) -> datetime:
    return parse_time(data.get(key), key, what)


def parse_time(value: object, key: str, what: str) -> datetime:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError(f'{what} field {key!r} must be an ISO timestamp, got {value!r}')
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f'{what} field {key!r} must be an ISO timestamp, got {value!r}') from None


def metadata_dict(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f'{what} metadata must be an object of strings, got {value!r}')
    result: dict[str, str] = {}
    for key, item in cast(dict[object, object], value).items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(f'{what} metadata must map strings to strings, got {key!r}: {item!r}')
        result[key] = item
    return result
