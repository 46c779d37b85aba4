"""What a process killed inside a `FileStepStore` write leaves, and how maintenance tidies it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from pydantic_ai_steps.step_persistence import FileStepStore, RunRecord, StepEvent
from pydantic_ai_steps.store.backends.file import _io
from pydantic_ai_steps.testing.step_store import T0, dump

from .builders import history, snap

pytestmark = pytest.mark.anyio
NEVER = timedelta(days=365 * 200)
"""A prune age no run reaches: the prune removes no run, only what killed writes left."""


def stored(root: Path) -> dict[str, bytes]:
    """Every file under `root` but temporary ones, with its bytes."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in root.rglob('*')
        if path.is_file() and not _io.TEMP_NAME.fullmatch(path.name)
    }


def left_by_killed_writes(root: Path) -> list[Path]:
    """The temporary file of every write path, as a process killed before its rename or link leaves
    it (and one killed after its link, before its unlink: a second name of the stored file)."""
    run, snapshots = root / 'r', root / 'r' / 'snapshots'
    leftovers: list[Path] = []
    for target in (run / 'run.json', run / 'status.json', run / 'messages.jsonl', snapshots / '2.json'):
        leftovers.append(_io.temp_path(target))  # registration, closing, log rewrite, snapshot
        leftovers[-1].write_bytes(b'{"half": ')
    leftovers.append(_io.temp_path(root / '_index' / 'runs.jsonl'))  # the index rebuilt
    leftovers[-1].write_bytes(b'')
    leftovers.append(_io.temp_path(snapshots / '1.json'))
    os.link(snapshots / '1.json', leftovers[-1])
    return leftovers


async def a_stored_run(root: Path) -> FileStepStore:
    store = FileStepStore(root)
    await store.register_run(RunRecord(run_id='r', started_at=T0))
    await store.append_event(StepEvent(run_id='r', kind='run_started', step_index=0, timestamp=T0))
    await store.save_snapshot(snap('r', history(2)))
    return store


@pytest.mark.parametrize('maintenance', ['prune', 'collect_garbage'])
async def test_stale_temporary_files_of_killed_writes_go_and_nothing_stored_does(
    tmp_path: Path, maintenance: str, an_hour_later: Callable[[], None]
) -> None:
    store = await a_stored_run(tmp_path)
    leftovers = left_by_killed_writes(tmp_path)
    foreign = [tmp_path / 'r' / 'notes.tmp', tmp_path / 'r' / f'link.{uuid.uuid4().hex}.tmp']
    foreign[0].write_bytes(b'not ours')
    foreign[1].symlink_to(tmp_path / 'r' / 'run.json')
    before = stored(tmp_path)

    async def maintain(*, dry_run: bool) -> None:
        if maintenance == 'prune':
            assert (await store.prune(older_than=NEVER, dry_run=dry_run)).run_ids == []
        else:
            assert (await store.collect_garbage(dry_run=dry_run)).blobs == []

    await maintain(dry_run=False)
    assert all(path.exists() for path in leftovers)  # fresh: a live writer may be about to move them
    an_hour_later()
    await maintain(dry_run=True)
    assert all(path.exists() for path in leftovers)  # a dry run changes nothing
    loaded = await FileStepStore(tmp_path).latest_snapshot(run_id='r')  # readers skip them
    assert loaded is not None and dump(loaded.messages) == dump(history(2))
    await maintain(dry_run=False)
    assert not any(path.exists() for path in leftovers)
    assert stored(tmp_path) == before
    assert all(os.path.lexists(path) for path in foreign)
    loaded = await FileStepStore(tmp_path).latest_snapshot(run_id='r')
    assert loaded is not None and dump(loaded.messages) == dump(history(2))
    assert [run.run_id for run in await FileStepStore(tmp_path).list_runs()] == ['r']


async def test_a_deletion_killed_inside_the_trash_is_cleared_by_maintenance(tmp_path: Path) -> None:
    """A folder moved into the trash is out of the store: a prune with no run to remove clears it."""
    store = await a_stored_run(tmp_path)
    cut_short = tmp_path / '_index' / 'trash' / uuid.uuid4().hex
    cut_short.mkdir(parents=True)
    (cut_short / 'events.jsonl').write_bytes(b'{"kind": "run_started"}\n')
    await store.prune(older_than=NEVER, dry_run=True)
    assert cut_short.exists()
    await store.prune(older_than=NEVER)
    assert list((tmp_path / '_index' / 'trash').iterdir()) == []
    assert [run.run_id for run in await store.list_runs()] == ['r']
