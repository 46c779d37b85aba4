"""What the File backend's files hold: message log lines and snapshot files, written and parsed."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

from ...._errors import shortened
from ...._json import compact_json, loads
from ...backend import Damaged, LogEntry, Row, SnapshotRow
from ._io import json_object, line, read_bytes
from ._state import LOG_PREFIX

_SEQ_STEM = re.compile(r'[0-9]{1,18}')


def log_line(index: int, position: int, text: str) -> bytes:
    return b'{"i":%d,"p":%d,"m":%s}\n' % (index, position, text.encode('utf-8', 'surrogatepass'))


def parse_log_line(text: bytes) -> LogEntry | None:
    try:
        value = loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    data = cast(dict[str, Any], value)
    index, position, message = data.get('i'), data.get('p'), data.get('m')
    if not isinstance(index, int) or not isinstance(position, int) or not isinstance(message, dict):
        return None
    if index < 0 or position < 0:
        return None
    match = LOG_PREFIX.match(text)
    if match is not None and len(data) == 3 and text.endswith(b'}'):
        stored = text[match.end() : -1].decode('utf-8', 'surrogatepass')  # the stored text, as written
    else:
        stored = compact_json(cast(dict[str, Any], message))
    return LogEntry(index, position, stored)


def snapshot_body(row: Row, log_size: int) -> bytes:
    """A snapshot file: its fields, the history named by `{"message_count", "log_size"}` under `messages`."""
    body = {key: value for key, value in row.items() if key not in ('message_count', 'log_size')}
    body['messages'] = {'message_count': row['message_count'], 'log_size': log_size}
    return line(body)


def read_snapshot_file(path: Path, seq: int) -> SnapshotRow | None:
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return SnapshotRow(seq, Damaged(str(path), str(error)))
    try:
        data = json_object(raw)
    except ValueError as error:
        return SnapshotRow(seq, Damaged(str(path), str(error)))
    messages: object = data.pop('messages', None)
    if isinstance(messages, list):  # written by the upstream package: the history inline
        return SnapshotRow(seq, data, [compact_json(item) for item in cast(list[object], messages)])
    if isinstance(messages, dict):
        reference = cast(dict[str, Any], messages)
        data['message_count'] = reference.get('message_count')
        data['log_size'] = reference.get('log_size')
        if data['message_count'] is None and data['log_size'] is None:
            reason = f'its messages reference names no history: {shortened(reference)}'
            return SnapshotRow(seq, Damaged(str(path), reason))
        return SnapshotRow(seq, data)
    reason = f'"messages" must be a list or a log reference, got {shortened(messages)}'
    return SnapshotRow(seq, Damaged(str(path), reason))


def snapshot_seqs(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(name[:-5]) for name in names if name.endswith('.json') and _SEQ_STEM.fullmatch(name[:-5])]


def peek_state(path: Path) -> str | None:
    """The state of a snapshot file the ledger does not name; `None` if it cannot be read."""
    try:
        state = json_object(read_bytes(path)).get('state', 'complete')
    except (OSError, ValueError):
        return None
    return state if isinstance(state, str) else None
