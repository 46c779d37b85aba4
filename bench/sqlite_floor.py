"""Ours' SQL, captured and replayed raw: the SQLite floor `bench/peers.py` and `bench/step_profile.py` measure against.

A run of ours goes through a `RecordingConnection` (every statement, its parameters and its time,
grouped into transactions); `replay` runs those transactions again on a bare `sqlite3`
connection to a database with the same schema; `serialize_cycles` and `one_commit` are the other
parts of the floor.
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import SqliteStepStore
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory


@dataclass
class Statement:
    sql: str
    params: Any
    many: bool
    seconds: float


class RecordingConnection:
    """Stands in for the store's `sqlite3.Connection`: forwards every call, recording statements."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.log: list[Statement] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        start = time.perf_counter()
        cursor = self.connection.execute(sql, params)
        self.log.append(Statement(sql, tuple(params), False, time.perf_counter() - start))
        return cursor

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        rows = [tuple(row) for row in rows]
        start = time.perf_counter()
        cursor = self.connection.executemany(sql, rows)
        self.log.append(Statement(sql, rows, True, time.perf_counter() - start))
        return cursor

    def executescript(self, script: str) -> sqlite3.Cursor:
        return self.connection.executescript(script)

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def close(self) -> None:
        self.connection.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


def open_store(database: Path, *, durable: bool) -> SqliteStepStore:
    """A store on `database` with its connection opened (a schema-ready file: no migration in the run)."""
    store = SqliteStepStore(database=database, durable=durable)
    backend: Any = store.backend
    with backend.lock:
        backend._conn(False)  # the read path: opens the connection, reads the schema version
    return store


def record_store(store: SqliteStepStore) -> RecordingConnection:
    backend: Any = store.backend
    recorder = RecordingConnection(backend._connection)
    backend._connection = recorder
    return recorder


def transactions(log: Sequence[Statement]) -> list[list[Statement]]:
    """Group statements into transactions: `BEGIN`...`COMMIT`, or one autocommit statement. PRAGMAs dropped."""
    grouped: list[list[Statement]] = []
    current: list[Statement] | None = None
    for statement in log:
        head = statement.sql.lstrip().split(None, 1)[0].upper()
        if head == 'PRAGMA':
            continue
        if head == 'BEGIN':
            current = [statement]
        elif current is not None:
            current.append(statement)
            if head in ('COMMIT', 'ROLLBACK'):
                grouped.append(current)
                current = None
        else:
            grouped.append([statement])
    return grouped


def payload_bytes(params: Any) -> int:
    """Bytes bound to a statement (text and blobs by length, numbers as 8)."""
    if isinstance(params, list):
        return sum(payload_bytes(row) for row in cast(list[Any], params))
    total = 0
    for value in cast(tuple[Any, ...], params):
        if isinstance(value, str):
            total += len(value.encode())
        elif isinstance(value, bytes):
            total += len(value)
        elif value is not None:
            total += 8
    return total


def describe_cycle(groups: list[list[Statement]], steps: int) -> list[str]:
    """What ours writes per tool cycle: the transactions of the middle cycles, statement by statement."""
    cycles = steps - 1
    lines = [f'{len(groups)} transactions for {steps} steps ({cycles} tool cycles), per middle cycle:']
    # The run's registration is first and its closing write last; the rest repeats every cycle.
    middle = groups[1:-1]
    per_cycle = len(middle) / cycles if cycles else 0
    lines.append(f'  {per_cycle:.2f} transactions per cycle')
    sample = middle[len(middle) // 2 - (len(middle) // 2) % 2 :][:2]
    for index, group in enumerate(sample):
        lines.append(f'  transaction {index + 1}:')
        for statement in group:
            rows = len(statement.params) if statement.many else 1
            text = ' '.join(statement.sql.split())
            text = text if len(text) <= 70 else text[:67] + '...'
            lines.append(f'    {text}  [{rows} row(s), {payload_bytes(statement.params)} B bound]')
    return lines


async def make_template(directory: Path) -> Path:
    """A database with this release's schema and no rows (written by the store itself)."""
    path = directory / 'template.db'
    store = SqliteStepStore(database=path)
    await make_agent(2, [StepPersistence(store=store, agent_name='bench')]).run('go', usage_limits=UNLIMITED)
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    tables = [
        row[0]
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    ]
    for table in tables:
        if table != 'schema_version':
            conn.execute(f'DELETE FROM {table}')
    conn.execute("DELETE FROM sqlite_sequence WHERE name != ''")
    conn.execute('VACUUM')
    conn.execute('PRAGMA wal_checkpoint(TRUNCATE)')
    conn.close()
    return path


def raw_connection(path: Path, *, durable: bool) -> sqlite3.Connection:
    """A plain connection set up like the store's: WAL, `synchronous`, no automatic checkpoints."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute('PRAGMA journal_mode=WAL')
    conn.execute(f'PRAGMA synchronous={"FULL" if durable else "NORMAL"}')
    conn.execute('PRAGMA wal_autocheckpoint = 0')
    return conn


def replay(conn: sqlite3.Connection, groups: Sequence[Sequence[Statement]]) -> tuple[float, float]:
    """Run the captured transactions again, as they were issued; wall and CPU seconds taken."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    for group in groups:
        for statement in group:
            if statement.many:
                conn.executemany(statement.sql, statement.params)
            else:
                conn.execute(statement.sql, statement.params).fetchall()
    return time.perf_counter() - start, time.process_time() - cpu


def serialize_cycles(history: Sequence[ModelMessage]) -> tuple[float, float]:
    """Wall and CPU seconds to serialize only each cycle's new messages (its response and its tool return)."""
    cycles = [list(history[index : index + 2]) for index in range(1, len(history) - 1, 2)]
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    for cycle in cycles:
        ModelMessagesTypeAdapter.dump_json(cycle)
    return time.perf_counter() - start, time.process_time() - cpu


def one_commit(directory: Path, *, durable: bool, count: int = 40) -> float:
    """Median seconds of a one-row insert committed on its own (WAL, the given `synchronous`)."""
    path = directory / f'commit-{durable}.db'
    conn = raw_connection(path, durable=durable)
    conn.execute('CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)')
    row = 'x' * 200
    samples: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        conn.execute('BEGIN IMMEDIATE')
        conn.execute('INSERT INTO t (v) VALUES (?)', (row,))
        conn.execute('COMMIT')
        samples.append(time.perf_counter() - start)
    conn.close()
    for suffix in ('', '-wal', '-shm'):
        Path(f'{path}{suffix}').unlink(missing_ok=True)
    return statistics.median(samples)
