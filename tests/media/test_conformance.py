"""Every shipped local media store passes the shared `MediaStore` conformance suite."""

from __future__ import annotations

import inspect
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


CHUNK_SIZES = [
    pytest.param(SqliteMediaStore.chunk_bytes, id='inline'),
    pytest.param(1000, id='chunked'),  # the whole suite again with payloads over 1,000 bytes in chunks
]


class TestSqliteMediaStoreDatabase(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture(params=CHUNK_SIZES)
    def media_store(self, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SqliteMediaStore]:
        store = SqliteMediaStore(database=tmp_path / 'media.sqlite3')
        store.chunk_bytes = request.param
        yield store
        store.close()


class TestSqliteMediaStoreConnection(MediaStoreConformance):
    metadata_on_repeat_put = 'first'

    @pytest.fixture(params=CHUNK_SIZES)
    def media_store(self, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SqliteMediaStore]:
        connection = sqlite3.connect(tmp_path / 'shared.sqlite3', check_same_thread=False)
        store = SqliteMediaStore(connection=connection, table='blobs')
        store.chunk_bytes = request.param
        yield store
        connection.close()


def test_every_flag_of_a_media_store_is_checked_where_its_store_is_tested() -> None:
    """A new `bool` parameter must refuse a non-boolean too (`check_bool`), and be tested: these are."""
    from pydantic_ai_steps.media import MongoMediaStore, PostgresMediaStore, S3MediaStore

    stores = (DiskMediaStore, SqliteMediaStore, S3MediaStore, PostgresMediaStore, MongoMediaStore)
    flags = {
        store.__name__: [
            name
            for name, parameter in inspect.signature(store.__init__).parameters.items()
            if parameter.annotation in ('bool', bool)
        ]
        for store in stores
    }
    assert flags == {
        'DiskMediaStore': ['durable'],  # test_disk.py::test_durable_must_be_a_real_boolean
        'SqliteMediaStore': ['durable'],  # test_sqlite.py::test_durable_must_be_a_real_boolean
        'S3MediaStore': [],
        'PostgresMediaStore': [],
        'MongoMediaStore': [],
    }
