"""What a MongoDB commit sends and what a run query asks, computed before any I/O.

`Plan.build` turns a batch into documents, each sized and checked (16 MiB per document) before
anything is sent; `Plan.writes` fills in the numbers the runs' counters handed out (`Claim`) and
lists every write in the contract's order (see `_backend` for why that order is safe).
`run_filter` is `list_runs`'s filter as a `runs` query.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId

from ...._mongo import MAX_DOCUMENT_BYTES, Document, Write, checked_document
from ...._records import RUN_EQUALITY_FIELDS, RunQuery
from ...backend import WriteBatch
from ...codec import EFFECT_FIELDS, RESOLUTION_FIELDS, Encoding
from ._layout import COUNTERS, EFFECTS, EVENTS, LOG, RUNS, SNAPSHOTS, counter_id

_PLACEHOLDER = 1 << 62
"""A seq or index not known yet, as large as any real one, so a size checked before the claim holds after it."""
_NOT_UPSERTED = frozenset({'run_id', 'tool_call_id', *RESOLUTION_FIELDS})
"""Fields an effect upsert leaves as stored: the key, and the resolution (see `MongoBackend.resolve_effect`)."""
_PLAIN_KEY = re.compile(r'[A-Za-z0-9_]{1,64}')


@dataclass
class Needs:
    """How many numbers a batch takes from one run's counter."""

    log: int = 0
    snapshots: int = 0
    events: int = 0
    effects: int = 0

    def increments(self) -> dict[str, int]:
        return {name: value for name, value in vars(self).items() if value}


@dataclass(frozen=True)
class Claim:
    """What a run's counter handed out: the run's `gen` and the first number of each kind."""

    gen: Any
    log: int
    snapshot: int
    event: int
    effect: int


@dataclass
class Plan:
    """A batch as documents, sized and checked before anything is sent; numbers filled in after the claims."""

    batch: WriteBatch
    needs: dict[str, Needs] = field(default_factory=dict[str, Needs])
    log: list[Document] = field(default_factory=list[Document])
    snapshot: Document | None = None
    effects: list[tuple[Document, Document]] = field(default_factory=list[tuple[Document, Document]])
    """(filter, update) of each effect upsert."""
    events: list[Document] = field(default_factory=list[Document])

    @classmethod
    def build(cls, batch: WriteBatch) -> Plan:
        plan = cls(batch)
        for run_id in batch.run_ids:
            plan.needs[run_id] = Needs()
        write = batch.snapshot
        if batch.run is not None:
            checked_document(
                {'_id': batch.run['run_id'], 'gen': ObjectId(), **batch.run}, f'run record {batch.run["run_id"]!r}'
            )
        if write is not None:
            needs = plan.needs[write.run_id]
            needs.log, needs.snapshots = len(write.appends), 1
            for position, text in write.appends:
                document = {
                    '_id': ObjectId(),
                    'run_id': write.run_id,
                    'log_index': _PLACEHOLDER,
                    'position': position,
                    'message': text,
                }
                if len(text) * 4 + 1024 > MAX_DOCUMENT_BYTES:  # only then can it be too large
                    checked_document(document, f'message {position} of a snapshot of run {write.run_id!r}')
                plan.log.append(document)
            snapshot = {'_id': ObjectId(), **write.row, 'log_size': _PLACEHOLDER, 'seq': _PLACEHOLDER}
            checked_document(snapshot, f'snapshot of run {write.run_id!r} at step {write.row.get("step_index")}')
            plan.snapshot = snapshot
        for row in batch.tool_effects:
            run_id, call = row['run_id'], row['tool_call_id']
            plan.needs[run_id].effects += 1
            inserted = {'_id': ObjectId(), 'seq': _PLACEHOLDER}
            checked_document({**row, **inserted}, f'tool effect {call!r} of run {run_id!r}')
            # A stored entry keeps its resolution: only `resolve_effect` changes it.
            inserted.update((k, v) for k, v in row.items() if k in RESOLUTION_FIELDS)
            update: Document = {'$set': {k: v for k, v in row.items() if k not in _NOT_UPSERTED}}
            update['$setOnInsert'] = inserted
            absent = {name: '' for name in EFFECT_FIELDS if name not in row and name not in _NOT_UPSERTED}
            if absent:
                update['$unset'] = absent
            plan.effects.append(({'run_id': run_id, 'tool_call_id': call}, update))
        for row in batch.events:
            plan.needs[row['run_id']].events += 1
            event = {'_id': ObjectId(), **row, 'seq': _PLACEHOLDER}
            checked_document(event, f'{row.get("kind")} event of run {row["run_id"]!r}')
            plan.events.append(event)
        return plan

    def writes(self, claims: Mapping[str, Claim]) -> tuple[list[Write], int | None]:
        """Every write, in the contract's order, with the claimed numbers; and the log size after the appends."""
        batch = self.batch
        writes: list[Write] = []
        if batch.run is not None:
            run_id = batch.run['run_id']
            gen = claims[run_id].gen
            writes.append(
                Write(RUNS, 'insert', {'_id': run_id, 'gen': gen, **batch.run}, role='register', run_id=run_id)
            )
            counter = {
                'run_id': run_id,
                'gen': gen,
                'deleted': False,
                **{'log': 0, 'snapshots': 0, 'events': 0, 'effects': 0},
            }
            counter.update(self.needs[run_id].increments())
            writes.append(
                Write(
                    COUNTERS,
                    'update',
                    {'_id': counter_id(run_id), 'deleted_gen': {'$ne': gen}},
                    {'$set': counter},
                    upsert=True,
                    role='reset',
                    run_id=run_id,
                )
            )
        log_size: int | None = None
        if batch.snapshot is not None and self.snapshot is not None:
            run_id = batch.snapshot.run_id
            claim = claims[run_id]
            for offset, document in enumerate(self.log):
                document['log_index'] = claim.log + offset
                writes.append(Write(LOG, 'insert', document, role='append', run_id=run_id))
            log_size = claim.log + len(self.log)
            self.snapshot['log_size'] = log_size
            self.snapshot['seq'] = claim.snapshot
            writes.append(Write(SNAPSHOTS, 'insert', self.snapshot, role='snapshot', run_id=run_id))
        taken: dict[str, int] = {}
        for selector, update in self.effects:
            run_id = selector['run_id']
            update['$setOnInsert']['seq'] = claims[run_id].effect + taken.get(run_id, 0)
            taken[run_id] = taken.get(run_id, 0) + 1
            writes.append(Write(EFFECTS, 'update', selector, update, upsert=True, role='effect', run_id=run_id))
        taken = {}
        for event in self.events:
            run_id = event['run_id']
            event['seq'] = claims[run_id].event + taken.get(run_id, 0)
            taken[run_id] = taken.get(run_id, 0) + 1
            key = event.get('idempotency_key')
            if key is None:
                writes.append(Write(EVENTS, 'insert', event, role='event', run_id=run_id))
            else:
                # `$type` spelled out: MongoDB uses a partial index only for a query that contains its
                # filter (it does not derive `$type: 'string'` from an equality with a string).
                selector = {'run_id': run_id, 'idempotency_key': {'$eq': key, '$type': 'string'}}
                writes.append(
                    Write(EVENTS, 'update', selector, {'$setOnInsert': event}, upsert=True, role='event', run_id=run_id)
                )
        for closing in batch.closings:
            update = {'$set': {'status': closing.status, 'ended_at': closing.ended_at}}
            writes.append(Write(RUNS, 'update', {'_id': closing.run_id}, update, role='closing', run_id=closing.run_id))
        for run_id in sorted(claims):
            selector = {'_id': counter_id(run_id), 'gen': claims[run_id].gen}
            writes.append(
                Write(
                    COUNTERS,
                    'update',
                    selector,
                    {'$setOnInsert': {'deleted': True}},
                    upsert=True,
                    role='guard',
                    run_id=run_id,
                )
            )
        return writes, log_size


def run_filter(query: RunQuery, encoding: Encoding) -> tuple[Document, bool]:
    """The `runs` filter for `query`, and whether it is exact (so the limit can be applied by the server).

    Metadata keys that are not plain names (`.`, `$`) cannot be addressed by a field path: those
    filters are left to the kernel, which filters again.
    """
    selector: Document = {}
    exact = True
    for name in RUN_EQUALITY_FIELDS:
        value = getattr(query, name)
        if value is not None:
            selector[name] = value
    if query.status is not None:
        selector['status'] = None if query.status == 'unfinished' else query.status
    started: Document = {}
    if query.started_after is not None:
        started['$gte'] = encoding.time(query.started_after)
    if query.started_before is not None:
        started['$lt'] = encoding.time(query.started_before)
    if started:
        selector['started_at'] = started
    if query.ended_before is not None:
        selector['ended_at'] = {'$lt': encoding.time(query.ended_before)}
    for key, value in (query.metadata or {}).items():
        if _PLAIN_KEY.fullmatch(key):
            selector[f'metadata.{key}'] = value
        else:
            exact = False
    for key, value in (query.run_metadata or {}).items():
        if not _PLAIN_KEY.fullmatch(key):
            exact = False
            continue
        # Equal to the scalar, and not an array holding it (a query on an array matches its elements).
        condition: Document = {'$type': 'null'} if value is None else {'$eq': value}
        condition['$not'] = {'$type': 'array'}
        selector[f'run_metadata.{key}'] = condition
    return selector, exact
