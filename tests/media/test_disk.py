"""`DiskMediaStore` specifics: layout, sidecars, key strategies, permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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


async def test_public_url_uses_the_resolver(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path, public_url=make_static_public_url('https://cdn.example/', key_prefix='m/'))
    uri = await store.put(b'x')
    assert await store.public_url(uri) == f'https://cdn.example/m/{uri[-64:]}.bin'

    async def presign(uri: str, ctx: MediaContext) -> str:
        return f'signed:{uri[-6:]}:{ctx.media_type}'

    signed = DiskMediaStore(tmp_path, public_url=presign)
    assert await signed.public_url(uri, context=MediaContext(media_type='image/png')) == f'signed:{uri[-6:]}:image/png'
