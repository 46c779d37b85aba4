"""Documents of layouts this release did not write: the upstream package's snapshots, and runs without a counter.

- Upstream snapshots keep their history in a `messages` string: either `{"message_refs": [...]}`
  (the SHA-256 keys of the message texts, in order, stored once in `snapshot_messages`) or, in
  releases before de-duplication, the whole history as a JSON list.
- A run registered by the upstream package (or whose registration was cut off before its counter
  was written) has no counter document; the first write of it here creates one from the highest
  seq and log index its records hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from ...._errors import shortened
from ...._json import compact_json, loads
from ...._mongo import Document, collection
from ...backend import Damaged
from ._layout import EFFECTS, EVENTS, LOG, SNAPSHOTS, UPSTREAM_MESSAGES

_BATCH = 10_000


def upstream_refs(raw: object) -> list[str] | list[object] | str:
    """The message keys of a `message_refs` string, the items of an inline history, or why neither."""
    if not isinstance(raw, str):
        return f'its "messages" field must be a string, got {type(raw).__name__}'
    try:
        value = loads(raw)
    except ValueError as error:
        return f'its "messages" field is {error}'
    if isinstance(value, list):
        return cast(list[object], value)
    if isinstance(value, dict):
        refs = cast(dict[str, Any], value).get('message_refs')
        if isinstance(refs, list) and all(isinstance(ref, str) for ref in cast(list[object], refs)):
            return cast(list[str], refs)
    return f'its "messages" field is neither a history nor a list of message references: {shortened(raw)}'


async def upstream_texts(
    database: AsyncDatabase[Document], documents: Sequence[Mapping[str, Any]], run_id: str
) -> list[list[str] | Damaged]:
    """The message texts of each upstream snapshot document, in order (one lookup for all their references)."""
    parsed: list[tuple[bool, list[str] | list[object] | str]] = []
    wanted: set[str] = set()
    for document in documents:
        raw = document.get('messages')
        found = upstream_refs(raw)
        inline = isinstance(raw, str) and raw.lstrip().startswith('[')
        parsed.append((inline, found))
        if not inline and isinstance(found, list):
            wanted.update(cast(list[str], found))
    texts: dict[str, str] = {}
    keys = sorted(wanted)
    for start in range(0, len(keys), _BATCH):
        cursor = collection(database, UPSTREAM_MESSAGES).find({'_id': {'$in': keys[start : start + _BATCH]}})
        async for stored in cursor:
            message = stored.get('message')
            if isinstance(message, str):
                texts[str(stored['_id'])] = message
    results: list[list[str] | Damaged] = []
    for document, (inline, found) in zip(documents, parsed, strict=True):
        where = f'snapshot {document.get("seq")!r} of run {run_id!r}'
        if isinstance(found, str):
            results.append(Damaged(where, found))
        elif inline:
            results.append([compact_json(item) for item in found])
        else:
            refs = cast(list[str], found)
            missing = {ref for ref in refs if ref not in texts}
            if missing:
                results.append(Damaged(where, f'it references {len(missing)} stored message(s) that are missing'))
            else:
                results.append([texts[ref] for ref in refs])
    return results


async def counter_from_records(database: AsyncDatabase[Document], run_id: str) -> dict[str, int]:
    """Where the run's log ends and its highest seqs, read from its records (for a run without a counter)."""

    async def highest(name: str, field: str, none: int) -> int:
        found = await collection(database, name).find_one(
            {'run_id': run_id, field: {'$type': 'number'}}, projection={field: 1}, sort=[(field, DESCENDING)]
        )
        value = found.get(field) if found is not None else None
        return int(value) if isinstance(value, int | float) else none

    log, snapshots, events, effects = await asyncio.gather(
        highest(LOG, 'log_index', -1),
        highest(SNAPSHOTS, 'seq', 0),
        highest(EVENTS, 'seq', 0),
        highest(EFFECTS, 'seq', 0),
    )
    return {'log': log + 1, 'snapshots': snapshots, 'events': events, 'effects': effects}
