"""Every shipped local media store passes the shared `MediaStore` conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydantic_ai_steps.media import DiskMediaStore, SqliteMediaStore
from pydantic_ai_steps.testing.media_store import MediaStoreConformance


class TestDiskMediaStore(MediaStoreConformance):
    metadata_on_repeat_put = 'last_non_empty'

    @pytest.fixture
    def media_store(self, tmp_path: Path) -> DiskMediaStore:
        return DiskMediaStore(tmp_path / 'media')


class TestSqliteMediaStoreDatabase(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, tmp_path: Path) -> Iterator[SqliteMediaStore]:
        store = SqliteMediaStore(database=tmp_path / 'media.sqlite3')
        yield store
        store.close()


class TestSqliteMediaStoreConnection(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, tmp_path: Path) -> Iterator[SqliteMediaStore]:
        connection = sqlite3.connect(tmp_path / 'shared.sqlite3', check_same_thread=False)
        yield SqliteMediaStore(connection=connection, table='blobs')
        connection.close()


class TestSqliteMediaStoreChunked(MediaStoreConformance):
    """The whole suite again with payloads over 1,000 bytes stored in chunks."""

    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, tmp_path: Path) -> Iterator[SqliteMediaStore]:
        store = SqliteMediaStore(database=tmp_path / 'chunked.sqlite3')
        store.chunk_bytes = 1000
        yield store
        store.close()


class TestSqliteMediaStoreChunkedOnAConnection(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture
    def media_store(self, tmp_path: Path) -> Iterator[SqliteMediaStore]:
        connection = sqlite3.connect(tmp_path / 'shared-chunked.sqlite3', check_same_thread=False)
        store = SqliteMediaStore(connection=connection, table='blobs')
        store.chunk_bytes = 1000
        yield store
        connection.close()
