"""`DiskMediaStore` specifics: layout, sidecars, key strategies, permissions."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from pydantic_ai_steps.media import DiskMediaStore, MediaContext, make_static_public_url, media_uri_for

pytestmark = pytest.mark.anyio


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def all_files(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob('*')) if root.exists() else []


async def test_default_layout_is_digest_dot_bin_and_directory_is_created_lazily(tmp_path: Path) -> None:
    root = tmp_path / 'nested' / 'media'
    store = DiskMediaStore(root)
    assert not root.exists()
    uri = await store.put(b'hello')
    assert uri == 'media+sha256://2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824'
    assert all_files(root) == ['2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824.bin']


async def test_sidecar_only_with_metadata_and_replaced_only_by_non_empty_metadata(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'blob')
    digest = uri.removeprefix('media+sha256://')
    assert all_files(tmp_path) == [f'{digest}.bin']
    await store.put(b'blob', context=MediaContext(metadata={'a': 'é'}))
    sidecar = tmp_path / f'{digest}.bin.meta.json'
    assert sidecar.is_file()
    assert await store.get_metadata(uri) == {'a': 'é'}
    await store.put(b'blob')
    assert await store.get_metadata(uri) == {'a': 'é'}
    await store.put(b'blob', context=MediaContext(metadata={'b': '2'}))
    assert await store.get_metadata(uri) == {'b': '2'}
    assert not [name for name in all_files(tmp_path) if name.endswith('.tmp')]


@pytest.mark.parametrize('flag', ['yes', 1, None], ids=['str', 'int', 'none'])
def test_durable_must_be_a_real_boolean(tmp_path: Path, flag: object) -> None:
    """`durable='no'` would be truthy: refused, like the step stores refuse it."""
    with pytest.raises(ValueError, match=rf'^durable must be True or False, got {re.escape(repr(flag))}$'):
        DiskMediaStore(tmp_path, durable=flag)  # pyright: ignore[reportArgumentType]
    assert not any(tmp_path.iterdir())


async def test_files_are_owner_only_and_created_directories_0o700(tmp_path: Path) -> None:
    root = tmp_path / 'a' / 'b'
    store = DiskMediaStore(root, key_strategy=lambda uri, ctx: 'sub/dir/' + uri[-64:] + '.bin')
    uri = await store.put(b'secret', context=MediaContext(metadata={'k': 'v'}))
    blob = root / 'sub' / 'dir' / (uri[-64:] + '.bin')
    assert mode(blob) == 0o600
    assert mode(blob.with_name(blob.name + '.meta.json')) == 0o600
    for directory in (tmp_path / 'a', root, root / 'sub', root / 'sub' / 'dir'):
        assert mode(directory) == 0o700, directory


async def test_permissions_hold_under_a_permissive_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        store = DiskMediaStore(tmp_path / 'm')
        uri = await store.put(b'x', context=MediaContext(metadata={'k': 'v'}))
    finally:
        os.umask(previous)
    blob = tmp_path / 'm' / (uri[-64:] + '.bin')
    assert mode(blob) == 0o600
    assert mode(tmp_path / 'm') == 0o700


@pytest.mark.parametrize(
    'key',
    [
        '/etc/passwd',
        '../escape.bin',
        'a/../../escape.bin',
        'a/..',
        '..',
        '..\\escape.bin',
        'C:\\x.bin',
        '',
        '.',
        'a\x00b',
    ],
)
async def test_unsafe_key_strategies_are_rejected_before_anything_is_written(tmp_path: Path, key: str) -> None:
    root = tmp_path / 'store'
    store = DiskMediaStore(root, key_strategy=lambda uri, ctx: key)
    with pytest.raises(ValueError, match='traversal-unsafe path'):
        await store.put(b'payload', context=MediaContext(metadata={'k': 'v'}))
    uri = media_uri_for(b'payload')
    for call in (store.get, store.exists, store.get_metadata):
        with pytest.raises(ValueError, match='traversal-unsafe path'):
            await call(uri)
    assert all_files(tmp_path) == []


async def test_uri_is_validated_before_the_key_strategy_runs(tmp_path: Path) -> None:
    seen: list[str] = []

    def strategy(uri: str, ctx: MediaContext) -> str:
        seen.append(uri)
        return 'x.bin'

    store = DiskMediaStore(tmp_path, key_strategy=strategy)
    with pytest.raises(ValueError, match='not a media URI'):
        await store.get('https://example.com/x.bin')
    assert seen == []


async def test_context_dependent_key_strategy(tmp_path: Path) -> None:
    def by_type(uri: str, ctx: MediaContext) -> str:
        extension = {'image/png': '.png'}.get(ctx.media_type or '', '.bin')
        return f'images/{uri.removeprefix("media+sha256://")}{extension}'

    store = DiskMediaStore(tmp_path, key_strategy=by_type)
    png = MediaContext(media_type='image/png')
    uri = await store.put(b'png bytes', context=png)
    assert (tmp_path / 'images' / (uri[-64:] + '.png')).is_file()
    assert await store.get(uri, context=png) == b'png bytes'
    assert await store.exists(uri) is False  # without the context the strategy points elsewhere


async def test_damaged_sidecar_is_a_clear_value_error(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'blob', context=MediaContext(metadata={'a': 'b'}))
    (tmp_path / (uri[-64:] + '.bin.meta.json')).write_text('{"a": 1}')
    with pytest.raises(ValueError, match='metadata entries must map str to str'):
        await store.get_metadata(uri)
    (tmp_path / (uri[-64:] + '.bin.meta.json')).write_text('{"a": ["%s"]}' % ('x' * 100_000))
    with pytest.raises(ValueError, match='metadata entries must map str to str') as raised:
        await store.get_metadata(uri)
    assert len(str(raised.value)) < 1000  # a damaged value is quoted by its start, end and length


async def test_public_url_uses_the_resolver(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path, public_url=make_static_public_url('https://cdn.example/', key_prefix='m/'))
    uri = await store.put(b'x')
    assert await store.public_url(uri) == f'https://cdn.example/m/{uri[-64:]}.bin'

    async def presign(uri: str, ctx: MediaContext) -> str:
        return f'signed:{uri[-6:]}:{ctx.media_type}'

    signed = DiskMediaStore(tmp_path, public_url=presign)
    assert await signed.public_url(uri, context=MediaContext(media_type='image/png')) == f'signed:{uri[-6:]}:image/png'


# -- large puts: written to a temp file while a helper thread hashes them ---------------------------


def _big(size: int = 2 << 20, seed: int = 0) -> bytes:
    return bytes((seed + index * 7) % 251 for index in range(251)) * (size // 251) + b'tail'


def large_store(root: Path, **kwargs: Any) -> DiskMediaStore:
    store = DiskMediaStore(root, **kwargs)
    store.concurrent_put_bytes = 1 << 20
    return store


async def test_large_put_round_trips_byte_exact_with_owner_only_file(tmp_path: Path) -> None:
    store = large_store(tmp_path / 'm')
    payload = _big()
    uri = await store.put(payload, context=MediaContext(metadata={'k': 'v'}))
    assert uri == media_uri_for(payload)
    blob = tmp_path / 'm' / (uri[-64:] + '.bin')
    assert all_files(tmp_path / 'm') == [blob.name, blob.name + '.meta.json']
    assert mode(blob) == 0o600
    assert await store.get(uri) == payload
    assert await store.get_metadata(uri) == {'k': 'v'}


async def test_large_put_of_a_stored_blob_rewrites_nothing_and_only_refreshes_it(tmp_path: Path) -> None:
    store = large_store(tmp_path)
    payload = _big(seed=1)
    uri = await store.put(payload)
    blob = tmp_path / (uri[-64:] + '.bin')
    os.utime(blob, (1_000_000, 1_000_000))
    before = blob.stat()
    assert await store.put(payload) == uri
    after = blob.stat()
    assert after.st_ino == before.st_ino  # the same file: not written again
    assert after.st_mtime > time.time() - 60  # but marked as put now, for garbage collection
    assert all_files(tmp_path) == [blob.name]


async def test_large_put_failing_midway_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai_steps.media.stores import disk

    written: list[Path] = []

    def half_then_disk_full(path: Path, payload: bytes, durable: bool) -> None:
        del durable
        path.write_bytes(payload[: len(payload) // 2])
        written.append(path)
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(disk, 'write_new_file', half_then_disk_full)
    store = large_store(tmp_path / 'm')
    with pytest.raises(OSError, match='No space left'):
        await store.put(_big(seed=2))
    assert len(written) == 1
    assert written[0].parent == tmp_path / 'm'
    assert all_files(tmp_path / 'm') == []


async def test_large_put_with_an_unsafe_key_stores_nothing(tmp_path: Path) -> None:
    store = large_store(tmp_path / 'm', key_strategy=lambda uri, ctx: '../escape.bin')
    with pytest.raises(ValueError, match='traversal-unsafe path'):
        await store.put(_big(seed=3))
    assert all_files(tmp_path / 'm') == []
    assert not (tmp_path / 'escape.bin').exists()


async def test_large_puts_of_the_same_payload_racing_store_one_blob(tmp_path: Path) -> None:
    stores = [large_store(tmp_path), large_store(tmp_path)]
    payload = _big(seed=4)
    uris: list[str] = []

    async def put(store: DiskMediaStore) -> None:
        uris.append(await store.put(payload))

    async with anyio.create_task_group() as group:
        for store in stores:
            group.start_soon(put, store)
    assert uris == [media_uri_for(payload)] * 2
    assert all_files(tmp_path) == [uris[0][-64:] + '.bin']
    assert await stores[1].get(uris[0]) == payload


async def test_large_put_through_a_key_strategy_into_a_subdirectory(tmp_path: Path) -> None:
    store = large_store(tmp_path / 'm', key_strategy=lambda uri, ctx: 'a/b/' + uri[-64:] + '.dat')
    payload = _big(seed=5)
    uri = await store.put(payload)
    assert all_files(tmp_path / 'm') == ['a', 'a/b', f'a/b/{uri[-64:]}.dat']
    assert mode(tmp_path / 'm' / 'a' / 'b') == 0o700
    assert await store.get(uri) == payload


@pytest.mark.parametrize('size', [100, 2 << 20])
async def test_durable_store_flushes_files_and_new_directory_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    from pydantic_ai_steps.media.stores import _disk_files, disk

    files: list[int] = []
    directories: list[Path] = []
    monkeypatch.setattr(disk.os, 'fsync', lambda fd: files.append(fd))
    for module in (disk, _disk_files):
        monkeypatch.setattr(module, 'fsync_dir', lambda path: directories.append(path))
    plain = DiskMediaStore(tmp_path / 'plain')
    await plain.put(_big(size, seed=1), context=MediaContext(metadata={'k': 'v'}))
    assert files == [] and directories == []

    root = tmp_path / 'durable' / 'media'
    store = DiskMediaStore(root, durable=True)
    await store.put(_big(size, seed=1), context=MediaContext(metadata={'k': 'v'}))
    assert len(files) == 2  # the blob and its sidecar
    # the two new directories' entries, then the blob's and the sidecar's renames
    assert directories == [tmp_path, tmp_path / 'durable', root, root]


# -- key lengths the file system cannot take are refused up front ------------------------------------


@pytest.mark.parametrize(
    ('key', 'message'),
    [
        ('k' * 5000, 'file name of 5000 bytes in UTF-8; a file name may have at most 245 bytes'),
        ('é' * 123, 'file name of 246 bytes in UTF-8; a file name may have at most 245 bytes'),
        ('d' * 256 + '/blob.bin', 'directory name of 256 bytes in UTF-8; a directory name may have at most 255'),
        (
            '/'.join(['d' * 250] * 20) + '/blob.bin',
            r'path of \d{4,} bytes in UTF-8; a path may have at most 4054 bytes',
        ),
    ],
    ids=['5000-chars', 'non-ascii-name', 'long-directory', 'long-path'],
)
async def test_keys_too_long_for_the_file_system_are_rejected_before_anything_is_written(
    tmp_path: Path, key: str, message: str
) -> None:
    root = tmp_path / 'store'
    store = DiskMediaStore(root, key_strategy=lambda uri, ctx: key)
    for payload in (b'payload', _big()):  # the small and the large put path
        with pytest.raises(ValueError, match=message) as caught:
            await store.put(payload, context=MediaContext(metadata={'k': 'v'}))
        assert not isinstance(caught.value, OSError)
        assert key[:20] in str(caught.value) and media_uri_for(payload) in str(caught.value)
        assert len(str(caught.value)) < 600  # the key is shortened in the message, not printed whole
        for call in (store.get, store.exists, store.get_metadata):
            with pytest.raises(ValueError, match=message):
                await call(media_uri_for(payload))
        if payload == b'payload':
            assert not root.exists()  # a small put checks the key before it touches the disk
    # A large put is written while it is hashed, so its key is known only afterwards: the
    # temporary file it wrote in the root is gone, and nothing else was created.
    assert all_files(root) == []


async def test_the_longest_allowed_file_name_stores_blob_sidecar_and_temp_files(tmp_path: Path) -> None:
    def longest(uri: str, ctx: MediaContext) -> str:
        return uri[-64:] + 'n' * 177 + '.bin'  # 245 bytes: with '.meta.json' the sidecar's name is 255

    store = DiskMediaStore(tmp_path, key_strategy=longest)
    names: list[str] = []
    for payload in (b'payload', _big()):
        uri = await store.put(payload, context=MediaContext(metadata={'k': 'v'}))
        assert await store.get(uri) == payload
        assert await store.get_metadata(uri) == {'k': 'v'}
        names += [longest(uri, MediaContext()), longest(uri, MediaContext()) + '.meta.json']
    assert all_files(tmp_path) == sorted(names)
