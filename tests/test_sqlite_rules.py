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


class _WriterDuringFirstPass:
    """A checkpointer's connection during whose first pass `writer` writes and commits a transaction."""

    def __init__(self, checkpointer: sqlite3.Connection, writer: sqlite3.Connection) -> None:
        self.checkpointer, self.writer, self.passes = checkpointer, writer, 0

    def execute(self, sql: str) -> sqlite3.Cursor:
        self.passes += 1
        if self.passes == 1:
            self.writer.execute('BEGIN IMMEDIATE')
            self.writer.execute("INSERT INTO t VALUES ('written while the checkpoint ran')")
        cursor = self.checkpointer.execute(sql)
        if self.passes == 1:
            self.writer.execute('COMMIT')
        return cursor


def test_a_background_checkpoint_catches_up_with_a_writer_so_the_wal_starts_over(tmp_path: Path) -> None:
    """A frame left behind by the first pass would keep the WAL from starting over (and growing)."""
    path = tmp_path / 'busy.db'
    with (
        closing(sqlite3.connect(path, isolation_level=None)) as writer,
        closing(sqlite3.connect(path, isolation_level=None)) as checkpointer,
    ):
        enable_wal(writer)
        writer.execute('PRAGMA wal_autocheckpoint = 0')
        writer.execute('CREATE TABLE t (x)')
        for index in range(200):
            writer.execute('INSERT INTO t VALUES (?)', ('x' * 3000 + str(index),))
        connection = _WriterDuringFirstPass(checkpointer, writer)
        checkpoint_caught_up(connection)  # pyright: ignore[reportArgumentType]
        writer.execute("INSERT INTO t VALUES ('the next write')")  # starts the WAL over: all of it was copied
        _, frames, _ = checkpointer.execute('PRAGMA wal_checkpoint(PASSIVE)').fetchone()
        assert frames <= 4, f'the WAL did not start over: {frames} frames'
        assert writer.execute('SELECT count(*) FROM t').fetchone()[0] == 202
