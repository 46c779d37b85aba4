"""The records a store accepts for writing, and the run queries it accepts for reading.

Every record of a write is checked before anything is written, so a bad field raises
`InvalidRecordError` (a `ValueError`) naming it and the store holds nothing of that write. The
field rules themselves (run ids, string maps, JSON maps) are `_errors.py`'s; these checks say
which fields each record has. `run_ids` collects the runs a write's records belong to, each run
id checked once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime

from .._errors import (
    InvalidRecordError,
    check_encodable,
    check_json_map,
    check_optional_str,
    check_optional_text,
    check_run_id,
    check_str_map,
    shortened,
)
from .._records import (
    EFFECT_RESOLUTIONS,
    EVENT_KINDS,
    RUN_EQUALITY_FIELDS,
    SNAPSHOT_STATES,
    TOOL_EFFECT_STATUSES,
    ContinuableSnapshot,
    RunQuery,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
)
from .protocol import SnapshotDelta

MAX_COUNT = 2**63 - 1
"""The most runs a store can count (SQLite's, PostgreSQL's and MongoDB's integers are 64-bit): a
`limit` or `prune(keep_last=)` above it asks for more runs than any store holds, so it means no
limit (`checked_query`)."""


def _note_run(run_id: str, run_ids: set[str]) -> None:
    """Check a run id the first time a write names it."""
    if run_id not in run_ids:
        check_run_id(run_id)
        run_ids.add(run_id)


def _require_text(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise InvalidRecordError(f'{what} must be a string, got {type(value).__name__} {shortened(value)}')


def _require_int(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRecordError(f'{what} must be an int, got {shortened(value)}')


def _require_list(value: object, what: str) -> None:
    if not isinstance(value, list):
        raise InvalidRecordError(f'{what} must be a list, got {type(value).__name__}')


def _check_time(value: object, what: str) -> None:
    if not isinstance(value, datetime):
        raise InvalidRecordError(f'{what} must be a datetime, got {shortened(value)}')


def _require_optional_time(value: object, what: str) -> None:
    if value is not None:
        _check_time(value, what)


_NONE = type(None)
_ALLOWS: Callable[[frozenset[type], type], bool] = frozenset[type].__contains__
_KINDS: dict[str, tuple[frozenset[type], Callable[[object, str], object]]] = {
    'text': (frozenset({str}), _require_text),
    'text?': (frozenset({str, _NONE}), check_optional_str),
    'int': (frozenset({int}), _require_int),
    'time': (frozenset({datetime}), _check_time),
    'time?': (frozenset({datetime, _NONE}), _require_optional_time),
    'list': (frozenset({list}), _require_list),
}


class _Fields:
    """The typed fields of one kind of record. A value of another type would be stored by one store,
    turned to text by another, and read back by none; a text with a lone surrogate would be kept by
    some stores and refused by the others (`check_encodable`). Checked in C in the common case (each
    value's exact type among those allowed, every text ASCII); else field by field, where a subclass
    (of `str`, `datetime`) passes."""

    def __init__(self, record: str, **kinds: str) -> None:
        ordered = sorted(kinds.items(), key=lambda item: not item[1].startswith('text'))  # the texts first
        self._read = operator.attrgetter(*(name for name, _ in ordered))
        self._allowed = tuple(_KINDS[kind][0] for _, kind in ordered)
        self._checks = tuple((f'{record}.{name}', _KINDS[kind][1]) for name, kind in ordered)
        self._texts = sum(kind.startswith('text') for kind in kinds.values())

    def check(self, record: object) -> None:
        values: tuple[object, ...] = self._read(record)
        if not all(map(_ALLOWS, self._allowed, map(type, values))):
            for (what, check), value in zip(self._checks, values, strict=True):
                check(value, what)
        texts: tuple[str | None, ...] = values[: self._texts]  # pyright: ignore[reportAssignmentType]
        if not all(map(str.isascii, filter(None, texts))):
            for (what, _), text in zip(self._checks[: self._texts], texts, strict=True):
                if text:
                    check_encodable(text, what)


def _check_choice(value: object, allowed: Collection[str], field: str) -> None:
    if value not in allowed:
        raise InvalidRecordError(f'{field} must be one of {sorted(allowed)}, got {shortened(value)}')


def checked_run(record: RunRecord) -> RunRecord:
    check_run_id(record.run_id)
    for name in (*RUN_EQUALITY_FIELDS, 'registration_id', 'parent_tool_call_id'):
        check_optional_text(getattr(record, name), f'RunRecord.{name}')
    check_str_map(record.metadata, 'RunRecord.metadata')
    check_json_map(record.run_metadata, 'RunRecord.run_metadata')
    _check_time(record.started_at, 'RunRecord.started_at')
    return record


_OPTIONAL_TEXTS = ('conversation_id', 'parent_run_id', 'agent_name')
_EVENT_FIELDS = _Fields(
    'StepEvent',
    step_index='int',
    timestamp='time',
    **dict.fromkeys((*_OPTIONAL_TEXTS, 'tool_call_id', 'tool_name', 'error', 'idempotency_key', 'tool_args'), 'text?'),
)
_EFFECT_FIELDS = _Fields(
    'ToolEffectRecord',
    tool_call_id='text',
    tool_name='text',
    started_at='time',
    ended_at='time?',
    resolved_at='time?',
    **dict.fromkeys(('idempotency_key', 'effect_summary', 'resolved_by', 'resolution_note'), 'text?'),
)
_SNAPSHOT_FIELDS = _Fields(
    'ContinuableSnapshot',
    step_index='int',
    timestamp='time',
    messages='list',
    **dict.fromkeys((*_OPTIONAL_TEXTS, 'idempotency_key'), 'text?'),
)


def checked_event(event: StepEvent, run_ids: set[str]) -> StepEvent:
    _note_run(event.run_id, run_ids)
    _check_choice(event.kind, EVENT_KINDS, 'StepEvent.kind')
    _EVENT_FIELDS.check(event)
    if event.metadata:
        check_str_map(event.metadata, 'StepEvent.metadata')
    return event


def checked_effect(record: ToolEffectRecord, run_ids: set[str]) -> ToolEffectRecord:
    _note_run(record.run_id, run_ids)
    _check_choice(record.status, TOOL_EFFECT_STATUSES, 'ToolEffectRecord.status')
    _EFFECT_FIELDS.check(record)
    if record.resolution is not None:
        _check_choice(record.resolution, EFFECT_RESOLUTIONS, 'ToolEffectRecord.resolution')
    return record


def checked_snapshot(snapshot: ContinuableSnapshot, run_ids: set[str]) -> None:
    _note_run(snapshot.run_id, run_ids)
    _check_choice(snapshot.state, SNAPSHOT_STATES, 'ContinuableSnapshot.state')
    _SNAPSHOT_FIELDS.check(snapshot)


def checked_delta(delta: SnapshotDelta) -> None:
    check_run_id(delta.run_id)
    _check_choice(delta.state, SNAPSHOT_STATES, 'SnapshotDelta.state')
    for name in ('step_index', 'message_count'):
        value = getattr(delta, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRecordError(f'SnapshotDelta.{name} must be an int >= 0, got {shortened(value)}')
    expected: object = delta.expected_log_size
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int) or expected < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(
            f'SnapshotDelta.expected_log_size must be an int >= 0 or None, got {shortened(expected)}'
        )
    for append in delta.appends:
        position, text = append
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < delta.message_count:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidRecordError(
                f'SnapshotDelta.appends positions must be ints in [0, message_count={delta.message_count}), '
                f'got {shortened(position)}'
            )
        if not isinstance(text, str) or not text.startswith('{'):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InvalidRecordError(f'SnapshotDelta.appends texts must be JSON object texts, got {shortened(text)}')
    check_optional_text(delta.idempotency_key, 'SnapshotDelta.idempotency_key')
    _check_time(delta.timestamp, 'SnapshotDelta.timestamp')


def checked_query(query: RunQuery) -> RunQuery:
    """Reject a query whose filters have the wrong types, naming the filter.

    A `limit` above `MAX_COUNT` is more runs than any store can hold, so every store returns all
    the matching runs, as with no limit (the returned query has `limit=None`), instead of the
    64-bit stores overflowing on it.
    """
    for name in RUN_EQUALITY_FIELDS:
        check_optional_text(getattr(query, name), name)
    if query.status is not None and query.status not in ('completed', 'failed', 'unfinished'):
        raise ValueError(f"status must be 'completed', 'failed' or 'unfinished', got {shortened(query.status)}")
    for name in ('started_after', 'started_before', 'ended_before'):
        value = getattr(query, name)
        if value is not None and not isinstance(value, datetime):
            raise ValueError(f'{name} must be a datetime, got {shortened(value)}')
    limit: object = query.limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'limit must be an int >= 0 or None, got {shortened(query.limit)}')
    if limit is not None and limit > MAX_COUNT:
        query = replace(query, limit=None)
    if query.metadata is not None:
        check_str_map(query.metadata, 'metadata')
    for key, value in (query.run_metadata or {}).items():
        if not isinstance(key, str) or not (value is None or isinstance(value, str | int | float | bool)):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                'run_metadata filters compare JSON scalars (str, int, float, bool, None), '
                f'got {shortened(key)}: {shortened(value)}'
            )
        check_encodable(key, f'run_metadata filter key {shortened(key)}')
        if isinstance(value, str):
            check_encodable(value, f'run_metadata[{shortened(key)}]')
    return query
