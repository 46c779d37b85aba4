"""The MongoDB backend: one commit is two round trips, correct without transactions.

A commit (`Backend.commit`, in the contract's order) is:

1. For each run the batch writes records of without registering it, one `findOneAndUpdate` of
   the run's counter document: it proves the run is registered and not deleted, checks where the
   run's message log ends (`log: expected_log_size` in the filter, so a writer whose picture is
   stale matches nothing and gets `STALE` with nothing written), and reserves, with one `$inc`,
   the log indices of the snapshot's appends and the seqs of its snapshot, events and effects.
   A registering batch needs none of this: its run's numbers start at zero.
2. One ordered client-level `bulkWrite` (MongoDB 8.0+) of everything: the run document and its
   counter (registration), the log entries, the snapshot, the tool effects (upserts), the
   events (keyed ones as upserts that leave an existing one alone), the closings, and last a guard
   per run that fails if the run was deleted (or deleted and registered again) meanwhile.

Why this order is safe without transactions:

- A crash between 1 and 2 leaves reserved numbers unused: a gap in the log and in the seqs, which
  nothing reads. A crash inside 2 (the server's: the client's death does not stop a command the
  server has received) leaves a prefix of it: log entries no snapshot names (every read goes
  through a snapshot's `log_size`, and the next writer, finding the log moved, rewrites the
  history in full past them), or a snapshot whose effects and events did not follow (the ledger
  then says `started` for a call the snapshot holds: the crash contract's safe direction).
- Two writers of one run are serialized by the counter: the second finds `log` moved and gets
  `STALE`, or reserved a range of its own; a snapshot never mixes entries of two writers.
- The snapshot document claims its idempotency key (unique `(run_id, idempotency_key)`), and
  retention turns a keyed snapshot into a stub that keeps the claim (`state: 'pruned'`), so a
  replay finds the key taken however old: `SUPPRESSED`, and the rest of the batch is written.
- Deleting a run first turns its counter into a tombstone with a new `gen`, then deletes its
  records, then its run document. A writer that claimed before the tombstone still writes, but its
  last write, the guard (an upsert of the counter with the `gen` it claimed under, which collides
  with the tombstone), fails; it then removes what it wrote and raises `RunNotFoundError`. Anything
  it wrote before the deletion was deleted with the run. So a run reads whole or not at all.

On a server before 8.0 the same writes go one `bulk_write` per run of writes to one collection,
in the same order (up to seven round trips for a batch touching every collection).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import TypeGuard

from bson import ObjectId
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

from ...._errors import RunAlreadyExistsError, RunNotFoundError
from ...._mongo import (
    DUPLICATE_KEY,
    MAX_DOCUMENT_BYTES,
    ClientHandle,
    Document,
    Write,
    WriteFailed,
    Writer,
    collection,
    reports_unreachable,
)
from ...._records import RunQuery, utc_now
from ...backend import (
    STALE,
    SUPPRESSED,
    CommitOutcome,
    Damaged,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    SnapshotWrite,
    WriteBatch,
    log_slice,
)
from ...codec import RESOLUTION_FIELDS, Encoding
from ._layout import (
    COUNTERS,
    EFFECTS,
    EVENTS,
    LOG,
    PRUNED,
    RUNS,
    SNAPSHOTS,
    UPSTREAM_MESSAGES,
    check_readable,
    counter_id,
    layout_version,
    set_up,
)
from ._legacy import counter_from_records, upstream_texts
from ._plan import Claim, Needs, Plan, run_filter
from ._removal import log_removal, runs_removal, snapshots_removal, undoing

MAX_TEXT_BYTES = MAX_DOCUMENT_BYTES - 1024
"""The longest message text one log document holds: 16 MiB less room for the document's other
fields (a run id is at most 200 characters, 800 bytes)."""


@reports_unreachable('handle')
class MongoBackend:
    """I/O of `MongoStepStore`: documents, indexes and the layouts of older releases (see the module docs)."""

    encoding = Encoding(native_maps=True, omit_empty=True)
    max_text_bytes = MAX_TEXT_BYTES

    def __init__(self, handle: ClientHandle, database: str) -> None:
        self.handle = handle
        self.database_name = database
        self.writer = Writer(handle, database)
        self._set_up = False
        self._readable = False

    def _database(self) -> AsyncDatabase[Document]:
        return self.handle.database(self.database_name)

    def _collection(self, name: str) -> AsyncCollection[Document]:
        return collection(self._database(), name)

    async def _for_reading(self) -> None:
        if not self._readable:
            check_readable(await layout_version(self._database()), self.database_name)
            self._readable = True

    # --- writes -----------------------------------------------------------------------------

    async def _for_writing(self) -> None:
        if not self._set_up:
            await set_up(self._database())
            self._set_up = self._readable = True

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        plan = Plan.build(batch)  # every size and key checked before anything is sent
        await self._for_writing()
        registered = batch.run['run_id'] if batch.run is not None else None
        claims: dict[str, Claim] = {}
        snapshot_run = batch.snapshot.run_id if batch.snapshot is not None else None
        for run_id in sorted(batch.run_ids, key=lambda run_id: (run_id != snapshot_run, run_id)):
            if run_id == registered:
                claims[run_id] = Claim(ObjectId(), 0, 1, 1, 1)
                continue
            expected = (
                batch.snapshot.expected_log_size if batch.snapshot is not None and run_id == snapshot_run else None
            )
            claim = await self._claim(run_id, plan.needs[run_id], expected)
            if claim is None:
                if batch.snapshot is not None and await self._key_claimed(batch.snapshot):
                    # A replay whose snapshot landed before: suppressed wherever the log ends now,
                    # and the rest of the batch written (nothing was claimed yet: this run comes first).
                    await self.commit(replace(batch, snapshot=None))
                    return SUPPRESSED
                return STALE
            claims[run_id] = claim
        writes, log_size = plan.writes(claims)
        return await self._apply(writes, log_size)

    async def _key_claimed(self, write: SnapshotWrite) -> bool:
        if write.key is None:
            return False
        selector = {'run_id': write.run_id, 'idempotency_key': {'$eq': write.key, '$type': 'string'}}
        return await self._collection(SNAPSHOTS).find_one(selector, projection={'_id': 1}) is not None

    async def _claim(self, run_id: str, needs: Needs, expected_log: int | None) -> Claim | None:
        """Reserve the run's numbers (see the module docs); `None` when its log does not end at `expected_log`."""
        counters = self._collection(COUNTERS)
        selector: Document = {'_id': counter_id(run_id), 'deleted': {'$ne': True}}
        if expected_log is not None:
            selector['log'] = expected_log
        increments = needs.increments()
        for _ in range(3):
            if increments:
                found = await counters.find_one_and_update(
                    selector, {'$inc': increments}, return_document=ReturnDocument.AFTER
                )
            else:
                found = await counters.find_one(selector)
            if found is not None:
                return Claim(
                    found.get('gen'),
                    int(found.get('log', 0)) - needs.log,
                    int(found.get('snapshots', 0)),
                    int(found.get('events', 0)) - needs.events + 1,
                    int(found.get('effects', 0)) - needs.effects + 1,
                )
            state = await counters.find_one({'_id': counter_id(run_id)}, projection={'deleted': 1})
            if state is not None:
                if state.get('deleted') is True:
                    raise RunNotFoundError(run_id)
                if expected_log is not None:
                    return None  # registered and alive: its log ends elsewhere
                continue  # it was (re)created between the two reads: claim again
            # No counter: a run the upstream package registered, or whose registration was cut short.
            if await self._collection(RUNS).find_one({'_id': run_id}, projection={'_id': 1}) is None:
                raise RunNotFoundError(run_id)
            numbers = await counter_from_records(self._database(), run_id)
            with contextlib.suppress(DuplicateKeyError):  # another writer created it meanwhile
                await counters.insert_one(
                    {'_id': counter_id(run_id), 'run_id': run_id, 'gen': ObjectId(), 'deleted': False, **numbers}
                )
        return None

    async def _apply(self, writes: list[Write], log_size: int | None) -> CommitOutcome:
        outcome: CommitOutcome = log_size
        start, retries = 0, 0
        while True:
            try:
                await self.writer.apply(writes[start:])
                return outcome
            except WriteFailed as failed:
                index = start + failed.index
                write = writes[index]
                if failed.code != DUPLICATE_KEY:
                    raise OperationFailure(str(failed), failed.code) from None
                if write.role == 'register':
                    raise RunAlreadyExistsError(str(write.run_id)) from None
                if write.role == 'snapshot':  # its key was claimed before: write the rest
                    outcome, start = SUPPRESSED, index + 1
                    await self._withdraw([w for w in writes[:index] if w.role == 'append'])
                elif write.role == 'event':  # the same keyed event, inserted by another writer just now
                    start = index + 1
                elif write.role == 'effect' and retries < 3:  # two first upserts of one call: now it matches
                    start, retries = index, retries + 1
                elif write.role == 'append':  # the log holds entries past the counter's end (a reset counter)
                    await self._catch_up(str(write.run_id))
                    return STALE
                else:  # 'reset', 'guard': the run was deleted while this batch was being written
                    await self._undo(writes[:index])
                    raise RunNotFoundError(str(write.run_id)) from None

    async def _withdraw(self, appends: Sequence[Write]) -> None:
        """Take back the appends of a suppressed snapshot, as the contract has it write none: remove them,
        and move the run's log end back over them unless a writer reserved more since (then they are a
        gap, which the next write of this run answers as stale)."""
        if not appends:
            return
        run_id = str(appends[0].run_id)
        end = max(int(write.document['log_index']) for write in appends) + 1
        with contextlib.suppress(PyMongoError, WriteFailed):  # what stays is entries no snapshot names
            await self.writer.apply([Write(LOG, 'delete_many', {'_id': {'$in': [w.document['_id'] for w in appends]}})])
            await self._collection(COUNTERS).update_one(
                {'_id': counter_id(run_id), 'log': end}, {'$inc': {'log': -len(appends)}}
            )

    async def _catch_up(self, run_id: str) -> None:
        """Move the run's counter past the highest log index stored, so the next claim cannot collide again."""
        last = await self._collection(LOG).find_one(
            {'run_id': run_id}, projection={'log_index': 1}, sort=[('log_index', DESCENDING)]
        )
        if last is not None and _is_int(last.get('log_index')):
            await self._collection(COUNTERS).update_one(
                {'_id': counter_id(run_id)}, {'$max': {'log': last['log_index'] + 1}}
            )

    async def _undo(self, applied: Sequence[Write]) -> None:
        """Remove what a batch wrote before it found its run deleted (see the module docs)."""
        with contextlib.suppress(PyMongoError, WriteFailed):  # what stays is what a crash here would leave
            await self.writer.apply(undoing(applied))

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        await self._for_writing()
        selector: Document = {'run_id': run_id, 'tool_call_id': tool_call_id, 'status': 'started'}
        if not overwrite:
            selector['resolution'] = None  # also matches a document without the field
        update: Document = {'$set': {name: resolution[name] for name in RESOLUTION_FIELDS if name in resolution}}
        absent = {name: '' for name in RESOLUTION_FIELDS if name not in resolution}
        if absent:
            update['$unset'] = absent
        found = await self._collection(EFFECTS).update_one(selector, update)
        return found.matched_count == 1

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        await self.writer.apply(snapshots_removal(run_id, seqs))

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        found = await self._collection(RUNS).find({'_id': {'$in': list(run_ids)}}, projection={'gen': 1}).to_list()
        gens = {document['_id']: document.get('gen') for document in found}
        existing = {run_id: gens[run_id] for run_id in run_ids if run_id in gens}
        if existing:
            await self.writer.apply(runs_removal(existing, utc_now()))
        return list(existing)

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        await self.writer.apply(log_removal(run_id, indices))

    # --- reads ------------------------------------------------------------------------------

    async def fetch_run(self, run_id: str) -> Row | None:
        await self._for_reading()
        return await self._collection(RUNS).find_one({'_id': run_id})

    async def fetch_runs(self, query: RunQuery) -> list[Row]:
        await self._for_reading()
        if query.limit == 0:
            return []
        selector, exact = run_filter(query, self.encoding)
        direction = DESCENDING if query.newest_first else ASCENDING
        # Equal start times in registration order (`gen`, an ObjectId, grows with it), reversed for newest first.
        order = [('started_at', direction), ('gen', direction), ('_id', direction)]
        cursor = self._collection(RUNS).find(selector, sort=order)
        if exact and query.limit is not None:
            cursor = cursor.limit(query.limit)
        return await cursor.to_list()

    async def fetch_events(self, run_id: str) -> list[Row]:
        await self._for_reading()
        return (
            await self._collection(EVENTS)
            .find({'run_id': run_id}, sort=[('seq', ASCENDING), ('_id', ASCENDING)])
            .to_list()
        )

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        await self._for_reading()
        selector: Document = {'run_id': run_id}
        if tool_call_id is not None:
            selector['tool_call_id'] = tool_call_id
        if unresolved_only:
            selector.update(status='started', resolution=None)
        return await self._collection(EFFECTS).find(selector, sort=[('seq', ASCENDING), ('_id', ASCENDING)]).to_list()

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        await self._for_reading()
        if limit == 0:
            return []
        selector: Document = {'run_id': run_id}
        # A document without a state was written before states existed: it is complete.
        selector['state'] = {'$ne': PRUNED} if include_interrupted else {'$in': ['complete', None]}
        if below_seq is not None:
            selector['seq'] = {'$lt': below_seq}
        cursor = self._collection(SNAPSHOTS).find(selector, sort=[('seq', ASCENDING if oldest_first else DESCENDING)])
        if limit is not None:
            cursor = cursor.limit(limit)
        documents = [document for document in await cursor.to_list() if _is_int(document.get('seq'))]
        upstream = [
            document
            for document in documents
            if 'messages' in document and document.get('message_count') is None and document.get('log_size') is None
        ]
        texts: dict[int, list[str] | Damaged] = {}
        if upstream:
            for document, found in zip(upstream, await upstream_texts(self._database(), upstream, run_id), strict=True):
                texts[id(document)] = found
        return [SnapshotRow(document['seq'], document, texts.get(id(document))) for document in documents]

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        await self._for_reading()
        cursor = self._collection(SNAPSHOTS).find(
            {'run_id': run_id, 'state': {'$ne': PRUNED}}, projection={'seq': 1, 'state': 1}
        )
        states: list[tuple[int, str]] = []
        async for document in cursor:
            state = document.get('state')
            if _is_int(document.get('seq')):
                states.append((document['seq'], state if isinstance(state, str) else 'complete'))
        return states

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        await self._for_reading()
        selector = {
            'run_id': run_id,
            'log_index': {'$lt': min(below_index, 1 << 62)},
            'position': {'$lt': min(positions_below, 1 << 62)},
        }
        projection = {'_id': 0, 'log_index': 1, 'position': 1, 'message': 1}
        cursor = self._collection(LOG).find(selector, projection=projection, batch_size=10_000)
        return log_slice([(doc.get('log_index'), doc.get('position'), doc.get('message')) async for doc in cursor])

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        pattern = {'$regex': re.escape(needle)}
        sources = ((LOG, 'message'), (UPSTREAM_MESSAGES, 'message'), (SNAPSHOTS, 'messages'))
        for name, key in sources:
            cursor = self._collection(name).find({key: pattern}, projection={'_id': 0, key: 1}, batch_size=500)
            async for document in cursor:
                text = document.get(key)
                if isinstance(text, str):
                    yield text

    async def reclaim_space(self) -> None:
        return None  # WiredTiger reuses freed space itself; `compact` is an operator's decision

    async def probe(self) -> Probe:
        database = self._database()
        names = await database.list_collection_names()
        if not names:
            return Probe(exists=False, step_store=False, detail=f'database {self.database_name!r} has no collections')
        stats = await database.command('dbStats')
        size = int(stats.get('storageSize', 0) or 0) + int(stats.get('indexSize', 0) or 0) or None
        if RUNS not in names:
            detail = f'database {self.database_name!r} has no {RUNS!r} collection'
            return Probe(exists=True, step_store=False, size_bytes=size, detail=detail)
        return Probe(exists=True, step_store=True, size_bytes=size)

    async def aclose(self) -> None:
        await self.handle.aclose()


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
