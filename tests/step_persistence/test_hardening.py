"""What a hostile or careless user can do to a store: damaged counts, planted links, other writers,
world-readable files, memory that grows with finished runs, and errors that must be clear."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import stat
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps._errors import shortened
from pydantic_ai_steps.media import DiskMediaStore, SqliteMediaStore
from pydantic_ai_steps.step_persistence import (
    FileStepStore,
    InMemoryStepStore,
    InvalidRecordError,
    RunRecord,
    SqliteStepStore,
    StepEvent,
    ToolEffectRecord,
)
from pydantic_ai_steps.testing.step_store import T0, dump

from .agents import call, scripted
from .builders import history, snap

pytestmark = pytest.mark.anyio


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- 5. a damaged snapshot count -----------------------------------------------------------------


@pytest.mark.parametrize('kind', ['file', 'sqlite'])
async def test_a_huge_message_count_skips_the_snapshot_without_allocating(kind: str, tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'f') if kind == 'file' else SqliteStepStore(database=tmp_path / 's.db')
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    await store.save_snapshot(snap('r', history(2), 2))
    await store.aclose()
    if kind == 'file':
        path = tmp_path / 'f' / 'r' / 'snapshots' / '2.json'
        body = json.loads(path.read_text())
        body['messages']['message_count'] = 10**12
        path.write_text(json.dumps(body))
    else:
        with sqlite3.connect(tmp_path / 's.db') as connection:
            connection.execute('UPDATE snapshots SET message_count = ? WHERE step_index = 2', (10**12,))
    reader = FileStepStore(tmp_path / 'f') if kind == 'file' else SqliteStepStore(database=tmp_path / 's.db')
    latest = await reader.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(history(1))
    assert [s.step_index for s in await reader.list_snapshots(run_id='r')] == [1]
    await reader.aclose()


# --- 7. runs another writer put in a File store ---------------------------------------------------


async def test_a_run_folder_copied_in_is_listed(tmp_path: Path) -> None:
    here, elsewhere = FileStepStore(tmp_path / 'here'), FileStepStore(tmp_path / 'elsewhere')
    await here.register_run(RunRecord(run_id='local', conversation_id='c', started_at=T0))
    assert [r.run_id for r in await here.list_runs(conversation_id='c')] == ['local']  # the index exists now
    await elsewhere.register_run(RunRecord(run_id='shipped', conversation_id='c', started_at=T0))
    await elsewhere.save_snapshot(snap('shipped', history(2), 2))
    shutil.copytree(tmp_path / 'elsewhere' / 'shipped', tmp_path / 'here' / 'shipped')  # the documented way
    for reader in (here, FileStepStore(tmp_path / 'here')):
        assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['local', 'shipped']
    latest = await here.latest_snapshot(run_id='shipped')
    assert latest is not None and dump(latest.messages) == dump(history(2))
    # The next writer records the adopted run in the index, so every reader finds it there.
    await here.register_run(RunRecord(run_id='later', conversation_id='c', started_at=T0))
    lines = (tmp_path / 'here' / '_index' / 'runs.jsonl').read_text()
    assert '"run_id":"shipped"' in lines


async def test_a_run_folder_copied_back_after_its_deletion_is_listed(tmp_path: Path) -> None:
    root = tmp_path / 'store'
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r', conversation_id='c', started_at=T0))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    shutil.copytree(root / 'r', tmp_path / 'backup')
    assert await store.delete_run('r') == ['r']
    assert await store.list_runs(conversation_id='c') == []
    shutil.copytree(tmp_path / 'backup', root / 'r')
    for reader in (store, FileStepStore(root)):
        assert [run.run_id for run in await reader.list_runs(conversation_id='c')] == ['r']
        assert await reader.get_run(run_id='r') is not None
    await store.register_run(RunRecord(run_id='later', conversation_id='c', started_at=T0))
    assert [run.run_id for run in await FileStepStore(root).list_runs(conversation_id='c')] == ['r', 'later']
    assert await FileStepStore(root).delete_run('r') == ['r']  # and it can be deleted again
    for reader in (store, FileStepStore(root)):
        assert [run.run_id for run in await reader.list_runs(conversation_id='c')] == ['later']


# --- 9. links planted in a File store --------------------------------------------------------------


async def test_planted_links_are_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / 'store', tmp_path / 'outside'
    outside.mkdir()
    target = outside / 'victim.txt'
    target.write_text('precious\n')
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    # A link in place of the run's event log.
    (root / 'r' / 'events.jsonl').unlink()
    (root / 'r' / 'events.jsonl').symlink_to(target)
    with pytest.raises(PermissionError, match='symbolic link'):
        await FileStepStore(root).append_event(StepEvent(run_id='r', kind='run_completed', step_index=1))
    # A link in place of the index.
    (root / '_index' / 'runs.jsonl').unlink()
    (root / '_index' / 'runs.jsonl').symlink_to(target)
    with pytest.raises(PermissionError, match='symbolic link'):
        await FileStepStore(root).register_run(RunRecord(run_id='other'))
    assert [run.run_id for run in await FileStepStore(root).list_runs()] == ['r']  # scanned instead
    # A link in place of a run folder.
    (outside / 'fake-run').mkdir()
    (root / 'linked').symlink_to(outside / 'fake-run')
    with pytest.raises(PermissionError, match='symbolic link'):
        await FileStepStore(root).register_run(RunRecord(run_id='linked'))
    assert target.read_text() == 'precious\n'
    assert os.listdir(outside / 'fake-run') == []


async def test_entries_of_another_user_are_refused(
    tmp_path: Path, give_away: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / 'store'
    store = FileStepStore(root)
    for run_id in ('r', 'theirs'):
        await store.register_run(RunRecord(run_id=run_id))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
    give_away(root / 'r' / 'events.jsonl')
    give_away(root / 'theirs')
    for writer in (store, FileStepStore(root)):  # a run this process has open, and one it opens now
        with pytest.raises(PermissionError, match=r'events\.jsonl belongs to another user'):
            await writer.append_event(StepEvent(run_id='r', kind='run_completed', step_index=1))
    with pytest.raises(PermissionError, match=r'run folder .*theirs belongs to another user'):
        await FileStepStore(root).append_event(StepEvent(run_id='theirs', kind='run_completed', step_index=1))
    reader = FileStepStore(root)
    assert await reader.list_events(run_id='r') == []  # read as empty, with a warning
    assert 'belongs to another user' in caplog.text
    assert [run.run_id for run in await reader.list_runs()] == ['r']  # the other user's folder is skipped


async def test_a_linked_run_folder_is_read_by_no_reader(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, elsewhere = tmp_path / 'store', tmp_path / 'elsewhere'
    other = FileStepStore(elsewhere)
    await other.register_run(RunRecord(run_id='r', conversation_id='c'))
    await other.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    await other.save_snapshot(snap('r', history(2), 2))
    await FileStepStore(root).register_run(RunRecord(run_id='mine', conversation_id='c'))
    (root / 'r').symlink_to(elsewhere / 'r', target_is_directory=True)
    reader = FileStepStore(root)
    assert [run.run_id for run in await reader.list_runs(conversation_id='c')] == ['mine']
    assert await reader.get_run(run_id='r') is None
    assert await reader.list_events(run_id='r') == []
    assert await reader.latest_snapshot(run_id='r') is None
    assert await reader.list_snapshots(run_id='r') == []
    assert 'is a symbolic link' in caplog.text
    # The same for a folder that the index names, replaced by a link after it was listed.
    assert [run.run_id for run in await reader.list_runs()] == ['mine']
    shutil.rmtree(root / 'mine')
    (root / 'mine').symlink_to(elsewhere / 'r', target_is_directory=True)
    assert await FileStepStore(root).list_runs() == []
    assert await FileStepStore(root).get_run(run_id='mine') is None


async def test_a_linked_index_folder_is_never_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, outside = tmp_path / 'store', tmp_path / 'outside'
    outside.mkdir()
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r'))
    shutil.rmtree(root / '_index')
    (root / '_index').symlink_to(outside, target_is_directory=True)
    for writer in (store, FileStepStore(root)):
        with pytest.raises(PermissionError, match=r'index folder .*_index is a symbolic link'):
            await writer.register_run(RunRecord(run_id='other'))
    assert os.listdir(outside) == []
    for reader in (store, FileStepStore(root)):  # readers scan the run folders instead, with a warning
        assert [run.run_id for run in await reader.list_runs()] == ['r']
    assert 'ignoring the run index' in caplog.text


@pytest.mark.parametrize('entry', ['_index', '_index/runs.jsonl'])
async def test_an_index_of_another_user_is_refused(
    tmp_path: Path, entry: str, give_away: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / 'store'
    await FileStepStore(root).register_run(RunRecord(run_id='r'))
    give_away(root / entry)
    with pytest.raises(PermissionError, match='belongs to another user'):
        await FileStepStore(root).register_run(RunRecord(run_id='other'))
    assert [run.run_id for run in await FileStepStore(root).list_runs()] == ['r']
    assert 'ignoring the run index' in caplog.text


async def test_a_linked_media_folder_is_never_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, outside = tmp_path / 'store', tmp_path / 'outside'
    outside.mkdir()
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r'))

    def with_image(seed: bytes) -> list[ModelMessage]:
        image = BinaryContent(seed * 20_000, media_type='image/png')
        return [ModelRequest(parts=[UserPromptPart(['x', image], timestamp=T0)])]

    await store.save_snapshot(snap('r', with_image(b'\x89PNG')))
    shutil.move(root / 'media', outside / 'media')
    (root / 'media').symlink_to(outside / 'media', target_is_directory=True)
    before = sorted(os.listdir(outside / 'media'))
    for writer in (store, FileStepStore(root)):
        with pytest.raises(PermissionError, match=r'media folder .*media is a symbolic link'):
            await writer.save_snapshot(snap('r', with_image(b'GIF8'), 2))
    assert await FileStepStore(root).latest_snapshot(run_id='r') is None  # skipped with a warning
    assert 'symbolic link' in caplog.text
    await store.delete_run('r')
    await store.collect_garbage(
        grace=timedelta(0), writers_stopped=True
    )  # lists no blob through the link, so deletes none
    assert sorted(os.listdir(outside / 'media')) == before


async def test_a_linked_trash_folder_is_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / 'store', tmp_path / 'outside'
    outside.mkdir()
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r'))
    (root / '_index' / 'trash').symlink_to(outside, target_is_directory=True)
    with pytest.raises(PermissionError, match=r'trash folder .*trash is a symbolic link'):
        await store.delete_run('r')
    assert os.listdir(outside) == []
    assert [run.run_id for run in await FileStepStore(root).list_runs()] == ['r']  # nothing was moved


async def test_a_deletion_cut_short_is_finished_by_the_next_one(tmp_path: Path) -> None:
    root = tmp_path / 'store'
    store = FileStepStore(root)
    for run_id in ('a', 'b'):
        await store.register_run(RunRecord(run_id=run_id))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
    (root / '_index' / 'trash').mkdir()
    os.rename(root / 'a', root / '_index' / 'trash' / 'cut-short')  # the process died in the rmtree
    (root / '_index' / 'trash' / 'cut-short' / 'events.jsonl').unlink()
    assert [run.run_id for run in await FileStepStore(root).list_runs()] == ['b']
    assert await FileStepStore(root).delete_run('b') == ['b']
    assert os.listdir(root / '_index' / 'trash') == []
    assert await FileStepStore(root).list_runs() == []


# --- 10. owner-only files ------------------------------------------------------------------------------


async def test_files_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        files = FileStepStore(tmp_path / 'files')
        await files.register_run(RunRecord(run_id='r'))
        await files.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
        await files.record_tool_effect(ToolEffectRecord(tool_call_id='c', tool_name='t', run_id='r', status='started'))
        image = BinaryContent(b'\x89PNG' * 20_000, media_type='image/png')
        await files.save_snapshot(snap('r', [ModelRequest(parts=[UserPromptPart(['x', image], timestamp=T0)])]))
        sqlite_store = SqliteStepStore(database=tmp_path / 'db' / 'steps.db')
        await sqlite_store.register_run(RunRecord(run_id='r'))
        await sqlite_store.aclose()
    finally:
        os.umask(old)
    for path in (tmp_path / 'files').rglob('*'):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
    assert mode(tmp_path / 'files') == 0o700
    assert mode(tmp_path / 'db') == 0o700
    for path in (tmp_path / 'db').iterdir():
        assert mode(path) == 0o600, path


# --- 12. memory that finished runs hold ------------------------------------------------------------


async def test_finished_runs_release_their_histories(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 's.db')
    agent = Agent(
        scripted([call('look', 'c1')], 'seen'),
        capabilities=[StepPersistence(store=store, agent_name='viewer')],
    )

    @agent.tool_plain
    def look() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'a picture'

    for index in range(20):
        image = BinaryContent(bytes([index]) * (1 << 20), media_type='image/png')
        await agent.run(['what is this?', image])
    tracker = store._log.tracker  # pyright: ignore[reportPrivateUsage]
    assert len(tracker) == 0 and tracker.weight == 0  # nothing of a closed run stays in memory
    await store.aclose()


def test_the_history_tracker_is_bounded_by_bytes() -> None:
    from pydantic_ai_steps.store.history import HistoryTracker

    tracker: HistoryTracker[bytes] = HistoryTracker(max_bytes=3 << 20)
    for index in range(10):
        messages = [ModelRequest(parts=[UserPromptPart(f'run {index}')])]
        delta = tracker.delta(f'run-{index}', messages)
        tracker.commit(delta, {0: b'digest'}, 1, weights={0: 1 << 20})
    assert len(tracker) == 3 and tracker.weight == 3 << 20


# --- 13. errors that say what is wrong ---------------------------------------------------------------


async def test_an_events_file_that_is_a_directory_does_not_break_the_store(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='odd', conversation_id='c'))
    await store.register_run(RunRecord(run_id='fine', conversation_id='c'))
    (tmp_path / 'odd' / 'events.jsonl').mkdir()
    assert await FileStepStore(tmp_path).list_events(run_id='odd') == []
    assert [r.run_id for r in await FileStepStore(tmp_path).list_runs(conversation_id='c')] == ['odd', 'fine']


async def test_record_files_that_are_fifos_read_as_missing_without_waiting(
    tmp_path: Path, plant_fifo: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    """Opening a FIFO for reading waits for a writer: a FIFO is refused as a folder is, at once."""
    store = FileStepStore(tmp_path)
    for run_id in ('odd', 'fine'):
        await store.register_run(RunRecord(run_id=run_id, conversation_id='c'))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
    await store.save_snapshot(snap('odd', history(1), 1))
    for name in ('run.json', 'events.jsonl', 'snapshots/1.json', 'messages.jsonl'):
        (tmp_path / 'odd' / name).unlink()
        plant_fifo(tmp_path / 'odd' / name)
    (tmp_path / '_index' / 'runs.jsonl').unlink()
    plant_fifo(tmp_path / '_index' / 'runs.jsonl')
    reader = FileStepStore(tmp_path)
    assert await reader.list_events(run_id='odd') == []
    assert await reader.latest_snapshot(run_id='odd') is None
    assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['fine']
    with pytest.raises(PermissionError, match=r'events\.jsonl is not a regular file'):
        await reader.append_event(StepEvent(run_id='odd', kind='run_completed', step_index=1))
    assert 'is not a regular file' in caplog.text


async def test_a_sqlite_database_without_some_tables_reads_empty_and_migrates_on_write(tmp_path: Path) -> None:
    database = tmp_path / 'partial.db'
    with sqlite3.connect(database) as connection:
        connection.execute(
            'CREATE TABLE runs (run_id TEXT PRIMARY KEY, metadata TEXT NOT NULL, started_at TEXT NOT NULL)'
        )
        connection.execute("INSERT INTO runs VALUES ('r', '{}', ?)", (T0.isoformat(),))
    store = SqliteStepStore(database=database)
    assert await store.latest_snapshot(run_id='r') is None  # no snapshots table: no snapshot, no raw error
    assert await store.list_events(run_id='r') == []
    await store.save_snapshot(snap('r', history(1)))
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and dump(latest.messages) == dump(history(1))
    await store.aclose()


def test_flags_must_be_real_booleans(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durable must be True or False, got 'yes'"):
        SqliteStepStore(database=tmp_path / 's.db', durable='yes')  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match='durable must be True or False'):
        FileStepStore(tmp_path, durable=1)  # pyright: ignore[reportArgumentType]


async def test_a_tool_returning_a_file_name_that_is_not_utf8_fails_the_run_with_a_clear_error(tmp_path: Path) -> None:
    """`os.listdir()` decodes such a name with `surrogateescape`; the run stops with an error saying
    so (not the serializer's), and the store holds the run as failed, with what it could save."""
    store = SqliteStepStore(database=tmp_path / 's.db')
    agent = Agent(scripted([call('listing', 'c1')], 'done'), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def listing() -> list[str]:  # pyright: ignore[reportUnusedFunction]
        return [os.fsdecode(b'report-\xff.txt')]

    with pytest.raises(InvalidRecordError, match='holds text that is not valid Unicode') as refused:
        await agent.run('what is here?')
    assert "errors='replace'" in str(refused.value)
    [run] = await store.list_runs()
    assert run.status == 'failed'
    failed = [event for event in await store.list_events(run_id=run.run_id) if event.kind == 'run_failed']
    assert len(failed) == 1 and 'not valid Unicode' in (failed[0].error or '')
    interrupted = await store.latest_snapshot(run_id=run.run_id, include_interrupted=True)
    assert interrupted is not None and interrupted.state == 'interrupted' and len(interrupted.messages) == 2
    await store.aclose()


@pytest.mark.parametrize(
    ('make', 'said'),
    [
        (lambda: SqliteStepStore(database=''), 'SqliteStepStore database is an empty path; pass a file name'),
        (lambda: SqliteMediaStore(database=''), 'SqliteMediaStore database is an empty path'),
        (lambda: FileStepStore(''), "FileStepStore directory is an empty path; pass '.' for the current directory"),
        (lambda: DiskMediaStore(''), 'DiskMediaStore directory is an empty path'),
        (
            lambda: FileStepStore('file:///var/lib/steps'),
            "FileStepStore directory 'file:///var/lib/steps' is a URL, not a path; open store URLs with",
        ),
        (lambda: SqliteStepStore(database=b'steps.db'), 'must be a path \\(str or os.PathLike\\), got bytes'),  # pyright: ignore[reportArgumentType]
        (lambda: FileStepStore(5), 'must be a path \\(str or os.PathLike\\), got int'),  # pyright: ignore[reportArgumentType]
    ],
)
def test_a_path_that_names_no_place_is_refused_before_anything_is_written(
    make: Callable[[], object], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`''` would be SQLite's temporary database (gone on close) or the current directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=said):
        make()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('media_store', ['disk', 5, object(), 's3://AKIAEXAMPLE:s3cr3t@minio:9000/bucket'])
def test_a_media_store_that_is_not_one_is_refused_at_construction(media_store: object, tmp_path: Path) -> None:
    """Not at the first large payload, after the run was registered."""
    for make in (
        lambda: SqliteStepStore(database=tmp_path / 's.db', media_store=media_store),  # pyright: ignore[reportArgumentType]
        lambda: FileStepStore(tmp_path / 'f', media_store=media_store),  # pyright: ignore[reportArgumentType]
    ):
        with pytest.raises(TypeError, match=r'media_store must be a media store \(an object with async put') as refused:
            make()
        assert f'got {type(media_store).__name__}' in str(refused.value) and 's3cr3t' not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


async def test_a_collection_that_fails_partway_leaves_no_writer_trusting_what_it_deleted(tmp_path: Path) -> None:
    """A writer of this process does not put again bytes it put lately; a garbage collection here
    withdraws that trust for every blob it deleted, also when a delete fails partway (the one that
    failed may have removed its blob first), so the next save puts them again and reads back."""

    class FailingOnTheSecondDelete(DiskMediaStore):
        deletes = 0

        async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
            deleted = await super().delete(uri, stored_before=stored_before)
            FailingOnTheSecondDelete.deletes += 1
            if FailingOnTheSecondDelete.deletes == 2:
                raise OSError('the disk went away after the unlink')
            return deleted

    store = SqliteStepStore(database=tmp_path / 'steps.db', media_store=FailingOnTheSecondDelete(tmp_path / 'media'))

    def with_images() -> list[ModelMessage]:
        images = [BinaryContent(seed * 20_000, media_type='image/png') for seed in (b'\x89PNG', b'GIF8')]
        return [ModelRequest(parts=[UserPromptPart(['x', *images], timestamp=T0)])]

    await store.register_run(RunRecord(run_id='old'))
    await store.save_snapshot(snap('old', with_images()))
    await store.delete_run('old')
    with pytest.raises(OSError, match='went away'):
        await store.collect_garbage(grace=timedelta(0), writers_stopped=True)
    assert FailingOnTheSecondDelete.deletes == 2 and list((tmp_path / 'media').rglob('*.bin')) == []
    await store.register_run(RunRecord(run_id='new'))
    await store.save_snapshot(snap('new', with_images()))
    loaded = await store.latest_snapshot(run_id='new')
    assert loaded is not None and dump(loaded.messages) == dump(with_images())


async def test_a_referenced_image_a_killed_collection_left_aside_is_put_back(
    tmp_path: Path, an_hour_later: Callable[[], None]
) -> None:
    """A collection killed between renaming a blob aside and deciding about it left the only copy
    under a temporary name: a collection an hour later puts it back, and the snapshot reads."""
    store = FileStepStore(tmp_path)
    image = [ModelRequest(parts=[UserPromptPart(['look', BinaryContent(b'\x89PNG' * 20_000, media_type='image/png')])])]
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', image))
    (blob,) = (tmp_path / 'media').glob('*.bin')
    os.rename(blob, blob.with_name(f'gc-{uuid.uuid4().hex}.tmp'))
    an_hour_later()
    planned = await store.collect_garbage(grace=timedelta(0), writers_stopped=True, dry_run=True)
    assert planned.blobs == [] and not blob.exists()  # a dry run only looks
    assert (await store.collect_garbage(grace=timedelta(0), writers_stopped=True)).blobs == []
    loaded = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert loaded is not None and dump(loaded.messages) == dump(image)
    assert [path.name for path in (tmp_path / 'media').iterdir()] == [blob.name]


async def test_garbage_collection_started_before_the_first_writer_keeps_what_it_references(tmp_path: Path) -> None:
    """A maintenance store opened on a database no process has created tables in yet, then a worker
    writes a run with an image: the collection keeps the image the run's snapshot references."""
    database = tmp_path / 'steps.db'
    maintenance = SqliteStepStore(database=database)
    assert await maintenance.list_runs() == []
    worker = SqliteStepStore(database=database)
    image = [ModelRequest(parts=[UserPromptPart(['look', BinaryContent(b'\x89PNG' * 20_000, media_type='image/png')])])]
    await worker.register_run(RunRecord(run_id='r1'))
    await worker.save_snapshot(snap('r1', image))
    await worker.aclose()
    result = await maintenance.collect_garbage(grace=timedelta(0), writers_stopped=True)
    assert (result.blobs, result.kept_referenced) == ([], 1)
    loaded = await maintenance.latest_snapshot(run_id='r1')
    assert loaded is not None and dump(loaded.messages) == dump(image)
    await maintenance.aclose()


async def test_stored_json_nested_too_deeply_to_parse_is_skipped_as_damage(tmp_path: Path) -> None:
    """One record edited into deeply nested JSON is skipped with a warning; it breaks no listing."""
    database = tmp_path / 'steps.db'
    store = SqliteStepStore(database=database)
    for run_id in ('a', 'b'):
        await store.register_run(RunRecord(run_id=run_id))
        await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
    await store.aclose()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE runs SET metadata = ? WHERE run_id = 'a'", ('[' * 100_000,))
        conn.execute("UPDATE events SET metadata = ? WHERE run_id = 'b'", ('{"k":' * 100_000,))
    reread = SqliteStepStore(database=database)
    assert [run.run_id for run in await reread.list_runs()] == ['b']
    assert await reread.list_events(run_id='b') == []
    assert await reread.list_unreadable_runs() == ["run 'a': run record metadata is nested too deeply to read"]
    await reread.aclose()

    files = FileStepStore(tmp_path / 'runs')
    for run_id in ('a', 'b'):
        await files.register_run(RunRecord(run_id=run_id))
        await files.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
    await files.aclose()
    with (tmp_path / 'runs' / 'a' / 'events.jsonl').open('a') as log:
        log.write('[' * 100_000 + '\n')
    reread_files = FileStepStore(tmp_path / 'runs')
    assert [run.run_id for run in await reread_files.list_runs()] == ['a', 'b']
    assert [event.kind for event in await reread_files.list_events(run_id='a')] == ['run_started']


async def test_a_message_row_edited_to_other_types_makes_its_snapshots_damaged_not_a_crash(tmp_path: Path) -> None:
    database = tmp_path / 'steps.db'
    first, second = history(1)[:1], history(1)
    for edit in ('position = 1.5', "message = x'ff'", "position = 'x'"):
        database.unlink(missing_ok=True)
        store = SqliteStepStore(database=database)
        await store.register_run(RunRecord(run_id='a'))
        await store.save_snapshot(snap('a', first, step=0))
        await store.save_snapshot(snap('a', second, step=1))
        await store.aclose()
        with sqlite3.connect(database) as conn:
            conn.execute(f'UPDATE messages SET {edit} WHERE log_index = 1')
        reread = SqliteStepStore(database=database)
        latest = await reread.latest_snapshot(run_id='a')
        assert latest is not None and latest.step_index == 0 and dump(latest.messages) == dump(first), edit
        await reread.aclose()


async def test_file_store_lines_edited_to_other_types_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / 'runs'
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='good'))
    await store.register_run(RunRecord(run_id='child', parent_run_id='good'))
    await store.append_event(StepEvent(run_id='child', kind='run_started', step_index=0))
    await store.aclose()
    events = root / 'child' / 'events.jsonl'
    edited = {**json.loads(events.read_text()), 'kind': []}
    events.write_text(json.dumps(edited) + '\n')
    assert [run.run_id for run in await FileStepStore(root).list_runs()] == ['good', 'child']
    index = root / '_index' / 'runs.jsonl'
    lines = index.read_text().splitlines()
    lines[-1] = json.dumps({**json.loads(lines[-1]), 'parent_run_id': ['good']})
    index.write_text('\n'.join(lines) + '\n')
    events.unlink()
    assert await FileStepStore(root).list_runs(parent_run_id='good') == []


@pytest.mark.parametrize('kind', ['sqlite', 'file'])
async def test_a_damaged_record_holding_a_huge_value_is_named_in_a_short_warning(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning quotes the bad value's start and end and its length, not all of it."""
    huge = 'x' * 100_000
    store = FileStepStore(tmp_path / 'f') if kind == 'file' else SqliteStepStore(database=tmp_path / 's.db')
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=T0))
    effect = ToolEffectRecord(tool_call_id='c', tool_name='t', run_id='r', status='started', started_at=T0)
    await store.record_tool_effect(effect)
    await store.save_snapshot(snap('r', history(1), 1))
    await store.aclose()
    if kind == 'file':
        for name, field in (
            ('events.jsonl', 'kind'),
            ('tool_effects.jsonl', 'started_at'),
            ('snapshots/1.json', 'state'),
        ):
            path = tmp_path / 'f' / 'r' / name
            path.write_text(json.dumps({**json.loads(path.read_text()), field: huge}) + '\n')
    else:
        with sqlite3.connect(tmp_path / 's.db') as connection:
            for table, field in (('events', 'kind'), ('tool_effects', 'started_at'), ('snapshots', 'state')):
                connection.execute(f'UPDATE {table} SET {field} = ?', (huge,))
    reader = FileStepStore(tmp_path / 'f') if kind == 'file' else SqliteStepStore(database=tmp_path / 's.db')
    with caplog.at_level(logging.WARNING, logger='pydantic_ai_steps'):
        assert await reader.list_events(run_id='r') == []
        assert await reader.list_tool_effects(run_id='r') == []
        assert await reader.list_snapshots(run_id='r', include_interrupted=True) == []
    await reader.aclose()
    warnings = [record.getMessage() for record in caplog.records]
    assert [message.split(':')[0] for message in warnings] == [
        "skipping unreadable event of run 'r'",
        "skipping unreadable tool effect of run 'r'",
        "skipping unreadable snapshot 1 of run 'r'",
    ]
    for message, field in zip(warnings, ('kind', 'started_at', 'state'), strict=True):
        assert len(message) < 1000 and '(100000 characters)' in message, message[:300]
        assert field in message, message


def test_a_quoted_value_is_shortened_whatever_its_type() -> None:
    assert (shortened('ok'), shortened(12), shortened(b'ok')) == ("'ok'", '12', "b'ok'")
    assert shortened('x' * 1000) == f'{"x" * 100!r}…{"x" * 50!r} (1000 characters)'
    assert shortened(b'\x00' * 1000).endswith("\\x00' (1000 bytes)")
    listed = shortened(['y' * 1000])
    assert listed.startswith("['yyy") and listed.endswith("yyy'] (list of 1004 characters)") and len(listed) < 200


async def test_a_refused_write_quotes_a_huge_bad_value_shortened() -> None:
    """The refusal of bad input names the field and shows the value, not all of it: a 100 KB value
    is not echoed whole into a log or a traceback."""
    store = InMemoryStepStore()
    huge = 'x' * 100_000
    await store.register_run(RunRecord(run_id='r'))
    refusals: list[str] = []
    for write in (
        lambda: store.register_run(RunRecord(run_id='s', conversation_id=huge.encode())),  # pyright: ignore[reportArgumentType]
        lambda: store.register_run(RunRecord(run_id='t', metadata={'k': [huge]})),  # pyright: ignore[reportArgumentType]
        lambda: store.register_run(RunRecord(run_id=huge)),
        lambda: store.append_event(StepEvent(run_id='r', kind=huge, step_index=0)),  # pyright: ignore[reportArgumentType]
        lambda: store.append_event(StepEvent(run_id='r', kind='run_started', step_index=huge)),  # pyright: ignore[reportArgumentType]
        lambda: store.list_runs(started_after=huge),  # pyright: ignore[reportArgumentType]
        lambda: store.list_runs(status=huge),  # pyright: ignore[reportArgumentType]
    ):
        with pytest.raises(ValueError) as refused:
            await write()
        refusals.append(str(refused.value))
    assert all(len(message) < 1000 for message in refusals), [message[:1000] for message in refusals]
    assert await store.list_runs() == [await store.get_run(run_id='r')]


@pytest.mark.parametrize('kind', ['memory', 'file', 'sqlite'])
async def test_a_message_pydantic_ai_could_not_read_back_is_refused_not_stored(tmp_path: Path, kind: str) -> None:
    """pydantic serializes what its JSON reader then refuses (past 200 levels of nesting, an integer
    past 4300 digits): stored, that snapshot and every later one of the run would be skipped."""
    store = {
        'memory': InMemoryStepStore,
        'file': lambda: FileStepStore(tmp_path / 'runs'),
        'sqlite': lambda: SqliteStepStore(database=tmp_path / 'steps.db'),
    }[kind]()
    await store.register_run(RunRecord(run_id='r'))
    settled = history(1)
    await store.save_snapshot(snap('r', settled, step=1))
    nested: object = 1
    for _ in range(198):
        nested = [nested]
    for content, reason in ((10**5000, 'number out of range'), (nested, 'recursion limit exceeded')):
        returned = ModelRequest(parts=[ToolReturnPart('t', content, tool_call_id='c9', timestamp=T0)])
        with pytest.raises(InvalidRecordError, match=rf'message 3 of run .r. cannot be stored: .*{reason}'):
            await store.save_snapshot(snap('r', [*settled, returned], step=2))
    shallow: object = [[[10**4000]]]
    kept = [*settled, ModelRequest(parts=[ToolReturnPart('t', shallow, tool_call_id='c9', timestamp=T0)])]
    await store.save_snapshot(snap('r', kept, step=3))
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 3 and dump(latest.messages) == dump(kept)
