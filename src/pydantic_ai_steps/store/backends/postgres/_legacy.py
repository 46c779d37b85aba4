"""Snapshot rows of layouts before the message log: the upstream package's (and inline histories).

- Upstream de-duplicated: `{t}_snapshots.messages` holds `{"message_refs": ["<sha256>", ...]}`, the
  ordered keys of the history's messages, whose texts are in `{t}_messages` (`sha256`, `message`).
- Inline: `messages` holds the whole history as a JSON list (upstream releases before
  de-duplication).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from ...._errors import shortened
from ...._json import compact_json, loads
from ...backend import Damaged
from ._pool import PostgresConnection


def parse_legacy(seq: int, raw: object) -> list[str] | list[tuple[str]] | Damaged:
    """Texts of an inline history, the keys (as 1-tuples) of a referenced one, or `Damaged`."""
    where = f'snapshot row {seq}'
    if not isinstance(raw, str):
        return Damaged(where, f'its "messages" column must be text, got {shortened(raw)}')
    try:
        value = loads(raw)
    except ValueError as error:
        return Damaged(where, f'its "messages" column is {error}')
    if isinstance(value, list):
        return [compact_json(item) for item in cast(list[object], value)]
    refs = cast(dict[str, Any], value).get('message_refs') if isinstance(value, dict) else None
    if isinstance(refs, list) and all(isinstance(ref, str) for ref in cast(list[object], refs)):
        return [(ref,) for ref in cast(list[str], refs)]
    return Damaged(where, f'its "messages" column is neither a history nor a reference: {shortened(raw)}')


async def legacy_texts(
    conn: PostgresConnection, t: str, has_messages: bool, rows: Sequence[tuple[int, object]]
) -> dict[int, list[str] | Damaged]:
    """The texts of each `(seq, messages)` row, the referenced ones read in one statement."""
    parsed = {seq: parse_legacy(seq, raw) for seq, raw in rows}
    wanted = sorted(
        {
            key[0]
            for value in parsed.values()
            if not isinstance(value, Damaged)
            for key in value
            if isinstance(key, tuple)
        }
    )
    texts: dict[str, str] = {}
    if wanted and has_messages:
        for sha, message in await conn.fetch(
            f'SELECT sha256, message FROM {t}_messages WHERE sha256 = ANY ($1::text[])', wanted
        ):
            if isinstance(sha, str) and isinstance(message, str):
                texts[sha] = message
    result: dict[int, list[str] | Damaged] = {}
    for seq, value in parsed.items():
        if isinstance(value, Damaged) or not value or isinstance(value[0], str):
            result[seq] = cast(list[str] | Damaged, value)
            continue
        keys = [key[0] for key in cast(list[tuple[str]], value)]
        missing = {key for key in keys if key not in texts}
        if missing:
            result[seq] = Damaged(
                f'snapshot row {seq}', f'it references {len(missing)} stored message(s) that are missing'
            )
        else:
            result[seq] = [texts[key] for key in keys]
    return result
