"""`FileStepStore` beyond the shared contract: layout, damage, index, legacy data, validation."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from pydantic_ai_steps.step_persistence import (
    FileStepStore,
    InvalidRunIdError,
    RunAlreadyExistsError,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
)
from pydantic_ai_steps.testing.step_store import T0, dump

from .builders import history, snap

pytestmark = pytest.mark.anyio


def append_bytes(path: Path, data: bytes) -> None:
    """What another writer (or a torn write) adds to a file behind the store's back."""
    with open(path, 'ab') as handle:
        handle.write(data)


# --- layout ------------------------------------------------------------------------------------


async def test_layout_and_message_once_storage(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r1', conversation_id='conv', started_at=T0))
    await store.append_event(StepEvent(run_id='r1', kind='run_started', step_index=0, timestamp=T0))
    await store.record_tool_effect(ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id='r1', status='started'))
    for cycles in range(1, 6):
        await store.save_snapshot(snap('r1', history(cycles), cycles, idempotency_key=f'{cycles}:{cycles}:complete'))
    run_dir = tmp_path / 'r1'
    names = {path.name for path in run_dir.iterdir()}
    assert {'run.json', 'events.jsonl', 'tool_effects.jsonl', 'messages.jsonl', 'snapshot-keys.jsonl'} <= names
    assert sorted(path.name for path in (run_dir / 'snapshots').iterdir()) == [f'{seq}.json' for seq in range(1, 6)]
    assert (tmp_path / '_index' / 'runs.jsonl').exists()
    # Each message is in the log once: 15 messages over five growing snapshots.
    log = [json.loads(line) for line in (run_dir / 'messages.jsonl').read_text().splitlines()]
    assert [entry['i'] for entry in log] == list(range(15))
    assert [entry['p'] for entry in log] == list(range(15))
    newest = json.loads((run_dir / 'snapshots' / '5.json').read_text())
    assert newest['messages'] == {'message_count': 15, 'log_size': 15}
    assert newest['state'] == 'complete' and newest['idempotency_key'] == '5:5:complete'
    ledger = [json.loads(line) for line in (run_dir / 'snapshot-keys.jsonl').read_text().splitlines()]
    assert [entry['seq'] for entry in ledger] == [1, 2, 3, 4, 5]
    snapshots = await FileStepStore(tmp_path).list_snapshots(run_id='r1')
    assert [dump(s.messages) for s in snapshots] == [dump(history(cycles)) for cycles in range(1, 6)]


async def test_seq_continues_after_pruning_and_reopening(tmp_path: Path) -> None:
    await FileStepStore(tmp_path).register_run(RunRecord(run_id='r'))
    await FileStepStore(tmp_path, max_snapshots_per_run=1).save_snapshot(snap('r', history(1)))
    await FileStepStore(tmp_path, max_snapshots_per_run=1).save_snapshot(snap('r', history(2), 2))
    await FileStepStore(tmp_path, max_snapshots_per_run=1).save_snapshot(snap('r', history(3), 3))
    assert [path.name for path in (tmp_path / 'r' / 'snapshots').iterdir()] == ['3.json']
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 3 and dump(latest.messages) == dump(history(3))


async def test_run_ids_no_store_can_hold_are_refused_and_reads_never_raise(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store')
    for bad in ('', 'x' * 201, '.', '..', '_index', 'media', 'nul\x00', 'esc\x1b'):
        writes = [
            store.register_run(RunRecord(run_id=bad)),
            store.append_event(StepEvent(run_id=bad, kind='run_started', step_index=0)),
            store.save_snapshot(snap(bad, history(1))),
            store.record_tool_effect(ToolEffectRecord(tool_call_id='c', tool_name='t', run_id=bad, status='started')),
        ]
        for write in writes:
            with pytest.raises(InvalidRunIdError):
                await write
        assert await store.get_run(run_id=bad) is None
        assert await store.list_events(run_id=bad) == []
        assert await store.latest_snapshot(run_id=bad) is None
        assert await store.list_unresolved_tool_effects(run_id=bad) == []
    assert not (tmp_path / 'store').exists()


async def test_ids_that_are_not_file_names_stay_inside_the_store(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'store')
    for run_id in ('../escape', 'a/b', '/etc/passwd', 'job:123', 'sp ace', 'a..b', 'C:\\x'):
        await store.register_run(RunRecord(run_id=run_id, started_at=T0))
        await store.save_snapshot(snap(run_id, history(1)))
        assert (await store.get_run(run_id=run_id)) == RunRecord(run_id=run_id, started_at=T0)
        latest = await FileStepStore(tmp_path / 'store').latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history(1))
    assert sorted(os.listdir(tmp_path)) == ['store']
    folders = sorted(name for name in os.listdir(tmp_path / 'store') if name not in ('_index', 'media'))
    assert len(folders) == 7 and all(name.startswith('~') and len(name) == 65 for name in folders)
    assert len(await FileStepStore(tmp_path / 'store').list_runs()) == 7


HASHED = re.compile(r'~[0-9a-f]{64}')


async def test_windows_device_names_and_trailing_dots_get_folders_of_their_own(tmp_path: Path) -> None:
    """`CON` opens a device on Windows and `a.` names `a`'s folder there: neither is a folder name."""
    store = FileStepStore(tmp_path)
    awkward = ('CON', 'nul.txt', 'Com1', 'lpt9.log', 'aux', 'a.')
    plain = ('a', 'console', 'nully', 'com10', 'a.b', 'prn_1')
    for run_id in (*awkward, *plain):
        await store.register_run(RunRecord(run_id=run_id, started_at=T0))
        await store.save_snapshot(snap(run_id, history(1)))
    folders = {name for name in os.listdir(tmp_path) if name not in ('_index', 'media')}
    assert set(plain) <= folders
    hashed = folders - set(plain)
    assert len(hashed) == len(awkward) and all(HASHED.fullmatch(name) for name in hashed)
    reader = FileStepStore(tmp_path)
    for run_id in (*awkward, *plain):
        assert await reader.get_run(run_id=run_id) == RunRecord(run_id=run_id, started_at=T0)
        latest = await reader.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(history(1))
    assert sorted(run.run_id for run in await reader.list_runs()) == sorted((*awkward, *plain))


async def test_a_run_an_earlier_release_kept_under_a_device_name_stays_in_its_folder(tmp_path: Path) -> None:
    """Before device names were hashed, run `CON` lived in `CON/`: it reads, grows, lists and deletes there."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='CON', started_at=T0))
    await store.append_event(StepEvent(run_id='CON', kind='run_started', step_index=0, timestamp=T0))
    await store.save_snapshot(snap('CON', history(1)))
    (hashed,) = [name for name in os.listdir(tmp_path) if HASHED.fullmatch(name)]
    os.rename(tmp_path / hashed, tmp_path / 'CON')  # the layout an earlier release wrote
    reader = FileStepStore(tmp_path)
    assert await reader.get_run(run_id='CON') == RunRecord(run_id='CON', started_at=T0)
    assert [event.kind for event in await reader.list_events(run_id='CON')] == ['run_started']
    await reader.append_event(StepEvent(run_id='CON', kind='run_completed', step_index=1, timestamp=T0))
    await reader.save_snapshot(snap('CON', history(2), 2))
    assert not (tmp_path / hashed).exists()  # written where the run already was
    with pytest.raises(RunAlreadyExistsError):
        await reader.register_run(RunRecord(run_id='CON'))
    shutil.rmtree(tmp_path / '_index')  # the index is rebuilt from the folders
    rebuilt = FileStepStore(tmp_path)
    assert [run.run_id for run in await rebuilt.list_runs()] == ['CON']
    latest = await rebuilt.latest_snapshot(run_id='CON')
    assert latest is not None and dump(latest.messages) == dump(history(2))
    assert [event.kind for event in await rebuilt.list_events(run_id='CON')] == ['run_started', 'run_completed']
    assert await rebuilt.delete_run('CON') == ['CON']
    assert not (tmp_path / 'CON').exists() and await FileStepStore(tmp_path).list_runs() == []


async def test_a_folder_named_like_a_device_holding_another_run_is_not_taken_for_it(tmp_path: Path) -> None:
    """Only a folder whose `run.json` names the run is the earlier layout's: anything else stays out."""
    (tmp_path / 'nul').mkdir()
    (tmp_path / 'nul' / 'run.json').write_text(json.dumps({'run_id': 'other'}))
    store = FileStepStore(tmp_path)
    assert await store.get_run(run_id='nul') is None
    await store.register_run(RunRecord(run_id='nul', started_at=T0))
    assert await FileStepStore(tmp_path).get_run(run_id='nul') == RunRecord(run_id='nul', started_at=T0)
    assert json.loads((tmp_path / 'nul' / 'run.json').read_text()) == {'run_id': 'other'}


async def test_an_id_a_case_blind_file_system_folds_into_another_run_says_so(tmp_path: Path) -> None:
    """Where `run1` opens `Run1`'s folder (macOS, Windows), the refusal names the run it collided with."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='Run1', started_at=T0))
    os.rename(tmp_path / 'Run1', tmp_path / 'run1')  # what `run1` opens on such a file system
    with pytest.raises(RunAlreadyExistsError, match="its folder is the one of run 'Run1'"):
        await FileStepStore(tmp_path).register_run(RunRecord(run_id='run1'))
    assert json.loads((tmp_path / 'run1' / 'run.json').read_text())['run_id'] == 'Run1'  # left as it was
    await store.register_run(RunRecord(run_id='r2'))
    with pytest.raises(RunAlreadyExistsError, match='is already in the store'):  # a plain repeat
        await store.register_run(RunRecord(run_id='r2'))


# --- damaged data ------------------------------------------------------------------------------


async def test_torn_last_event_line_is_skipped_and_later_appends_survive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    first = StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=T0, idempotency_key='k0')
    await store.append_event(first)
    append_bytes(tmp_path / 'r' / 'events.jsonl', b'{"run_id": "r", "kind": "model_req')  # died inside a write
    with caplog.at_level(logging.WARNING):
        assert await FileStepStore(tmp_path).list_events(run_id='r') == [first]
    assert 'incomplete last line' in caplog.text
    later = StepEvent(run_id='r', kind='run_completed', step_index=1, timestamp=T0, idempotency_key='k1')
    await FileStepStore(tmp_path).append_event(later)
    await store.append_event(later)  # a replay, through the store that had cached the keys
    assert await FileStepStore(tmp_path).list_events(run_id='r') == [first, later]


async def test_torn_and_garbled_tool_effect_lines_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.record_tool_effect(ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id='r', status='started'))
    append_bytes(tmp_path / 'r' / 'tool_effects.jsonl', b'not json at all\n{"tool_call_id": "c2", "tool_na')
    reader = FileStepStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert [r.tool_call_id for r in await reader.list_unresolved_tool_effects(run_id='r')] == ['c1']
    await reader.record_tool_effect(ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id='r', status='completed'))
    await reader.record_tool_effect(ToolEffectRecord(tool_call_id='c3', tool_name='t', run_id='r', status='started'))
    for fresh in (FileStepStore(tmp_path), store):
        assert [r.tool_call_id for r in await fresh.list_unresolved_tool_effects(run_id='r')] == ['c3']
        done = await fresh.get_tool_effect(run_id='r', tool_call_id='c1')
        assert done is not None and done.status == 'completed'


async def test_garbage_newest_snapshot_file_falls_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    await store.save_snapshot(snap('r', history(2), 2))
    for garbage in (b'{"run_id": "r", "step_ind', b'\x00\x00\x00\x00', b'[1, 2]', b'{"step_index": "two"}'):
        (tmp_path / 'r' / 'snapshots' / '3.json').write_bytes(garbage)
        with caplog.at_level(logging.WARNING):
            latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r', include_interrupted=True)
        assert latest is not None and latest.step_index == 2 and dump(latest.messages) == dump(history(2))
        assert [s.step_index for s in await FileStepStore(tmp_path).list_snapshots(run_id='r')] == [1, 2]
        assert 'skipping unreadable' in caplog.text and '3.json' in caplog.text
    # The store keeps working: the next snapshot steps over the unreadable file's seq.
    await store.save_snapshot(snap('r', history(3), 3))
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 3


async def test_snapshot_whose_messages_never_reached_the_log_is_skipped(tmp_path: Path) -> None:
    """What power loss can leave: a snapshot file without the log lines it refers to."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    await store.save_snapshot(snap('r', history(2), 2))
    log = tmp_path / 'r' / 'messages.jsonl'
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b''.join(lines[:4]) + lines[4][:10])  # the second snapshot's tail is gone, one line torn
    reader = FileStepStore(tmp_path)
    latest = await reader.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(history(1))
    # Writing on: the torn index is never reused and the new history is whole.
    await reader.save_snapshot(snap('r', history(3), 3))
    await store.save_snapshot(snap('r', history(4), 4))  # its cached log view is stale: it must notice
    for fresh in (FileStepStore(tmp_path), reader, store):
        snapshots = await fresh.list_snapshots(run_id='r')
        assert [s.step_index for s in snapshots] == [1, 3, 4]
        assert [dump(s.messages) for s in snapshots] == [dump(history(n)) for n in (1, 3, 4)]


async def test_garbled_log_line_only_hides_snapshots_that_depend_on_it(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    base = history(1)
    await store.save_snapshot(snap('r', base, 1))
    await store.save_snapshot(snap('r', history(2), 2))
    log = tmp_path / 'r' / 'messages.jsonl'
    lines = log.read_bytes().splitlines(keepends=True)
    lines[4] = b'\x00' * (len(lines[4]) - 1) + b'\n'  # a zero-filled block in the middle of the log
    log.write_bytes(b''.join(lines))
    reader = FileStepStore(tmp_path)
    assert [s.step_index for s in await reader.list_snapshots(run_id='r')] == [1]
    # A writer that has never seen this run rewrites the history in full, which reads again.
    await reader.save_snapshot(snap('r', history(3), 3))
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 3 and dump(latest.messages) == dump(history(3))


async def test_unreadable_run_json_falls_back_to_the_index(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    record = RunRecord(run_id='r', conversation_id='conv', metadata={'k': 'v'}, started_at=T0)
    await store.register_run(record)
    (tmp_path / 'r' / 'run.json').write_text('{"run_id": ')
    assert await FileStepStore(tmp_path).get_run(run_id='r') == record
    assert await FileStepStore(tmp_path).list_runs(conversation_id='conv') == [record]


async def test_stray_temporary_files_are_ignored(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    (tmp_path / 'r' / 'snapshots' / '2.json.0123abcd.tmp').write_text('{"half": ')
    (tmp_path / 'r' / 'run.json.feed.tmp').write_text('{')
    latest = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 1
    record = await FileStepStore(tmp_path).get_run(run_id='r')
    assert record is not None and record.run_id == 'r'


# --- the lineage index -------------------------------------------------------------------------


async def register_many(store: FileStepStore, count: int) -> list[RunRecord]:
    records = [
        RunRecord(run_id=f'run-{index}', conversation_id=f'conv-{index % 3}', parent_run_id='p' if index % 2 else None)
        for index in range(count)
    ]
    for record in records:
        await store.register_run(record)
    return records


async def test_list_runs_reads_the_index_not_the_run_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai_steps.store.backends.file import _index

    store = FileStepStore(tmp_path)
    records = await register_many(store, 12)
    fresh = FileStepStore(tmp_path)

    def no_reading(path: object) -> object:
        raise AssertionError(f'list_runs read {path}')

    monkeypatch.setattr(_index, 'read_bytes', no_reading)
    found = await fresh.list_runs(conversation_id='conv-1', parent_run_id='p')
    assert found == [r for r in records if r.conversation_id == 'conv-1' and r.parent_run_id == 'p']
    assert [r.run_id for r in await fresh.list_runs()] == [r.run_id for r in records]
    # Runs registered by another store instance after the first read show up (tail refresh).
    await FileStepStore(tmp_path).register_run(RunRecord(run_id='late', conversation_id='conv-1', parent_run_id='p'))
    assert [r.run_id for r in await fresh.list_runs(conversation_id='conv-1', parent_run_id='p')][-1] == 'late'


async def test_missing_index_is_rebuilt_from_the_run_directories(tmp_path: Path) -> None:
    records = await register_many(FileStepStore(tmp_path), 6)
    (tmp_path / '_index' / 'runs.jsonl').unlink()
    assert await FileStepStore(tmp_path).list_runs(conversation_id='conv-0') == [
        r for r in records if r.conversation_id == 'conv-0'
    ]
    assert not (tmp_path / '_index' / 'runs.jsonl').exists()  # a read never writes
    # A registration into a directory whose index is gone keeps the older runs listed too.
    await FileStepStore(tmp_path).register_run(RunRecord(run_id='new', conversation_id='conv-0'))
    listed = [r.run_id for r in await FileStepStore(tmp_path).list_runs(conversation_id='conv-0')]
    assert listed == [r.run_id for r in records if r.conversation_id == 'conv-0'] + ['new']


async def test_damaged_index_line_is_repaired_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    records = await register_many(FileStepStore(tmp_path), 5)
    index = tmp_path / '_index' / 'runs.jsonl'
    lines = index.read_bytes().splitlines(keepends=True)
    lines[2] = b'\x00garbage\n'
    index.write_bytes(b''.join(lines))
    with caplog.at_level(logging.WARNING):
        assert [r.run_id for r in await FileStepStore(tmp_path).list_runs()] == [r.run_id for r in records]
    assert 'damaged line in run index' in caplog.text
    # The next writer adds the lost run's line and marks the damage as handled, once.
    writer = FileStepStore(tmp_path)
    assert len(await writer.list_runs()) == 5
    await writer.register_run(RunRecord(run_id='later'))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert len(await FileStepStore(tmp_path).list_runs()) == 6
    assert 'damaged' not in caplog.text
    size = index.stat().st_size
    await FileStepStore(tmp_path).register_run(RunRecord(run_id='later-still'))
    assert index.stat().st_size - size < 400, 'the repair ran again'


async def test_a_run_folder_whose_run_json_does_not_read_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run only its folder knows, unreadable: every listing warns it skipped it, and says which."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='good', conversation_id='c', started_at=T0))
    lost = tmp_path / 'lost'
    lost.mkdir()
    (lost / 'run.json').write_bytes(b'not json{')
    reader = FileStepStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert [run.run_id for run in await reader.list_runs()] == ['good']
        assert [run.run_id for run in await reader.list_runs(conversation_id='c')] == ['good']
    assert caplog.text.count(f'skipping unreadable run record {lost / "run.json"}: not valid JSON') == 2
    (unreadable,) = await reader.list_unreadable_runs()
    assert unreadable.startswith(f'run record {lost / "run.json"}: not valid JSON')
    (lost / 'run.json').unlink()
    lost.rmdir()
    assert await FileStepStore(tmp_path).list_unreadable_runs() == []


async def test_index_line_without_run_json_is_not_a_run(tmp_path: Path) -> None:
    """A registration that crashed between its index line and run.json never happened."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='real', conversation_id='c'))
    ghost = {'run_id': 'ghost', 'conversation_id': 'c', 'started_at': T0.isoformat()}
    append_bytes(tmp_path / '_index' / 'runs.jsonl', json.dumps(ghost).encode() + b'\n')
    assert [r.run_id for r in await FileStepStore(tmp_path).list_runs(conversation_id='c')] == ['real']
    await FileStepStore(tmp_path).register_run(RunRecord(run_id='ghost', conversation_id='d', started_at=T0))
    assert [r.run_id for r in await FileStepStore(tmp_path).list_runs(conversation_id='d')] == ['ghost']
    assert await FileStepStore(tmp_path).list_runs(conversation_id='c') == [await store.get_run(run_id='real')]


async def test_a_reader_that_listed_once_sees_what_other_writers_did_since(tmp_path: Path) -> None:
    """Listing by a lineage field uses a map built once; every change behind the reader shows."""
    reader, writer = FileStepStore(tmp_path), FileStepStore(tmp_path)
    await writer.register_run(RunRecord(run_id='a', conversation_id='c'))
    assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['a']
    await writer.register_run(RunRecord(run_id='b', conversation_id='c'))
    await writer.register_run(RunRecord(run_id='x', conversation_id='other'))
    assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['a', 'b']
    # A registration still writing: its index line first, its run.json later, with nothing else changing.
    pending = {'run_id': 'late', 'conversation_id': 'c', 'started_at': T0.isoformat()}
    append_bytes(tmp_path / '_index' / 'runs.jsonl', json.dumps(pending).encode() + b'\n')
    assert [r.run_id for r in await reader.list_runs(conversation_id='c')] == ['a', 'b']
    (tmp_path / 'late').mkdir()
    (tmp_path / 'late' / 'run.json').write_text(json.dumps(pending))
    assert {r.run_id for r in await reader.list_runs(conversation_id='c')} == {'a', 'b', 'late'}
    await writer.delete_run('b')
    assert {r.run_id for r in await reader.list_runs(conversation_id='c')} == {'a', 'late'}
    assert [r.run_id for r in await reader.list_runs(agent_name=None, conversation_id='other')] == ['x']


# --- data written by the upstream package ------------------------------------------------------


async def test_reads_and_continues_a_directory_written_by_the_upstream_package(tmp_path: Path) -> None:
    run_dir = tmp_path / 'legacy-run'
    (run_dir / 'snapshots').mkdir(parents=True)
    record = {
        'run_id': 'legacy-run',
        'conversation_id': 'conv',
        'parent_run_id': None,
        'agent_name': 'lib',
        'metadata': {},
        'started_at': T0.isoformat(),
        'registration_id': 'reg',
    }
    (run_dir / 'run.json').write_text(json.dumps(record))
    tree = json.loads(ModelMessagesTypeAdapter.dump_json(history(1)))
    for seq, state in ((0, 'complete'), (1, 'interrupted')):
        body = {
            'run_id': 'legacy-run',
            'step_index': seq + 1,
            'conversation_id': 'conv',
            'parent_run_id': None,
            'agent_name': 'lib',
            'timestamp': T0.isoformat(),
            'state': state,
            'messages': tree,
            'idempotency_key': f'{seq}:{seq + 1}:{state}',
        }
        (run_dir / 'snapshots' / f'{seq}.json').write_text(json.dumps(body))
    (run_dir / 'snapshot-keys.jsonl').write_text('"0:1:complete"\n"1:2:interrupted"\n')
    store = FileStepStore(tmp_path)
    assert [r.run_id for r in await store.list_runs(conversation_id='conv')] == ['legacy-run']
    latest = await store.latest_snapshot(run_id='legacy-run')
    assert latest is not None and latest.step_index == 1 and dump(latest.messages) == dump(history(1))
    # A replayed upstream key is still suppressed; a new snapshot follows the upstream seqs.
    await store.save_snapshot(snap('legacy-run', history(2), 9, idempotency_key='0:1:complete'))
    await store.save_snapshot(snap('legacy-run', history(2), 3, idempotency_key='2:3:complete'))
    assert sorted(path.name for path in (run_dir / 'snapshots').iterdir()) == ['0.json', '1.json', '2.json']
    snapshots = await FileStepStore(tmp_path).list_snapshots(run_id='legacy-run', include_interrupted=True)
    assert [s.step_index for s in snapshots] == [1, 2, 3]
    assert dump(snapshots[-1].messages) == dump(history(2))


# --- two writers of one run --------------------------------------------------------------------


async def test_two_store_instances_writing_one_run_stay_exact(tmp_path: Path) -> None:
    first, second = FileStepStore(tmp_path), FileStepStore(tmp_path)
    await first.register_run(RunRecord(run_id='r'))
    expected: list[bytes] = []
    for step in range(1, 7):
        writer = first if step % 3 else second
        messages = history(step)
        if step == 4:  # a history processor rewrote earlier messages
            messages = history(step)[3:]
        await writer.save_snapshot(snap('r', messages, step))
        expected.append(dump(messages))
    for reader in (first, second, FileStepStore(tmp_path)):
        assert [dump(s.messages) for s in await reader.list_snapshots(run_id='r')] == expected


async def test_reads_of_an_empty_location_create_nothing(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'not-yet')
    assert await store.list_runs() == []
    assert await store.get_run(run_id='r') is None
    assert await store.latest_snapshot(run_id='r') is None
    assert await store.list_events(run_id='r') == []
    assert await store.list_unresolved_tool_effects(run_id='r') == []
    assert not (tmp_path / 'not-yet').exists()


async def test_a_run_folder_deleted_behind_the_store_is_not_written_again(tmp_path: Path) -> None:

    from pydantic_ai_steps.step_persistence import RunNotFoundError

    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.save_snapshot(snap('r', history(1), 1))
    shutil.rmtree(tmp_path / 'r')
    for _ in range(2):
        with pytest.raises(RunNotFoundError):
            await store.save_snapshot(snap('r', history(2), 2))
        with pytest.raises(RunNotFoundError):
            await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0))
    assert not (tmp_path / 'r').exists()
    assert await FileStepStore(tmp_path).latest_snapshot(run_id='r') is None


async def test_deleting_a_run_never_removes_a_folder_that_holds_another_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a case-insensitive file system `Run1` and `run1` are one folder: deleting the id that is
    not stored must leave the run that is (simulated by moving a run's folder under another name)."""
    store = FileStepStore(tmp_path)
    await store.register_run(RunRecord(run_id='Run1', started_at=T0))
    await store.aclose()
    os.rename(tmp_path / 'Run1', tmp_path / 'run1')
    store = FileStepStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        await store.delete_run('run1')
    assert (tmp_path / 'run1' / 'run.json').exists()
    assert "it holds run 'Run1'" in caplog.text
