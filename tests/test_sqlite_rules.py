"""The SQLite rules both SQLite stores share."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest

from pydantic_ai_steps._sqlite import enable_wal


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
