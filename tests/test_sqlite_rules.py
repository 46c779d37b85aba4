"""The SQLite rules both SQLite stores share."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest

from pydantic_ai_steps._sqlite import checkpoint_caught_up, enable_wal


def test_enable_wal_waits_for_another_connection_holding_the_database(tmp_path: Path) -> None:
    path = tmp_path / 'shared.db'
    with closing(sqlite3.connect(path, isolation_level=None, check_same_thread=False)) as holder:
        holder.execute('CREATE TABLE t (x)')
        holder.execute('BEGIN EXCLUSIVE')  # as a second process creating the same store would
        with closing(sqlite3.connect(path, isolation_level=None, timeout=0.05)) as late:
            with pytest.raises(sqlite3.OperationalError, match='locked'):
                late.execute('PRAGMA journal_mode=WAL')  # what a bare pragma does
            release = threading.Timer(0.3, lambda: holder.execute('COMMIT'))
            release.start()
            enable_wal(late)
            release.join()
            assert late.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'


def test_enable_wal_gives_up_after_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / 'held.db'
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute('CREATE TABLE t (x)')
        holder.execute('BEGIN EXCLUSIVE')
        with (
            closing(sqlite3.connect(path, isolation_level=None, timeout=0.01)) as late,
            pytest.raises(sqlite3.OperationalError, match='locked'),
        ):
            enable_wal(late, timeout=0.2)
        holder.execute('COMMIT')


class _WriterDuringEveryPassivePass:
    """A checkpointer's connection during each of whose `PASSIVE` passes `writer` commits a
    transaction, as a store's writer committing every few milliseconds does; it keeps the
    statements it was given."""

    def __init__(self, checkpointer: sqlite3.Connection, writer: sqlite3.Connection) -> None:
        self.checkpointer, self.writer = checkpointer, writer
        self.statements: list[str] = []

    def execute(self, sql: str) -> sqlite3.Cursor:
        self.statements.append(sql)
        if 'PASSIVE' not in sql:
            return self.checkpointer.execute(sql)
        self.writer.execute('BEGIN IMMEDIATE')
        self.writer.execute("INSERT INTO t VALUES ('written while the checkpoint ran')")
        cursor = self.checkpointer.execute(sql)
        self.writer.execute('COMMIT')
        return cursor


def _fill(writer: sqlite3.Connection) -> None:
    enable_wal(writer)
    writer.execute('PRAGMA wal_autocheckpoint = 0')
    writer.execute('CREATE TABLE t (x)')
    for index in range(200):
        writer.execute('INSERT INTO t VALUES (?)', ('x' * 3000 + str(index),))


def test_a_background_checkpoint_catches_up_with_a_writer_so_the_wal_starts_over(tmp_path: Path) -> None:
    """Frames a writer adds during every pass would keep the WAL from starting over (and growing)."""
    path = tmp_path / 'busy.db'
    with (
        closing(sqlite3.connect(path, isolation_level=None)) as writer,
        closing(sqlite3.connect(path, isolation_level=None)) as checkpointer,
    ):
        _fill(writer)
        checkpoint_caught_up(_WriterDuringEveryPassivePass(checkpointer, writer))  # pyright: ignore[reportArgumentType]
        writer.execute("INSERT INTO t VALUES ('the next write')")  # starts the WAL over: all of it was copied
        _, frames, _ = checkpointer.execute('PRAGMA wal_checkpoint(PASSIVE)').fetchone()
        assert frames <= 4, f'the WAL did not start over: {frames} frames'
        assert writer.execute('SELECT count(*) FROM t').fetchone()[0] == 202


def test_a_background_checkpoint_does_not_hold_writers_up_behind_a_reader(tmp_path: Path) -> None:
    """A reader's snapshot keeps frames from being copied: a `RESTART` would make writers wait on it."""
    path = tmp_path / 'read.db'
    with (
        closing(sqlite3.connect(path, isolation_level=None)) as writer,
        closing(sqlite3.connect(path, isolation_level=None)) as reader,
        closing(sqlite3.connect(path, isolation_level=None)) as checkpointer,
    ):
        _fill(writer)
        reader.execute('BEGIN')
        assert reader.execute('SELECT count(*) FROM t').fetchone()[0] == 200  # holds its snapshot
        writer.execute("INSERT INTO t VALUES ('after the reader began')")
        connection = _WriterDuringEveryPassivePass(checkpointer, writer)
        checkpoint_caught_up(connection)  # pyright: ignore[reportArgumentType]
        assert connection.statements == ['PRAGMA wal_checkpoint(PASSIVE)']
        reader.execute('COMMIT')
        assert writer.execute('SELECT count(*) FROM t').fetchone()[0] == 202
