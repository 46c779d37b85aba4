"""Snapshot rows of layouts before the message log: the history inline, or the upstream package's references.

- Inline: `snapshots.messages` holds the whole history as a JSON list (early releases of this
  package, and upstream releases before de-duplication).
- Upstream de-duplicated: `snapshots.messages` holds `{"stored_messages": N}`; the ordered
  message keys are in `snapshot_message_refs`, the texts in `snapshot_messages`.
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

from ...._errors import shortened
from ...._json import compact_json, loads
from ...backend import Damaged
from ._schema import Columns


def legacy_texts(conn: sqlite3.Connection, columns: Columns, seq: int, raw: object) -> list[str] | Damaged:
    """The message texts of a row written before the message log, or `Damaged` saying why not."""
    where = f'snapshot row {seq}'
    if not isinstance(raw, str):
        return Damaged(where, f'its "messages" column must be text, got {shortened(raw)}')
    try:
        value = loads(raw)
    except ValueError as error:
        return Damaged(where, f'its "messages" column is {error}')
    if isinstance(value, list):
        return [compact_json(item) for item in cast(list[object], value)]
    if isinstance(value, dict) and isinstance(stored := cast(dict[str, Any], value).get('stored_messages'), int):
        if not (columns.has('snapshot_message_refs') and columns.has('snapshot_messages')):
            return Damaged(where, 'it refers to the upstream message tables, which this database lacks')
        rows: list[tuple[object]] = conn.execute(
            'SELECT m.message FROM snapshot_message_refs r LEFT JOIN snapshot_messages m ON m.sha256 = r.sha256 '
            'WHERE r.snapshot_seq = ? ORDER BY r.position',
            (seq,),
        ).fetchall()
        texts = [text for (text,) in rows if isinstance(text, str)]
        if len(texts) == stored and len(rows) == stored:
            return texts
        return Damaged(where, f'it is missing {stored - len(texts)} of its {stored} stored message(s)')
    return Damaged(where, f'its "messages" column is neither a history nor a reference: {shortened(raw)}')
