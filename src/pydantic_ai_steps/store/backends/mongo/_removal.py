"""The writes that remove records from a MongoDB step store, computed before any I/O.

Deleting runs, retention's snapshot removal, compaction's log removal, and taking back what a
commit wrote before it found its run deleted: each is a list of `Write`s for `Writer.apply`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId

from ...._mongo import Write
from ._layout import COUNTERS, LOG, PRUNED, RECORD_COLLECTIONS, RUNS, SNAPSHOTS, UPSTREAM_KEYS, counter_id

TOMBSTONE_TTL = timedelta(days=1)
"""How long a deleted run's counter stays a tombstone (a writer's claim and its guard are milliseconds apart)."""
CHUNK = 1000
"""Values per `$in` list."""
_STUB_DROPS = (
    'step_index',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'timestamp',
    'message_count',
    'log_size',
    'messages',
)


def runs_removal(gens: dict[str, Any], now: datetime) -> list[Write]:
    """Delete the runs `gens` names (run id -> the `gen` of its run document), in the order the
    module docs of `_backend` give: tombstone the counters, delete the records, then the runs; and
    drop tombstones past their time."""
    existing = list(gens)
    writes = [
        Write(
            COUNTERS,
            'update',
            {'_id': counter_id(run_id)},
            {'$set': {'run_id': run_id, 'deleted': True, 'gen': ObjectId(), 'deleted_gen': gen, 'deleted_at': now}},
            upsert=True,
        )
        for run_id, gen in gens.items()
    ]
    writes += [Write(name, 'delete_many', {'run_id': {'$in': existing}}) for name in RECORD_COLLECTIONS]
    writes.append(Write(UPSTREAM_KEYS, 'delete_many', {'_id.run_id': {'$in': existing}}))
    writes.append(Write(RUNS, 'delete_many', {'_id': {'$in': existing}}))
    writes.append(Write(COUNTERS, 'delete_many', {'deleted': True, 'deleted_at': {'$lt': now - TOMBSTONE_TTL}}))
    return writes


def snapshots_removal(run_id: str, seqs: Sequence[int]) -> list[Write]:
    """Delete a run's snapshots; a keyed one becomes a stub that keeps its key claimed (`state: 'pruned'`)."""
    writes: list[Write] = []
    for start in range(0, len(seqs), CHUNK):
        chosen = {'run_id': run_id, 'seq': {'$in': list(seqs[start : start + CHUNK])}}
        keyed = {**chosen, 'idempotency_key': {'$type': 'string'}}
        stub = {'$set': {'state': PRUNED}, '$unset': dict.fromkeys(_STUB_DROPS, '')}
        writes.append(Write(SNAPSHOTS, 'update_many', keyed, stub))
        writes.append(Write(SNAPSHOTS, 'delete_many', {**chosen, 'idempotency_key': {'$not': {'$type': 'string'}}}))
    return writes


def log_removal(run_id: str, indices: Sequence[int]) -> list[Write]:
    return [
        Write(LOG, 'delete_many', {'run_id': run_id, 'log_index': {'$in': list(indices[start : start + CHUNK])}})
        for start in range(0, len(indices), CHUNK)
    ]


def undoing(applied: Sequence[Write]) -> list[Write]:
    """The writes that remove what `applied` inserted or upserted (a batch that found its run deleted)."""
    ids: dict[str, list[Any]] = {}
    undo: list[Write] = []
    for write in applied:
        if write.role == 'register':  # this registration's document only, never a later one's
            selector = {'_id': write.document['_id'], 'gen': write.document['gen']}
            undo.append(Write(RUNS, 'delete_many', selector))
        elif write.kind == 'insert':
            ids.setdefault(write.collection, []).append(write.document['_id'])
        elif write.role in ('effect', 'event') and write.update is not None:
            ids.setdefault(write.collection, []).append(write.update['$setOnInsert']['_id'])
    return undo + [Write(name, 'delete_many', {'_id': {'$in': values}}) for name, values in ids.items()]
