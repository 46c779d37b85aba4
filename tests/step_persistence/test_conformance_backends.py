"""The shipped backends against the backend-level contract (`testing.backend`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydantic_ai_steps.store.backends.file._backend import FileBackend
from pydantic_ai_steps.store.backends.memory import InMemoryStepStore
from pydantic_ai_steps.store.backends.sqlite._backend import SqliteBackend
from pydantic_ai_steps.testing.backend import BackendConformance, BackendFactory


class TestMemoryBackend(BackendConformance):
    @pytest.fixture
    def make_backend(self) -> BackendFactory:
        return lambda: InMemoryStepStore().backend


class TestSqliteBackend(BackendConformance):
    persistent = True

    @pytest.fixture
    def make_backend(self, tmp_path: Path) -> BackendFactory:
        return lambda: SqliteBackend(database=str(tmp_path / 'steps.db'), connection=None, durable=False)


class TestFileBackend(BackendConformance):
    persistent = True

    @pytest.fixture
    def make_backend(self, tmp_path: Path) -> BackendFactory:
        return lambda: FileBackend(tmp_path / 'steps', durable=False)
