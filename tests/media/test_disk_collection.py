"""`DiskMediaStore.list_blobs`, `delete` and `prepare_collection`: what is listed, what a delete removes,
races with puts, and what killed puts and deletes left."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pydantic_ai_steps._files import fsync_dir
from pydantic_ai_steps.media import DiskMediaStore, KeyStrategy, MediaContext, default_key_strategy, media_uri_for
from pydantic_ai_steps.media.stores import _disk_files, disk
from pydantic_ai_steps.store import CollectableMediaStore

pytestmark = pytest.mark.anyio
OLD = 1_000_000.0  # an mtime in 1970: long before any grace period


def files(root: Path) -> list[str]:
    return sorted(path.relative_to(root).as_posix() for path in root.rglob('*') if not path.is_dir())


async def listed(store: DiskMediaStore) -> dict[str, int]:
    return {blob.uri: blob.size async for blob in store.list_blobs()}


def digest(uri: str) -> str:
    return uri.removeprefix('media+sha256://')


async def test_is_collectable_and_an_absent_directory_lists_nothing(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path / 'never-created')
    assert isinstance(store, CollectableMediaStore)
    assert await listed(store) == {}
    assert await store.delete(media_uri_for(b'x')) is False
    assert not (tmp_path / 'never-created').exists()


@pytest.mark.parametrize('size', [10, 2 << 20], ids=['small', 'large'])
async def test_a_repeat_put_refreshes_the_mtime_of_the_same_file(tmp_path: Path, size: int) -> None:
    store = DiskMediaStore(tmp_path)
    store.concurrent_put_bytes = 1 << 20
    data = os.urandom(size)
    uri = await store.put(data)
    blob = tmp_path / f'{digest(uri)}.bin'
    os.utime(blob, (OLD, OLD))
    inode = blob.stat().st_ino
    before = datetime.now(UTC) - timedelta(seconds=1)
    await store.put(data)
    (info,) = [blob async for blob in store.list_blobs()]
    assert info.stored_at >= before and blob.stat().st_ino == inode
    assert files(tmp_path) == [blob.name]


async def test_listing_skips_sidecars_temporary_files_links_and_foreign_files(tmp_path: Path) -> None:
    root = tmp_path / 'media'
    store = DiskMediaStore(root)
    tagged = await store.put(b'tagged', context=MediaContext(metadata={'k': 'v'}))
    plain = await store.put(b'plain' * 100)
    outside = tmp_path / 'outside'
    outside.mkdir()
    elsewhere = DiskMediaStore(outside)
    linked = await elsewhere.put(b'linked')
    (root / f'{digest(linked)}.bin').symlink_to(outside / f'{digest(linked)}.bin')  # a planted link
    (root / 'linked-dir').symlink_to(outside, target_is_directory=True)
    (root / f'put-{"a" * 32}.tmp').write_bytes(b'half a put')
    (root / f'gc-{"b" * 32}.tmp').write_bytes(b'being deleted')
    (root / 'notes.txt').write_text('not a blob')
    (root / f'{digest(media_uri_for(b"backup"))}.bin.bak').write_bytes(b'backup')  # a digest, not its key
    (root / 'sub').mkdir()
    (root / 'sub' / f'{digest(media_uri_for(b"moved"))}.bin').write_bytes(b'moved')  # not where the key is
    assert await listed(store) == {tagged: 6, plain: 500}


async def test_a_key_strategy_with_the_digest_in_subdirectories(tmp_path: Path) -> None:
    def fanned_out(uri: str, context: MediaContext) -> str:
        hex_digest = digest(uri)
        return f'{hex_digest[:2]}/{hex_digest[2:4]}/{hex_digest}.blob'

    store = DiskMediaStore(tmp_path, key_strategy=fanned_out)
    uris = {await store.put(f'payload {index}'.encode()): 9 for index in range(5)}
    assert await listed(store) == uris
    gone = next(iter(uris))
    assert await store.delete(gone) is True
    assert await listed(store) == {uri: 9 for uri in uris if uri != gone}
    assert not (tmp_path / fanned_out(gone, MediaContext())).exists()


@pytest.mark.parametrize('directory', ['absolute', 'relative'])
async def test_a_key_strategy_spelling_a_path_unusually_still_finds_its_files(
    tmp_path: Path, directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing walks absolute paths: a store built with a relative directory finds its files too."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path if directory == 'absolute' else Path('.')
    store = DiskMediaStore(root, key_strategy=lambda uri, context: f'./x//{digest(uri)}.bin')
    uri = await store.put(b'spelled oddly')
    assert files(tmp_path) == [f'x/{digest(uri)}.bin']
    assert await listed(store) == {uri: 13}
    assert await store.delete(uri, stored_before=datetime.now(UTC) + timedelta(minutes=1)) is True
    assert files(tmp_path) == []


async def test_a_key_strategy_without_the_digest_hashes_the_files_to_find_their_uris(tmp_path: Path) -> None:
    def base32(uri: str, context: MediaContext) -> str:
        return 'b32/' + base64.b32encode(bytes.fromhex(digest(uri))).decode().rstrip('=').lower()

    store = DiskMediaStore(tmp_path, key_strategy=base32)
    one = await store.put(b'one', context=MediaContext(metadata={'k': 'v'}))
    two = await store.put(b'two two')
    (tmp_path / 'b32' / 'stray').write_bytes(b'a file no key names')
    assert await listed(store) == {one: 3, two: 7}
    assert await store.delete(one) is True
    assert await store.get_metadata(two) == {}
    assert files(tmp_path) == sorted(['b32/stray', base32(two, MediaContext())])


async def test_blobs_of_a_context_dependent_key_strategy_are_not_listed_nor_deleted(tmp_path: Path) -> None:
    """Unsupported for garbage collection: delete() finds a blob through the key of an empty context."""

    def by_type(uri: str, context: MediaContext) -> str:
        return digest(uri) + ('.png' if context.media_type == 'image/png' else '.bin')

    store = DiskMediaStore(tmp_path, key_strategy=by_type)
    png = await store.put(b'png', context=MediaContext(media_type='image/png'))
    other = await store.put(b'other')
    assert await listed(store) == {other: 5}
    assert await store.delete(png) is False
    assert await store.get(png, context=MediaContext(media_type='image/png')) == b'png'


async def test_delete_removes_the_sidecar_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'tagged', context=MediaContext(metadata={'k': 'v'}))
    os.utime(tmp_path / f'{digest(uri)}.bin', (OLD, OLD))
    assert await store.delete(uri, stored_before=datetime.now(UTC)) is True
    assert files(tmp_path) == []
    assert await store.delete(uri) is False


async def test_a_blob_put_since_the_cutoff_is_put_back_under_its_name(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'fresh', context=MediaContext(metadata={'k': 'v'}))
    blob = tmp_path / f'{digest(uri)}.bin'
    inode = blob.stat().st_ino
    assert await store.delete(uri, stored_before=datetime.now(UTC) - timedelta(minutes=5)) is False
    assert blob.stat().st_ino == inode and await store.get_metadata(uri) == {'k': 'v'}
    assert files(tmp_path) == [blob.name, blob.name + '.meta.json']


async def test_a_put_racing_a_delete_writes_the_blob_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the rename and the unlink no put can refresh the doomed file: it finds no blob and writes one."""
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'contested')
    os.utime(tmp_path / f'{digest(uri)}.bin', (OLD, OLD))
    real_lstat = os.lstat

    def lstat_after_a_racing_put(path: str | os.PathLike[str]) -> os.stat_result:
        if Path(path).name.startswith('gc-'):
            store._put_sync(b'contested', MediaContext(metadata={'raced': 'yes'}))  # pyright: ignore[reportPrivateUsage]
        return real_lstat(path)

    monkeypatch.setattr(disk.os, 'lstat', lstat_after_a_racing_put)
    assert await store.delete(uri, stored_before=datetime.now(UTC)) is True  # the old file went
    monkeypatch.undo()
    assert await store.get(uri) == b'contested'  # the racing put's copy stays, with its sidecar
    assert await store.get_metadata(uri) == {'raced': 'yes'}
    assert [blob.uri async for blob in store.list_blobs()] == [uri]


async def test_delete_without_a_cutoff_removes_even_a_fresh_blob(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'fresh')
    assert await store.delete(uri) is True
    assert files(tmp_path) == []


async def test_a_planted_link_is_never_followed(tmp_path: Path) -> None:
    root = tmp_path / 'media'
    store = DiskMediaStore(root)
    await store.put(b'makes the directory')
    target = tmp_path / 'precious'
    target.write_bytes(b'linked')
    os.utime(target, (OLD, OLD))
    uri = media_uri_for(b'linked')
    (root / f'{digest(uri)}.bin').symlink_to(target)
    for payload in (b'linked', b'linked' + b'\0' * (1 << 20)):  # a small put, and a large one's rename
        (root / f'{digest(media_uri_for(payload))}.bin').unlink(missing_ok=True)
        (root / f'{digest(media_uri_for(payload))}.bin').symlink_to(target)
        with pytest.raises(PermissionError, match='is a symbolic link'):
            await store.put(payload)  # neither taken for the blob nor written through
        assert not await store.exists(media_uri_for(payload))
        with pytest.raises(FileNotFoundError, match='media not found'):
            await store.get(media_uri_for(payload))  # a read does not follow it either
    assert target.read_bytes() == b'linked' and target.stat().st_mtime == OLD
    assert await store.delete(uri) is True  # the link goes; what it pointed to stays
    assert target.read_bytes() == b'linked' and target.stat().st_mtime == OLD
    assert sorted(path.name for path in root.iterdir() if path.name.startswith('put-')) == []


async def test_a_folder_at_a_blobs_name_reads_as_missing_and_holds_no_descriptor(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = media_uri_for(b'shadowed')
    (tmp_path / f'{digest(uri)}.bin').mkdir()
    (tmp_path / f'{digest(uri)}.bin{disk.SIDECAR_SUFFIX}').mkdir()
    descriptors = len(os.listdir('/proc/self/fd'))
    for _ in range(5):
        with pytest.raises(FileNotFoundError, match='media not found'):
            await store.get(uri)
    assert len(os.listdir('/proc/self/fd')) == descriptors
    assert not await store.exists(uri)


async def test_a_fifo_at_a_blobs_name_reads_as_missing_without_waiting(
    tmp_path: Path, plant_fifo: Callable[[Path], None]
) -> None:
    """Opening a FIFO for reading waits for a writer: a FIFO reads as missing, as a folder does."""
    store = DiskMediaStore(tmp_path)
    uri = media_uri_for(b'shadowed')
    kept = await store.put(b'kept')
    plant_fifo(tmp_path / f'{digest(uri)}.bin')
    plant_fifo(tmp_path / f'{digest(kept)}.bin{disk.SIDECAR_SUFFIX}')
    with pytest.raises(FileNotFoundError, match='media not found'):
        await store.get(uri)
    with pytest.raises(FileNotFoundError, match='media not found'):
        await store.get_metadata(uri)
    assert not await store.exists(uri)
    assert await store.get_metadata(kept) == {}
    assert await listed(store) == {kept: 4}


def test_a_fifo_in_place_of_a_folder_is_not_waited_on_when_syncing_it(
    tmp_path: Path, plant_fifo: Callable[[Path], None]
) -> None:
    plant_fifo(tmp_path / 'folder')
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / 'folder')


def fanned_out(uri: str, context: MediaContext) -> str:
    return f'{digest(uri)[:2]}/{digest(uri)}.bin'


@pytest.mark.parametrize('planted', ['root', 'subfolder'])
async def test_a_linked_folder_is_never_entered(tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    root, outside = tmp_path / 'media', tmp_path / 'outside'
    payloads = [b'kept apart', b'large' * (1 << 19)]  # a small put and a large one
    uris = [media_uri_for(payload) for payload in payloads]
    if planted == 'root':
        root.symlink_to(outside, target_is_directory=True)
    for uri, payload in zip(uris, payloads, strict=True):
        prefix = digest(uri)[:2]
        if planted == 'subfolder':
            (root / prefix).parent.mkdir(exist_ok=True)
            (root / prefix).symlink_to(outside / prefix, target_is_directory=True)
        (outside / prefix).mkdir(parents=True)
        (outside / prefix / f'{digest(uri)}.bin').write_bytes(payload)  # what a follower would find
    before = files(outside)
    store = DiskMediaStore(root, key_strategy=fanned_out)
    for uri, payload in zip(uris, payloads, strict=True):
        with pytest.raises(PermissionError, match=r'media folder .* is a symbolic link'):
            await store.put(payload)
        for read in (store.get, store.exists, store.get_metadata, store.delete):
            with pytest.raises(PermissionError, match='symbolic link'):
                await read(uri)
    assert await listed(store) == {}  # a linked root with a warning, a linked subfolder as any link
    assert ('not listing the blobs in media folder' in caplog.text) == (planted == 'root')
    assert files(outside) == before
    for uri, payload in zip(uris, payloads, strict=True):
        assert (outside / digest(uri)[:2] / f'{digest(uri)}.bin').read_bytes() == payload


async def test_a_folder_of_another_user_is_refused(
    tmp_path: Path, give_away: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    store = DiskMediaStore(tmp_path / 'media', key_strategy=fanned_out)
    uri = await store.put(b'theirs')
    give_away(tmp_path / 'media' / digest(uri)[:2])
    with pytest.raises(PermissionError, match='belongs to another user'):
        await store.put(b'theirs')
    with pytest.raises(PermissionError, match='belongs to another user'):
        await store.delete(uri)
    assert await listed(store) == {}
    assert 'belongs to another user' in caplog.text


@pytest.mark.parametrize(
    ('stored_before', 'error', 'message'),
    [
        (datetime(2030, 1, 1), ValueError, 'stored_before must be timezone-aware'),
        (1e9, TypeError, 'stored_before must be an aware datetime or None, got float'),
    ],
    ids=['naive', 'epoch-seconds'],
)
async def test_a_cutoff_must_be_an_aware_datetime(
    tmp_path: Path, stored_before: object, error: type[Exception], message: str
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'kept')
    with pytest.raises(error, match=message):
        await store.delete(uri, stored_before=stored_before)  # pyright: ignore[reportArgumentType]
    assert await store.get(uri) == b'kept'


async def test_listing_hands_blobs_over_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, '_LIST_BATCH', 7)
    store = DiskMediaStore(tmp_path)
    uris = {await store.put(str(index).encode()) for index in range(50)}
    seen = [blob.uri async for blob in store.list_blobs()]
    assert sorted(seen) == sorted(uris)


# -- what a process killed inside a put or a delete left -------------------------------------------


def killed_deleting(blob: Path) -> Path:
    """The file `delete(uri, stored_before=)` leaves when its process dies between its rename and its unlink."""
    doomed = blob.with_name(f'gc-{uuid.uuid4().hex}.tmp')
    os.rename(blob, doomed)
    return doomed


@pytest.mark.parametrize('key_strategy', [default_key_strategy, fanned_out], ids=['flat', 'fanned-out'])
async def test_a_blob_a_killed_delete_left_aside_is_put_back_after_an_hour(
    tmp_path: Path, key_strategy: KeyStrategy, an_hour_later: Callable[[], None]
) -> None:
    """The blob may still be referenced (put again while the delete looked): it goes back, as put now."""
    store = DiskMediaStore(tmp_path, key_strategy=key_strategy)
    uri = await store.put(b'still referenced', context=MediaContext(metadata={'k': 'v'}))
    key = str(key_strategy(uri, MediaContext()))
    os.utime(tmp_path / key, (OLD, OLD))
    doomed = killed_deleting(tmp_path / key)
    await store.prepare_collection()
    assert await listed(store) == {}
    assert doomed.exists()  # a running delete may hold it: its rename is recent, whatever its mtime
    an_hour_later()
    assert await listed(store) == {} and doomed.exists()  # a listing (a dry run's) writes nothing
    await store.prepare_collection()
    assert files(tmp_path) == [key, key + disk.SIDECAR_SUFFIX]
    assert await store.get(uri) == b'still referenced' and await store.get_metadata(uri) == {'k': 'v'}
    assert await listed(store) == {uri: 16}
    assert await store.delete(uri, stored_before=datetime.now(UTC) - timedelta(minutes=5)) is False


@pytest.mark.parametrize('copy', ['whole', 'cut-short'])
async def test_a_killed_deletes_leftover_beside_a_blob_put_again_goes(
    tmp_path: Path, copy: str, an_hour_later: Callable[[], None]
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'put again')
    blob = tmp_path / f'{digest(uri)}.bin'
    killed_deleting(blob)
    await store.put(b'put again')
    if copy == 'cut-short':
        blob.write_bytes(b'put')
    an_hour_later()
    await store.prepare_collection()
    assert files(tmp_path) == [blob.name]
    assert await store.get(uri) == b'put again'


async def test_a_damaged_leftover_goes_under_the_name_of_its_bytes_to_be_collected(
    tmp_path: Path, an_hour_later: Callable[[], None]
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'bit rot')
    doomed = killed_deleting(tmp_path / f'{digest(uri)}.bin')
    doomed.write_bytes(b'bit rut')
    an_hour_later()
    await store.prepare_collection()
    assert await listed(store) == {media_uri_for(b'bit rut'): 7}  # referenced by nothing: the next collection's


async def test_a_leftover_whose_blob_the_key_strategy_keeps_elsewhere_stays_with_a_warning(
    tmp_path: Path, an_hour_later: Callable[[], None], caplog: pytest.LogCaptureFixture
) -> None:
    uri = await DiskMediaStore(tmp_path).put(b'moved on')
    doomed = killed_deleting(tmp_path / f'{digest(uri)}.bin')
    store = DiskMediaStore(tmp_path, key_strategy=fanned_out)  # another layout since
    an_hour_later()
    await store.prepare_collection()
    assert await listed(store) == {}
    assert files(tmp_path) == [doomed.name]
    assert f'leaving {doomed}, left by a deletion cut short: its blob does not belong in that folder' in caplog.text


async def test_a_put_killed_before_its_rename_leaves_a_file_removed_after_an_hour(
    tmp_path: Path, an_hour_later: Callable[[], None]
) -> None:
    store = DiskMediaStore(tmp_path, key_strategy=fanned_out)
    uri = await store.put(b'kept')
    leftovers = [tmp_path / f'put-{"a" * 32}.tmp', tmp_path / digest(uri)[:2] / f'put-{"b" * 32}.tmp']
    for leftover in leftovers:  # a large put's in the root, a small one's beside its blob
        leftover.write_bytes(b'half a p')
        os.utime(leftover, (OLD, OLD))
    await store.prepare_collection()
    assert await listed(store) == {uri: 4}
    assert all(leftover.exists() for leftover in leftovers)  # a running put may be writing them
    an_hour_later()
    await store.prepare_collection()
    assert await listed(store) == {uri: 4}
    assert files(tmp_path) == [fanned_out(uri, MediaContext())]


def killed_before_its_sidecar(blob: Path) -> None:
    """What a delete leaves when its process dies between removing the blob and its sidecar."""
    blob.unlink()


@pytest.mark.parametrize('key_strategy', [default_key_strategy, fanned_out], ids=['flat', 'fanned-out'])
async def test_a_sidecar_a_killed_delete_left_goes_at_the_next_collection(
    tmp_path: Path, key_strategy: KeyStrategy
) -> None:
    """Left, it would be read as the metadata of the same bytes put again without any."""
    store = DiskMediaStore(tmp_path, key_strategy=key_strategy)
    uri = await store.put(b'deleted', context=MediaContext(metadata={'k': 'v'}))
    kept = await store.put(b'kept', context=MediaContext(metadata={'k': 'kept'}))
    blob = tmp_path / key_strategy(uri, MediaContext())
    killed_before_its_sidecar(blob)
    assert await listed(store) == {kept: 4}  # a listing (a dry run's) writes nothing
    assert disk.sidecar(blob).exists()
    await store.prepare_collection()
    assert files(tmp_path) == sorted([key := key_strategy(kept, MediaContext()), key + disk.SIDECAR_SUFFIX])
    await store.put(b'deleted')
    assert await store.get_metadata(uri) == {} and await store.get_metadata(kept) == {'k': 'kept'}


async def test_a_sidecar_whose_blob_a_delete_holds_aside_or_a_put_brings_back_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete with a cutoff may put its blob back, and a put may write it meanwhile: the sidecar
    is for that blob then. Files that are no sidecar of a blob of the store are left alone."""
    store = DiskMediaStore(tmp_path)
    aside = await store.put(b'held aside', context=MediaContext(metadata={'k': 'aside'}))
    doomed = killed_deleting(tmp_path / f'{digest(aside)}.bin')  # fresh: a running delete's
    (tmp_path / f'notes{disk.SIDECAR_SUFFIX}').write_bytes(b'{}')
    await store.prepare_collection()
    os.rename(doomed, tmp_path / f'{digest(aside)}.bin')  # the delete found it put since
    assert await store.get_metadata(aside) == {'k': 'aside'}
    assert (tmp_path / f'notes{disk.SIDECAR_SUFFIX}').exists()

    racing = await store.put(b'put again', context=MediaContext(metadata={'k': 'racing'}))
    blob = tmp_path / f'{digest(racing)}.bin'
    killed_before_its_sidecar(blob)
    fresh_name = _disk_files.temp_name

    def a_put_lands(kind: str) -> str:  # right after the collection found the blob absent
        blob.write_bytes(b'put again')
        return fresh_name(kind)

    monkeypatch.setattr(_disk_files, 'temp_name', a_put_lands)
    await store.prepare_collection()
    assert await store.get_metadata(racing) == {'k': 'racing'}
    assert files(tmp_path) == sorted(
        [f'{digest(uri)}.bin{suffix}' for uri in (aside, racing) for suffix in ('', disk.SIDECAR_SUFFIX)]
        + [f'notes{disk.SIDECAR_SUFFIX}']
    )
