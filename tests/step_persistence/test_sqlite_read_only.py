"""`SqliteStepStore` and `SqliteMediaStore` on a database this process may only read: reads work,
writes fail naming the database."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pydantic_ai_steps.media.stores.sqlite import SqliteMediaStore
from pydantic_ai_steps.step_persistence import DatabaseReadOnlyError, RunRecord, SqliteStepStore

pytestmark = pytest.mark.anyio


async def make_store(path: Path) -> str:
    """A closed store holding run `a` and a blob; returns the blob's URI."""
    async with SqliteStepStore(database=path) as store:
        await store.register_run(RunRecord(run_id='a'))
        return await store.media_store.put(b'blob')


@pytest.mark.parametrize('store_kind', ['step', 'media'])
async def test_a_write_to_a_database_opened_read_only_names_it(tmp_path: Path, store_kind: str) -> None:
    path = tmp_path / 'runs.db'
    uri = await make_store(path)
    read_only = f'file:{path}?mode=ro'
    step_store = SqliteStepStore(database=read_only, media_store=None)
    media_store = SqliteMediaStore(database=read_only)
    assert [run.run_id for run in await step_store.list_runs()] == ['a']
    assert await media_store.get(uri) == b'blob'
    write = step_store.register_run(RunRecord(run_id='b')) if store_kind == 'step' else media_store.put(b'other')
    with pytest.raises(DatabaseReadOnlyError, match='cannot be written by this process') as caught:
        await write
    assert repr(read_only) in str(caught.value) and caught.value.sqlite_errorname == 'SQLITE_READONLY'
    assert isinstance(caught.value, PermissionError)
    assert [run.run_id for run in await step_store.list_runs()] == ['a']  # reads go on
    step_store.close()
    media_store.close()


_ON_A_READ_ONLY_MOUNT = textwrap.dedent(
    """
    import asyncio, json, sys
    from pydantic_ai_steps.step_persistence import DatabaseReadOnlyError, RunRecord, SqliteStepStore, open_step_store

    async def main(path, uri):
        found = {}
        probe = await open_step_store(f'sqlite:///{path}').backend.probe()
        found['probe'] = [probe.step_store, probe.detail]
        async with SqliteStepStore(database=path) as store:
            found['runs'] = [run.run_id for run in await store.list_runs()]
            found['blob'] = (await store.media_store.get(uri)).decode()
            try:
                await store.register_run(RunRecord(run_id='b'))
            except DatabaseReadOnlyError as error:
                found['register'] = str(error)
            try:
                await store.media_store.put(b'x')
            except DatabaseReadOnlyError as error:
                found['put'] = str(error)
        print(json.dumps(found))

    asyncio.run(main(*sys.argv[1:]))
    """
)


@pytest.mark.skipif(shutil.which('unshare') is None, reason='needs unshare(1) to mount a directory read-only')
async def test_a_database_on_a_read_only_mount_reads_and_refuses_writes(tmp_path: Path) -> None:
    """Its last writer closed it, so no `-shm` file is left, which SQLite cannot create there to read it."""
    folder = tmp_path / 'mounted'
    folder.mkdir()
    path = folder / 'runs.db'
    uri = await make_store(path)
    assert sorted(entry.name for entry in folder.iterdir()) == ['runs.db']
    script = 'mount --bind -o ro "$1" "$1" && exec "$2" -c "$3" "$1/runs.db" "$4"'
    command = ['unshare', '-rm', 'sh', '-c', script, 'sh', str(folder), sys.executable, _ON_A_READ_ONLY_MOUNT, uri]
    probe = subprocess.run(
        ['unshare', '-rm', 'sh', '-c', 'mount --bind -o ro "$1" "$1"', 'sh', str(folder)], check=False
    )
    if probe.returncode != 0:
        pytest.skip('this system does not let an unprivileged mount namespace mount a directory read-only')
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found['probe'] == [True, '']
    assert found['runs'] == ['a'] and found['blob'] == 'blob'
    assert all('cannot be written by this process' in found[name] for name in ('register', 'put'))
