"""Every media store checks what it reads against the digest in the URI: damaged bytes read as missing."""

from __future__ import annotations

import pickle
import re
import sqlite3
from pathlib import Path

import pytest

from pydantic_ai_steps.media import DiskMediaStore, MediaIntegrityError, SqliteMediaStore, media_uri_for

pytestmark = pytest.mark.anyio
MiB = 1 << 20


def payload(size: int) -> bytes:
    block = bytes((index * 131 + 17) % 256 for index in range(256))
    return (block * (size // 256 + 1))[:size]


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def assert_damaged(error: pytest.ExceptionInfo[MediaIntegrityError], uri: str, size: int) -> None:
    assert isinstance(error.value, FileNotFoundError)  # callers handling a missing blob handle this too
    message = str(error.value)
    assert uri in message and f'{size} bytes' in message and 'do not match' in message, message
    assert (error.value.uri, error.value.size) == (uri, size)


def test_the_error_is_a_file_not_found_error_and_survives_pickling() -> None:
    error = MediaIntegrityError.damaged(media_uri_for(b'x'), 3, 'stored at /m/x.bin')
    assert isinstance(error, FileNotFoundError)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.uri, copy.size) == (MediaIntegrityError, str(error), error.uri, 3)


# -- Disk ------------------------------------------------------------------------------------------


@pytest.mark.parametrize('size', [100, 3 * MiB], ids=['small', 'large'])
@pytest.mark.parametrize('damage', ['flipped-byte', 'truncated', 'extended'])
async def test_disk_get_of_a_damaged_file_raises(tmp_path: Path, size: int, damage: str) -> None:
    store = DiskMediaStore(tmp_path)
    data = payload(size)
    uri = await store.put(data)
    blob = tmp_path / f'{uri[-64:]}.bin'
    damaged = {'flipped-byte': flip(data, size // 2), 'truncated': data[:-1], 'extended': data + b'!'}[damage]
    blob.write_bytes(damaged)
    with pytest.raises(MediaIntegrityError) as error:
        await store.get(uri)
    assert_damaged(error, uri, len(damaged))
    assert str(blob) in str(error.value)
    assert await store.exists(uri) is True  # exists is a presence check, documented as such
    blob.write_bytes(data)
    assert await store.get(uri) == data  # repaired: reads again


@pytest.mark.parametrize('size', [100, 3 * MiB], ids=['small', 'large'])
@pytest.mark.parametrize('damage', ['truncated', 'emptied', 'extended'])
async def test_disk_put_of_the_same_bytes_repairs_a_file_of_another_size(
    tmp_path: Path, size: int, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = DiskMediaStore(tmp_path)
    data = payload(size)
    uri = await store.put(data)
    blob = tmp_path / f'{uri[-64:]}.bin'
    blob.write_bytes({'truncated': data[: size // 2], 'emptied': b'', 'extended': data + b'!'}[damage])
    assert await store.put(data) == uri
    assert await store.get(uri) == data
    assert f'media blob {blob} holds' in caplog.text
    assert [path.name for path in tmp_path.iterdir()] == [blob.name]  # no temporary file left


# -- SQLite ----------------------------------------------------------------------------------------


def _database(path: Path, statement: str, *parameters: object) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute(statement, parameters)
    connection.close()


@pytest.mark.parametrize('damage', ['flipped-byte', 'truncated'])
async def test_sqlite_get_of_a_damaged_inline_row_raises(tmp_path: Path, damage: str) -> None:
    path = tmp_path / 'media.db'
    store = SqliteMediaStore(database=path)
    data = payload(1000)
    uri = await store.put(data)
    damaged = flip(data, 10) if damage == 'flipped-byte' else data[:500]
    _database(path, 'UPDATE media SET bytes = ? WHERE sha256 = ?', damaged, uri[-64:])
    with pytest.raises(MediaIntegrityError) as error:
        await store.get(uri)
    assert_damaged(error, uri, len(damaged))
    assert "table 'media'" in str(error.value)
    assert await store.exists(uri) is True
    store.close()


@pytest.mark.parametrize('damage', ['flipped-byte', 'truncated-chunk', 'missing-chunk', 'wrong-size'])
async def test_sqlite_get_of_a_damaged_chunked_blob_raises(tmp_path: Path, damage: str) -> None:
    path = tmp_path / 'media.db'
    store = SqliteMediaStore(database=path)
    data = payload(3 * MiB)  # over the 1 MiB chunk size: stored as chunk rows
    uri = await store.put(data)
    with sqlite3.connect(path) as connection:
        (blob_id,) = connection.execute('SELECT blob_id FROM media WHERE sha256 = ?', (uri[-64:],)).fetchone()
    connection.close()
    assert blob_id is not None
    size = len(data)
    if damage == 'flipped-byte':
        second = data[MiB : 2 * MiB]
        _database(path, 'UPDATE media_chunks SET data = ? WHERE blob_id = ? AND idx = 1', flip(second, 7), blob_id)
    elif damage == 'truncated-chunk':
        _database(path, 'UPDATE media_chunks SET data = substr(data, 1, 10) WHERE blob_id = ? AND idx = 1', blob_id)
        size -= MiB - 10
    elif damage == 'missing-chunk':
        _database(path, 'DELETE FROM media_chunks WHERE blob_id = ? AND idx = 2', blob_id)
        size -= MiB
    else:  # the chunks are intact but the row claims another size: the bytes still hash right
        _database(path, 'UPDATE media SET size_bytes = 5 WHERE sha256 = ?', uri[-64:])
    if damage == 'wrong-size':
        assert await store.get(uri) == data
        store.close()
        return
    with pytest.raises(MediaIntegrityError) as error:
        await store.get(uri)
    assert_damaged(error, uri, size)
    if damage != 'flipped-byte':
        assert re.search(rf'its chunks hold {size} of {len(data)} bytes', str(error.value))
    store.close()
