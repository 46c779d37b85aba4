"""The collections, their indexes, and the layout version, set up by a store's first write.

Collections of a step store's database:

- `runs`: `{_id: run_id, gen, <run fields>}`, plus `status` and `ended_at` once a closing event
  is written. `gen` names this registration of the run id (see `counters`).
- `events`, `snapshots`, `tool_effects`: one document per record, `<fields>` plus `seq` (per run,
  from the run's counter). A snapshot names its history by `message_count` and `log_size`.
- `message_log`: the runs' message logs, `{run_id, log_index, position, message}`, `message`
  being the stored text verbatim (a string, never a sub-document).
- `counters`: one document per run, `{_id: 'run:<run_id>', gen, deleted, log, snapshots, events,
  effects}`: where the run's log ends and the last seq of each kind (atomic `$inc`). A deleted
  run's counter stays a while as a tombstone (`deleted: true`), so a writer still writing it
  notices. `{_id: 'layout', version}` records the layout version.
- Read, never written: the upstream package's `snapshot_messages` (`{_id: sha256, message}`,
  referenced by `message_refs` snapshots) and `snapshot_idempotency_keys`, and its global
  counter documents `counters.events` / `counters.snapshots`.

Indexes (the seed's eight, with pymongo's default names, plus two unique ones the writes rely
on, the message log's, and four on `runs` for the lookups the SQL stores index too): `runs`
conversation_id (sparse), parent_run_id (sparse), started_at, (agent_name, started_at),
pydantic_ai_run_id (sparse: `run_record_for`), (status, started_at), (status, ended_at) (the
`status` filter of `list_runs` and `prune`); `events` (run_id, seq), (run_id, idempotency_key)
unique for string keys; `snapshots` (run_id, seq desc), (run_id, state, seq desc),
(run_id, idempotency_key) unique for string keys; `tool_effects` (run_id, tool_call_id) unique,
(run_id, status); `message_log` (run_id, log_index) unique. The specifications of the seed's
match the upstream package's, so a database it created gets no second copy of an index.

Layout version 2 (this release) adds the four `runs` indexes to version 1; the first write to a
database of version 1 (or the upstream package's) creates the indexes it lacks.
"""

from __future__ import annotations

from typing import Any, cast

from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from ...._errors import SchemaVersionError
from ...._mongo import DUPLICATE_KEY, Document, collection

RUNS = 'runs'
EVENTS = 'events'
SNAPSHOTS = 'snapshots'
EFFECTS = 'tool_effects'
LOG = 'message_log'
COUNTERS = 'counters'
UPSTREAM_MESSAGES = 'snapshot_messages'
UPSTREAM_KEYS = 'snapshot_idempotency_keys'
RECORD_COLLECTIONS = (SNAPSHOTS, LOG, EVENTS, EFFECTS)
"""What a run's records live in (besides its `runs` document and its counter), in the order a
deletion removes them: the snapshots before the log they read, so a deletion cut short leaves a
run without snapshots, never snapshots whose messages are gone (read as damage)."""

LAYOUT_ID = 'layout'
LAYOUT_VERSION = 2
PRUNED = 'pruned'
"""The `state` of a snapshot removed by retention that keeps its idempotency key claimed."""

_STRING_KEY = {'idempotency_key': {'$type': 'string'}}

INDEXES: dict[str, list[IndexModel]] = {
    RUNS: [
        IndexModel([('conversation_id', ASCENDING)], sparse=True),
        IndexModel([('parent_run_id', ASCENDING)], sparse=True),
        IndexModel([('started_at', ASCENDING)]),
        IndexModel([('agent_name', ASCENDING), ('started_at', ASCENDING)]),
        IndexModel([('pydantic_ai_run_id', ASCENDING)], sparse=True),
        IndexModel([('status', ASCENDING), ('started_at', ASCENDING)]),
        IndexModel([('status', ASCENDING), ('ended_at', ASCENDING)]),
    ],
    EVENTS: [
        IndexModel([('run_id', ASCENDING), ('seq', ASCENDING)]),
        IndexModel(
            [('run_id', ASCENDING), ('idempotency_key', ASCENDING)], unique=True, partialFilterExpression=_STRING_KEY
        ),
    ],
    SNAPSHOTS: [
        IndexModel([('run_id', ASCENDING), ('seq', DESCENDING)]),
        IndexModel(
            [('run_id', ASCENDING), ('idempotency_key', ASCENDING)], unique=True, partialFilterExpression=_STRING_KEY
        ),
        IndexModel([('run_id', ASCENDING), ('state', ASCENDING), ('seq', DESCENDING)]),
    ],
    EFFECTS: [
        IndexModel([('run_id', ASCENDING), ('tool_call_id', ASCENDING)], unique=True),
        IndexModel([('run_id', ASCENDING), ('status', ASCENDING)]),
    ],
    LOG: [IndexModel([('run_id', ASCENDING), ('log_index', ASCENDING)], unique=True)],
}


def counter_id(run_id: str) -> str:
    return 'run:' + run_id


async def layout_version(database: AsyncDatabase[Document]) -> int | None:
    """The version the database's layout records; `None` when this package never wrote to it."""
    found = await collection(database, COUNTERS).find_one({'_id': LAYOUT_ID})
    if found is None:
        return None
    version = found.get('version')
    return version if isinstance(version, int) else None


def check_readable(version: int | None, name: str) -> None:
    if version is not None and version > LAYOUT_VERSION:
        raise SchemaVersionError(
            f'MongoDB database {name!r} has layout version {version}, written by a newer pydantic-ai-steps; '
            f'this release reads layout versions up to {LAYOUT_VERSION}: upgrade pydantic-ai-steps'
        )


async def set_up(database: AsyncDatabase[Document]) -> None:
    """Create the indexes, bring older layouts forward, and record the version. Idempotent.

    Creating an index needs the privilege to, and a unique index fails to build over duplicates
    already there (two documents for one `(run_id, tool_call_id)`): both surface here, at the first
    write, with the server's own error.
    """
    version = await layout_version(database)
    check_readable(version, database.name)
    if version == LAYOUT_VERSION:
        return
    for name, indexes in INDEXES.items():
        await collection(database, name).create_indexes(indexes)
    await _claim_upstream_keys(database)
    await collection(database, COUNTERS).update_one(
        {'_id': LAYOUT_ID}, {'$max': {'version': LAYOUT_VERSION}}, upsert=True
    )


async def _claim_upstream_keys(database: AsyncDatabase[Document]) -> None:
    """Snapshot keys the upstream package claimed in `snapshot_idempotency_keys` stay claimed here.

    Here a key is claimed by the snapshot document itself (unique `(run_id, idempotency_key)`), and
    retention keeps a removed snapshot's key as a stub (`state: 'pruned'`). The upstream package
    kept its claims in a collection of their own; each one whose snapshot is gone becomes a stub.
    """
    if UPSTREAM_KEYS not in await database.list_collection_names():
        return
    snapshots = collection(database, SNAPSHOTS)
    stubs: list[Document] = []
    async for claim in collection(database, UPSTREAM_KEYS).find({}):
        key: Any = claim.get('_id')
        fields: dict[str, Any] = cast(dict[str, Any], key) if isinstance(key, dict) else {}
        run_id, name = fields.get('run_id'), fields.get('key')
        if isinstance(run_id, str) and isinstance(name, str):
            stubs.append({'run_id': run_id, 'idempotency_key': name, 'state': PRUNED, 'seq': 0})
    for start in range(0, len(stubs), 1000):
        try:
            await snapshots.insert_many(stubs[start : start + 1000], ordered=False)
        except BulkWriteError as error:  # a snapshot holding the key exists: it claims the key already
            if any(failed.get('code') != DUPLICATE_KEY for failed in error.details.get('writeErrors', [])):
                raise
