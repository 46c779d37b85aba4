from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydantic_ai_steps.step_persistence import SqliteStepStore
from pydantic_ai_steps.testing.step_store import StepStoreConformance, StoreFactory


class TestSqliteStepStore(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: SqliteStepStore(database=tmp_path / 'steps.db', **options)


class TestSqliteStepStoreInlineMedia(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> StoreFactory:
        return lambda **options: SqliteStepStore(database=tmp_path / 'steps.db', media_store=None, **options)


class TestSqliteStepStoreSharedConnection(StepStoreConformance):
    persistent = True

    @pytest.fixture
    def connection(self, tmp_path: Path) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(tmp_path / 'shared.db', check_same_thread=False, isolation_level=None)
        yield conn
        conn.close()

    @pytest.fixture
    def make_store(self, connection: sqlite3.Connection) -> StoreFactory:
        return lambda **options: SqliteStepStore(connection=connection, **options)
