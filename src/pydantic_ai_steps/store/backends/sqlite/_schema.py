"""The SQLite step store's tables, its migrations, and reading a database that was not migrated.

Version 3 is the layout this release writes. A database is migrated by the first *write* that
reaches it, never by a read, so inspecting a database another program owns (the upstream
package's, say) changes nothing in it. Until then, reads use the columns the database has
(`Columns`), reading a missing one as NULL.

What migrating adds is additive: new tables, new columns, new indexes; the one thing it removes
is indexes of this package's own that version 3 no longer keeps. It leaves in place what
the upstream package relies on (its tables, its triggers, its key table
`snapshot_idempotency_keys`, which this layout uses too), so an upstream process can keep
writing the same file. What upstream cannot read afterwards: the snapshots this package writes
(their history is in `messages`, which upstream does not know).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass

from ...._errors import NotAStoreError, SchemaVersionError
from ...codec import RUN_FIELDS

SCHEMA_VERSION = 3

RUN_COLUMNS = (*RUN_FIELDS, 'status', 'ended_at')
_CREATE_TABLES = (
    'CREATE TABLE IF NOT EXISTS runs ('
    'run_id TEXT PRIMARY KEY, conversation_id TEXT, parent_run_id TEXT, agent_name TEXT, '
    'metadata TEXT NOT NULL, started_at TEXT NOT NULL, registration_id TEXT, pydantic_ai_run_id TEXT, '
    'run_metadata TEXT, parent_tool_call_id TEXT, continued_from TEXT, forked_from TEXT, status TEXT, ended_at TEXT)',
    # `seq` is the rowid, without AUTOINCREMENT (databases created before version 3 keep it): that
    # would read and rewrite `sqlite_sequence` on every insert. A run's `seq`s still grow, as a new
    # rowid is above every stored one; only the numbers of the newest events deleted come back.
    'CREATE TABLE IF NOT EXISTS events ('
    'seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, kind TEXT NOT NULL, '
    'step_index INTEGER NOT NULL, timestamp TEXT NOT NULL, conversation_id TEXT, parent_run_id TEXT, '
    'agent_name TEXT, tool_call_id TEXT, tool_name TEXT, error TEXT, metadata TEXT NOT NULL, '
    'idempotency_key TEXT, tool_args TEXT)',
    'CREATE TABLE IF NOT EXISTS snapshots ('
    'seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, step_index INTEGER NOT NULL, '
    'conversation_id TEXT, parent_run_id TEXT, agent_name TEXT, timestamp TEXT NOT NULL, '
    "state TEXT NOT NULL DEFAULT 'complete', messages TEXT NOT NULL, idempotency_key TEXT, "
    'message_count INTEGER, log_size INTEGER)',
    'CREATE TABLE IF NOT EXISTS messages ('
    'run_id TEXT NOT NULL, log_index INTEGER NOT NULL, position INTEGER NOT NULL, message TEXT NOT NULL, '
    # A rowid table, not WITHOUT ROWID: messages are kilobytes, and WITHOUT ROWID keeps only a small
    # part of a row on its page and spills the rest to overflow pages (docs/design.md has the sizes).
    'PRIMARY KEY (run_id, log_index))',
    'CREATE TABLE IF NOT EXISTS snapshot_idempotency_keys ('
    'run_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, PRIMARY KEY (run_id, idempotency_key)) WITHOUT ROWID',
    'CREATE TABLE IF NOT EXISTS tool_effects ('
    'run_id TEXT NOT NULL, tool_call_id TEXT NOT NULL, tool_name TEXT NOT NULL, status TEXT NOT NULL, '
    'started_at TEXT NOT NULL, ended_at TEXT, idempotency_key TEXT, effect_summary TEXT, resolution TEXT, '
    'resolved_by TEXT, resolved_at TEXT, resolution_note TEXT, PRIMARY KEY (run_id, tool_call_id))',
)
_CREATE_SCHEMA_VERSION = 'CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)'
_ADDED_COLUMNS = (
    # Nullable columns a table of an older database (or the upstream package's, or a partial one) may lack.
    ('runs', 'conversation_id', 'TEXT'),
    ('runs', 'parent_run_id', 'TEXT'),
    ('runs', 'agent_name', 'TEXT'),
    ('runs', 'registration_id', 'TEXT'),
    ('runs', 'pydantic_ai_run_id', 'TEXT'),
    ('runs', 'run_metadata', 'TEXT'),
    ('runs', 'parent_tool_call_id', 'TEXT'),
    ('runs', 'continued_from', 'TEXT'),
    ('runs', 'forked_from', 'TEXT'),
    ('runs', 'status', 'TEXT'),
    ('runs', 'ended_at', 'TEXT'),
    ('events', 'conversation_id', 'TEXT'),
    ('events', 'parent_run_id', 'TEXT'),
    ('events', 'agent_name', 'TEXT'),
    ('events', 'tool_call_id', 'TEXT'),
    ('events', 'tool_name', 'TEXT'),
    ('events', 'error', 'TEXT'),
    ('events', 'idempotency_key', 'TEXT'),
    ('events', 'tool_args', 'TEXT'),
    ('snapshots', 'conversation_id', 'TEXT'),
    ('snapshots', 'parent_run_id', 'TEXT'),
    ('snapshots', 'agent_name', 'TEXT'),
    ('snapshots', 'state', "TEXT NOT NULL DEFAULT 'complete'"),
    ('snapshots', 'idempotency_key', 'TEXT'),
    ('snapshots', 'message_count', 'INTEGER'),
    ('snapshots', 'log_size', 'INTEGER'),
    ('tool_effects', 'ended_at', 'TEXT'),
    ('tool_effects', 'idempotency_key', 'TEXT'),
    ('tool_effects', 'effect_summary', 'TEXT'),
    ('tool_effects', 'resolution', 'TEXT'),
    ('tool_effects', 'resolved_by', 'TEXT'),
    ('tool_effects', 'resolved_at', 'TEXT'),
    ('tool_effects', 'resolution_note', 'TEXT'),
)
_CREATE_INDEXES = (
    'CREATE INDEX IF NOT EXISTS idx_runs_conversation_started ON runs(conversation_id, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_parent_started ON runs(parent_run_id, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_started ON runs(started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_agent_started ON runs(agent_name, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_pydantic_ai ON runs(pydantic_ai_run_id) WHERE pydantic_ai_run_id IS NOT NULL',
    'CREATE INDEX IF NOT EXISTS idx_runs_status_started ON runs(status, started_at)',
    'CREATE INDEX IF NOT EXISTS idx_runs_status_ended ON runs(status, ended_at)',
)
# One index per table a step writes to, besides its key: every index is one more page each write
# transaction changes. A run's events are found by this one (SQLite takes NULL keys as distinct)
# and put in `seq` order after; a run's complete snapshots by walking its newest first.
_EVENTS_INDEX_NAME = 'idx_events_run_keys'
_EVENTS_INDEX = f'CREATE UNIQUE INDEX IF NOT EXISTS {_EVENTS_INDEX_NAME} ON events(run_id, idempotency_key)'
_SNAPSHOTS_INDEX_NAME = 'idx_snapshots_run_seq'
_SNAPSHOTS_INDEX = f'CREATE INDEX IF NOT EXISTS {_SNAPSHOTS_INDEX_NAME} ON snapshots(run_id, seq)'
ON_KEY_CONFLICT = 'ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING'
"""How an event insert skips a key already stored: a target that names our unique index and the
upstream package's partial one alike."""
_DROPPED_INDEXES = ('idx_events_run_seq', 'idx_events_run_key', 'idx_snapshots_run_state_seq')
"""This package's indexes of version 2 that version 3 does without."""
TABLES = ('runs', 'events', 'snapshots', 'tool_effects', 'messages', 'snapshot_idempotency_keys')


def schema_version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute('SELECT MAX(version) FROM schema_version').fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0]) if row is not None and row[0] is not None else 0


def check_readable(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f'database schema version {version} is newer than this release understands '
            f'({SCHEMA_VERSION}); upgrade pydantic-ai-steps to open it'
        )


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database to `SCHEMA_VERSION`. Call inside a write transaction that re-checked the version."""
    version = schema_version(conn)
    check_readable(version)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        _MIGRATIONS[target](conn)
        conn.execute('INSERT INTO schema_version (version) VALUES (?)', (target,))


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    """The message log. Databases of older layouts (ours, or the upstream package's) are adopted."""
    conn.execute(_CREATE_SCHEMA_VERSION)


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    """Run status, pydantic-ai's run id and run metadata, lineage of continues and forks, ledger resolutions.

    Snapshot keys live in `snapshot_idempotency_keys` (the upstream package's table, which it keeps
    using); keys an earlier release kept in `snapshot_keys` move there.
    """
    for statement in _CREATE_TABLES:
        conn.execute(statement)
    for table, column, declaration in _ADDED_COLUMNS:
        if column not in table_columns(conn, table):
            conn.execute(f'ALTER TABLE {table} ADD COLUMN {column} {declaration}')
    for statement in _CREATE_INDEXES:
        conn.execute(statement)
    _create_step_indexes(conn)  # before the closing events are looked up below, run by run
    if 'snapshot_keys' in _tables(conn):
        conn.execute(
            'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) '
            'SELECT run_id, idempotency_key FROM snapshot_keys'
        )
        conn.execute('DROP TABLE snapshot_keys')
    # Rows of runs that ended before status existed: read the closing event once (`+seq`: on the
    # run's index, as in `fetch_events`).
    conn.execute(
        "UPDATE runs SET (status, ended_at) = (SELECT CASE kind WHEN 'run_completed' THEN 'completed' "
        "ELSE 'failed' END, timestamp FROM events e WHERE e.run_id = runs.run_id "
        "AND kind IN ('run_completed', 'run_failed') ORDER BY +seq DESC LIMIT 1) WHERE status IS NULL"
    )


def _migrate_to_3(conn: sqlite3.Connection) -> None:
    """Fewer indexes to write: one of `events` (its key, no longer partial) and one of `snapshots`."""
    for statement in _CREATE_INDEXES:
        conn.execute(statement)
    for index in _DROPPED_INDEXES:
        conn.execute(f'DROP INDEX IF EXISTS {index}')
    _create_step_indexes(conn)


def _create_step_indexes(conn: sqlite3.Connection) -> None:
    """The index of `events` and the one of `snapshots`, each unless other indexes of the database do its work.

    A database the upstream package created has its own: `(run_id, seq)` of both tables and the
    events' partial unique key, which it writes through and so keeps. Ours beside them would be
    one more index each event and snapshot row updates, doing what theirs already do: it is not
    created, or dropped where an earlier migration created it.
    """
    events = [index for index in _indexes(conn, 'events') if index.name != _EVENTS_INDEX_NAME]
    covered = any(index.unique and index.columns == ('run_id', 'idempotency_key') for index in events) and any(
        index.columns[:1] == ('run_id',) and not index.partial for index in events
    )
    if covered:
        conn.execute(f'DROP INDEX IF EXISTS {_EVENTS_INDEX_NAME}')
    if not (covered and _event_insert_compiles(conn)):
        conn.execute(_EVENTS_INDEX)
    snapshots = [index for index in _indexes(conn, 'snapshots') if index.name != _SNAPSHOTS_INDEX_NAME]
    if any(index.columns == ('run_id', 'seq') and not index.partial for index in snapshots):
        conn.execute(f'DROP INDEX IF EXISTS {_SNAPSHOTS_INDEX_NAME}')
    else:
        conn.execute(_SNAPSHOTS_INDEX)


def _event_insert_compiles(conn: sqlite3.Connection) -> bool:
    """Whether the event insert's `ON CONFLICT` target names a unique index of the database: SQLite
    decides that (a partial index's condition included) when it compiles the statement."""
    try:
        conn.execute(f'EXPLAIN INSERT INTO events (run_id, idempotency_key) VALUES (NULL, NULL) {ON_KEY_CONFLICT}')
    except sqlite3.OperationalError:
        return False
    return True


@dataclass(frozen=True)
class _Index:
    name: str
    columns: tuple[str | None, ...]
    """Its key columns in order; `None` for an expression, or for a column compared other than byte
    by byte (such an index neither serves a plain `=` on the column nor holds our keys unique)."""
    unique: bool
    partial: bool


def _indexes(conn: sqlite3.Connection, table: str) -> list[_Index]:
    """The indexes of `table`, as `_create_step_indexes` compares them."""
    found: list[_Index] = []
    for _, name, unique, _, partial in conn.execute(f'PRAGMA index_list({table})').fetchall():
        quoted = str(name).replace('"', '""')
        columns = tuple(
            column if collation == 'BINARY' else None
            for _, _, column, _, collation, key in conn.execute(f'PRAGMA index_xinfo("{quoted}")')
            if key
        )
        found.append(_Index(str(name), columns, bool(unique), bool(partial)))
    return found


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1, 2: _migrate_to_2, 3: _migrate_to_3}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The table's column names; its name is bound, so another application's table of any name reads too."""
    return {row[0] for row in conn.execute('SELECT name FROM pragma_table_info(?)', (table,))}


@dataclass(frozen=True)
class Columns:
    """What a database has, for reading one that may not be migrated yet."""

    tables: frozenset[str]
    columns: dict[str, frozenset[str]]

    @classmethod
    def read(cls, conn: sqlite3.Connection) -> Columns:
        tables = frozenset(_tables(conn))
        return cls(tables, {table: frozenset(table_columns(conn, table)) for table in tables})

    def has(self, table: str) -> bool:
        return table in self.tables

    def select(self, table: str, fields: Sequence[str], prefix: str = '') -> str:
        """`a, b, NULL, ...` for `fields`, NULL where the column is missing."""
        present = self.columns.get(table, frozenset())
        return ', '.join(f'{prefix}{name}' if name in present else 'NULL' for name in fields)


def foreign_tables(columns: Columns) -> str | None:
    """What makes tables of a step store's names another application's, or `None`.

    Every layout a step store opens (this one, older ones, the upstream package's) has `runs`, and
    in each of these tables the columns no migration adds. Migrating a table without them would
    widen it, or fail halfway; other tables beside a step store's are no concern of it.
    """
    required = _required_columns()
    present = [table for table in required if columns.has(table)]
    if present and not columns.has('runs'):
        return f'it has a {present[0]} table but no runs table'
    for table in present:
        missing = sorted(required[table] - columns.columns[table])
        if missing:
            return f"its {table} table has no column(s) {', '.join(missing)}, which every step store's has"
    return None


def check_step_tables(columns: Columns, database: str) -> None:
    """Refuse another application's database, before anything is changed in it (its journal mode included)."""
    problem = foreign_tables(columns)
    if problem is not None:
        raise NotAStoreError(
            f"SQLite database {database!r} holds tables that are not a step store's ({problem}); nothing in it "
            'was changed. Give the step store a database of its own'
        )


@functools.cache
def _required_columns() -> dict[str, frozenset[str]]:
    """Each table's columns that no migration adds, read from the tables this layout creates."""
    added = {(table, column) for table, column, _ in _ADDED_COLUMNS}
    with closing(sqlite3.connect(':memory:')) as conn:
        for statement in (_CREATE_SCHEMA_VERSION, *_CREATE_TABLES):
            conn.execute(statement)
        return {
            table: frozenset(column for column in table_columns(conn, table) if (table, column) not in added)
            for table in ('schema_version', *TABLES)
        }
