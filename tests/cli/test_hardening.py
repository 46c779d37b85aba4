"""The CLI on things that are not its stores: it refuses, and writes and deletes nothing."""

from __future__ import annotations

import errno
import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import pytest

from pydantic_ai_steps.cli import _export, main

from .conftest import CLI, open_store, populate_and_close, run_cli, run_cli_inprocess


def snapshot_of(directory: Path) -> dict[str, bytes | str | None]:
    """Each file's bytes, None for a folder, a link's target (as text) for a link."""
    return {
        str(path.relative_to(directory)): os.readlink(path)
        if path.is_symlink()
        else None
        if path.is_dir()
        else path.read_bytes()
        for path in sorted(directory.rglob('*'))
    }


def make_project(directory: Path) -> dict[str, bytes | str | None]:
    (directory / 'src').mkdir(parents=True)
    (directory / 'README').write_text('my project\n')
    (directory / 'src' / 'main.py').write_text('print("hello")\n')
    return snapshot_of(directory)


@pytest.mark.parametrize('command', [['runs'], ['tree'], ['stats'], ['events', 'x']])
def test_the_inspector_refuses_a_directory_that_is_not_a_store(tmp_path: Path, command: list[str]) -> None:
    before = make_project(tmp_path / 'project')
    result = run_cli_inprocess(*command, '--store', str(tmp_path / 'project'))
    assert result.returncode == 1
    assert 'is not a step store' in result.stderr and result.stderr.count('\n') == 1
    assert snapshot_of(tmp_path / 'project') == before  # no _index, nothing written


@pytest.mark.parametrize(
    'command', [['runs'], ['delete', 'x', '--yes'], ['prune', '--older-than', '0s', '--yes'], ['gc', '--yes']]
)
def test_another_applications_database_with_a_runs_table_is_not_a_step_store(
    tmp_path: Path, command: list[str]
) -> None:
    database = tmp_path / 'app.db'
    connection = sqlite3.connect(database)
    connection.execute('CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)')
    connection.execute("INSERT INTO runs (name) VALUES ('nightly')")
    connection.commit()
    connection.close()
    before = database.read_bytes()
    result = run_cli_inprocess(*command, '--store', str(database))
    assert result.returncode == 1
    assert 'is not a step store' in result.stderr and 'has no column(s) metadata, run_id, started_at' in result.stderr
    assert database.read_bytes() == before


def test_the_inspector_on_proc_self_is_a_clear_error() -> None:
    if not Path('/proc/self').exists():
        pytest.skip('no /proc here')
    result = run_cli_inprocess('runs', '--store', '/proc/self')
    assert result.returncode == 1
    assert 'Recursion' not in result.stderr and result.stderr.startswith('pydantic-ai-steps: error: ')


def test_the_inspector_never_writes_into_a_store_it_reads(tmp_path: Path) -> None:
    database = tmp_path / 'steps.db'
    with sqlite3.connect(database) as connection:  # an upstream-like database, before any migration
        connection.execute('CREATE TABLE runs (run_id TEXT PRIMARY KEY, metadata TEXT NOT NULL, started_at TEXT)')
        connection.execute("INSERT INTO runs VALUES ('r', '{}', '2026-01-01T00:00:00+00:00')")
    tables = sqlite3.connect(database).execute('SELECT name FROM sqlite_master ORDER BY name').fetchall()
    for command in (['runs'], ['tree'], ['stats'], ['events', 'r'], ['effects', 'r'], ['export', 'r']):
        result = run_cli_inprocess(*command, '--store', f'sqlite:///{database}')
        assert result.returncode == 0, result.stderr
    assert sqlite3.connect(database).execute('SELECT name FROM sqlite_master ORDER BY name').fetchall() == tables


def test_the_demo_refuses_a_directory_holding_other_files_and_deletes_nothing(tmp_path: Path) -> None:
    before = make_project(tmp_path / 'project')
    for _ in range(2):
        result = run_cli_inprocess('demo', '--store', str(tmp_path / 'project'), cwd=tmp_path)
        assert result.returncode == 1
        assert 'refusing to use' in result.stderr and 'not a step store' in result.stderr
    assert snapshot_of(tmp_path / 'project') == before


def test_the_demo_in_the_current_directory_twice_removes_only_its_own_runs(tmp_path: Path) -> None:
    os.mkdir(tmp_path / 'here')
    for attempt in range(2):
        result = run_cli_inprocess('demo', '--store', '.', cwd=tmp_path / 'here')
        assert result.returncode == 0, result.stdout + result.stderr
        if attempt:
            assert 'reset: deleted the' in result.stdout
    (tmp_path / 'here' / 'notes.txt').write_text('mine\n')  # something of the user's in the store directory
    result = run_cli_inprocess('demo', '--store', '.', cwd=tmp_path / 'here')
    assert result.returncode == 0, result.stderr
    assert (tmp_path / 'here' / 'notes.txt').read_text() == 'mine\n'


def test_a_damaged_record_is_one_warning_line_not_a_traceback(tmp_path: Path) -> None:
    import anyio

    from .conftest import open_store, populate_and_close

    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    with sqlite3.connect(tmp_path / 'steps.db') as connection:
        connection.execute("UPDATE events SET kind = 'exploded' WHERE run_id = ?", (runs.librarian,))
    result = run_cli_inprocess('events', runs.librarian, '--store', url)
    assert result.returncode == 0
    assert 'Traceback' not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line]
    assert warnings and all('skipping unreadable event' in line for line in warnings)


def _outputs_inside(kind: str, root: Path) -> list[Path]:
    if kind == 'sqlite':
        database = root / 'steps.db'
        (root / 'linked.db').symlink_to(database)
        os.link(database, root / 'hard.db')
        return [database, root / 'steps.db-wal', root / 'linked.db', root / 'hard.db']
    return [root / 'steps' / '_index' / 'runs.jsonl', root / 'steps' / 'new.jsonl', root / 'steps']


@pytest.mark.parametrize('kind', ['sqlite', 'file'])
def test_export_refuses_to_write_over_the_store_it_reads(kind: str, tmp_path: Path) -> None:
    store, url = open_store(kind, tmp_path)
    runs = anyio.run(populate_and_close, store)
    for output in _outputs_inside(kind, tmp_path):
        result = run_cli_inprocess('export', runs.orchestrator, '-o', str(output), '--store', url)
        assert result.returncode == 1, output
        assert result.stderr.startswith(f"pydantic-ai-steps: error: --output '{output}' is part of the store at ")
    assert run_cli_inprocess('runs', '--store', url).returncode == 0
    assert runs.orchestrator in run_cli_inprocess('runs', '--store', url).stdout


def test_an_export_is_on_disk_before_it_replaces_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new file is flushed to disk before the rename, and the rename after it: a power cut
    leaves the old export or the new one whole, never an empty file under the name."""
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    target = tmp_path / 'orch.jsonl'
    target.write_text('the export of yesterday\n')
    steps: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append(('fsync', os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(source: Any, destination: Any) -> None:
        steps.append(('replace', os.stat(source).st_ino))
        real_replace(source, destination)

    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(os, 'replace', replace)
    assert main(['export', runs.orchestrator, '-o', str(target), '--store', url]) == 0
    new_file, folder = target.stat().st_ino, tmp_path.stat().st_ino
    assert ('fsync', new_file) in steps and steps[-1] == ('fsync', folder)
    assert steps.index(('fsync', new_file)) < steps.index(('replace', new_file)) < len(steps) - 1
    assert target.read_text().startswith('{"type":"run"')


def test_a_failed_export_leaves_the_file_it_would_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    target = tmp_path / 'orch.jsonl'
    target.write_text('the export of yesterday\n')

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError('the store went away')

    monkeypatch.setattr(_export, 'snapshot_dict', broken)
    assert main(['export', runs.orchestrator, '-o', str(target), '--store', url]) == 1  # in this process: patched
    assert 'the store went away' in capsys.readouterr().err
    assert target.read_text() == 'the export of yesterday\n'
    assert sorted(path.name for path in tmp_path.iterdir() if 'orch' in path.name) == ['orch.jsonl']  # no temp file


@pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='named pipes are POSIX')
@pytest.mark.parametrize('name', ['steps.db', 'pipe'])
def test_a_named_pipe_is_refused_without_blocking_on_it(tmp_path: Path, name: str) -> None:
    pipe = tmp_path / name
    os.mkfifo(pipe)
    for value in (str(pipe), f'sqlite:///{pipe}'):
        result = run_cli_inprocess('runs', '--store', value)
        assert result.returncode == 1, value
        named_sqlite = value.startswith('sqlite:') or name.endswith('.db')
        assert ('is not a regular file' if named_sqlite else 'is neither a SQLite database nor a directory') in (
            result.stderr
        )


def test_a_sqlite_uri_filename_is_refused_rather_than_created(tmp_path: Path) -> None:
    result = run_cli_inprocess('runs', '--store', 'sqlite:///file:new.db', cwd=tmp_path)
    assert result.returncode == 1
    assert "'file:' starts a SQLite URI, not a path; a file of that name is sqlite:///./file:" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_stats_through_a_link_to_the_database_counts_the_database(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    anyio.run(populate_and_close, store)
    (tmp_path / 'link.db').symlink_to(tmp_path / 'steps.db')
    direct = json.loads(run_cli_inprocess('stats', '--json', '--store', url).stdout)
    linked = json.loads(run_cli_inprocess('stats', '--json', '--store', str(tmp_path / 'link.db')).stdout)
    assert linked['bytes'] == direct['bytes'] >= (tmp_path / 'steps.db').stat().st_size > 4096


def test_export_keeps_the_mode_of_the_file_it_replaces_and_writes_through_a_link(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    kept = tmp_path / 'kept.jsonl'
    kept.write_text('old\n')
    kept.chmod(0o644)
    real = tmp_path / 'real.jsonl'
    real.write_text('old\n')
    (tmp_path / 'link.jsonl').symlink_to(real)
    for output in (kept, tmp_path / 'link.jsonl'):
        assert run_cli_inprocess('export', runs.orchestrator, '-o', str(output), '--store', url).returncode == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644 and kept.read_text().startswith('{"type":"run"')
    assert (tmp_path / 'link.jsonl').is_symlink() and real.read_text().startswith('{"type":"run"')
    new = tmp_path / ('x' * 240 + '.jsonl')  # a long name: the temporary file's name is short
    assert run_cli_inprocess('export', runs.orchestrator, '-o', str(new), '--store', url).returncode == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o600  # private, as the store's own files
    missing = run_cli_inprocess('export', runs.orchestrator, '-o', str(tmp_path / 'no' / 'x.jsonl'), '--store', url)
    assert missing.returncode == 1 and f"cannot write --output '{tmp_path / 'no' / 'x.jsonl'}'" in missing.stderr


def test_export_to_a_path_it_cannot_write_is_a_clean_error_and_writes_nothing(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    out = tmp_path / 'out'
    (out / 'folder').mkdir(parents=True)
    (out / 'folder' / 'kept.jsonl').write_text('mine\n')
    (out / 'a-file').write_text('mine\n')
    (out / 'to-folder').symlink_to(out / 'folder')
    (out / 'dangling').symlink_to(out / 'missing' / 'x.jsonl')
    before = snapshot_of(out)
    refused = {
        out / 'folder': 'names a directory: name the file to write the export to',
        f'{out / "folder"}{os.sep}': 'names a directory',
        out / 'to-folder': 'names a directory',
        f'{out / "new"}{os.sep}': 'names a directory',
        out / 'a-file' / 'x.jsonl': 'Not a directory',
        out / 'dangling': 'No such file or directory',
        out / ('x' * 300): 'File name too long',
    }
    for output, reason in refused.items():
        result = run_cli_inprocess('export', runs.orchestrator, '-o', str(output), '--store', url)
        assert result.returncode == 1, output
        assert result.stderr.startswith('pydantic-ai-steps: error: '), result.stderr
        assert f"--output '{output}'" in result.stderr and reason in result.stderr, result.stderr
        assert '--debug' not in result.stderr and result.stdout == ''
        assert snapshot_of(out) == before, output  # no temporary file, nothing written through


def test_a_bare_path_starting_with_file_colon_is_that_file_not_a_sqlite_uri(tmp_path: Path) -> None:
    result = run_cli_inprocess('runs', '--store', './file:y.db', cwd=tmp_path)
    assert result.returncode == 1 and 'does not exist' in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_to_an_empty_output_is_refused_not_written_to_stdout(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    (tmp_path / 'here').mkdir()
    for spelling in (['-o', ''], ['--output=']):  # `-o "$UNSET"`
        result = run_cli_inprocess('export', runs.orchestrator, *spelling, '--store', url, cwd=tmp_path / 'here')
        assert result.returncode == 1, spelling
        assert result.stderr == (
            "pydantic-ai-steps: error: --output '' names no file: name the file to write the export to, "
            'or leave out --output for stdout\n'
        )
        assert result.stdout == ''
    assert list((tmp_path / 'here').iterdir()) == []


class FillingDisk(io.StringIO):
    """Takes `room` characters, then fails as a full disk does: part of a write, then `ENOSPC`."""

    def __init__(self, room: int, into: TextIO | None = None) -> None:
        super().__init__()
        self.room, self.into = room, into

    def write(self, text: str, /) -> int:
        taken = text[: self.room]
        self.room -= len(taken)
        (self.into or super()).write(taken)
        if len(taken) < len(text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(text)

    def close(self) -> None:
        if self.into is not None:
            self.into.close()
        super().close()


@pytest.mark.parametrize('command', [['export', 'media-1'], ['continue', 'media-1'], ['snapshot', 'media-1', '--json']])
def test_stdout_on_a_full_disk_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    store, url = open_store('sqlite', tmp_path)
    anyio.run(populate_and_close, store)
    monkeypatch.setattr(sys, 'stdout', FillingDisk(1000))
    assert main([*command, '--store', url]) == 1
    assert capsys.readouterr().err == 'pydantic-ai-steps: error: cannot write stdout: No space left on device\n'


def test_an_export_the_disk_fills_under_is_a_clear_error_and_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    target = tmp_path / 'media.jsonl'
    target.write_text('the export of yesterday\n')
    fdopen = os.fdopen

    def filling(descriptor: int, *args: Any, **kwargs: Any) -> TextIO:
        return cast(TextIO, FillingDisk(5000, into=fdopen(descriptor, *args, **kwargs)))

    monkeypatch.setattr(os, 'fdopen', filling)
    assert main(['export', runs.media, '-o', str(target), '--store', url]) == 1
    assert capsys.readouterr().err == (
        f"pydantic-ai-steps: error: cannot write --output '{target}': No space left on device\n"
    )
    assert target.read_text() == 'the export of yesterday\n'
    assert [path.name for path in tmp_path.iterdir() if path.is_file()] == ['media.jsonl']  # no temporary file


@pytest.mark.skipif(not Path('/dev/full').exists(), reason='no /dev/full here')
def test_a_full_device_is_one_error_line_for_stdout_and_for_output(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    with open('/dev/full', 'w') as full:
        piped = subprocess.run(
            [*CLI, 'export', runs.media, '--store', url], stdout=full, stderr=subprocess.PIPE, text=True, check=False
        )
    named = run_cli('export', runs.media, '-o', '/dev/full', '--store', url)
    assert (piped.returncode, piped.stderr) == (
        1,
        'pydantic-ai-steps: error: cannot write stdout: No space left on device\n',
    )
    assert (named.returncode, named.stderr) == (
        1,
        "pydantic-ai-steps: error: cannot write --output '/dev/full': No space left on device\n",
    )


def test_the_demo_on_a_full_disk_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, 'stdout', FillingDisk(100))
    assert main(['demo', '--store', f'sqlite:///{tmp_path / "demo.db"}']) == 1
    assert capsys.readouterr().err == 'pydantic-ai-steps: error: cannot write stdout: No space left on device\n'


def test_export_refuses_to_replace_a_file_the_user_may_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    target = tmp_path / 'kept.jsonl'
    target.write_text('read-only, on purpose\n')
    target.chmod(0o444)
    if os.geteuid() == 0:  # root may write anything: deny as the kernel denies anyone else
        access = os.access
        monkeypatch.setattr(
            os, 'access', lambda path, mode, **kw: False if str(path) == str(target) else access(path, mode, **kw)
        )
    assert main(['export', runs.orchestrator, '-o', str(target), '--store', url]) == 1
    assert capsys.readouterr().err == f"pydantic-ai-steps: error: cannot write --output '{target}': Permission denied\n"
    assert target.read_text() == 'read-only, on purpose\n'
    assert sorted(path.name for path in tmp_path.iterdir()) == ['kept.jsonl', 'store']


def test_a_process_without_stdout_says_so_and_still_exports_to_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    monkeypatch.setattr(sys, 'stdout', None)  # started with `>&-`
    assert main(['runs', '--store', url]) == 1
    assert capsys.readouterr().err == 'pydantic-ai-steps: error: cannot write stdout: Bad file descriptor\n'
    assert main(['export', runs.orchestrator, '-o', str(tmp_path / 'orch.jsonl'), '--store', url]) == 0
    assert (tmp_path / 'orch.jsonl').read_text().startswith('{"type":"run"')


def test_a_failed_export_through_a_link_leaves_the_file_it_leads_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    (tmp_path / 'exports').mkdir()
    real = tmp_path / 'exports' / 'orch.jsonl'
    real.write_text('the export of yesterday\n')
    link = tmp_path / 'latest.jsonl'
    link.symlink_to(real)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError('the store went away')  # after the run and its events were written

    monkeypatch.setattr(_export, 'snapshot_dict', broken)
    assert main(['export', runs.orchestrator, '-o', str(link), '--store', url]) == 1  # in this process: patched
    assert 'the store went away' in capsys.readouterr().err
    assert link.is_symlink() and real.read_text() == 'the export of yesterday\n'
    assert sorted(path.name for path in (tmp_path / 'exports').iterdir()) == ['orch.jsonl']  # no temporary file


@pytest.mark.skipif(not Path('/dev/stdout').exists(), reason='no /dev/stdout here')
def test_export_to_dev_stdout_appended_to_a_file_keeps_what_the_file_held(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    log = tmp_path / 'log.jsonl'
    log.write_text('{"type":"earlier"}\n')
    with log.open('a') as appended:  # the shell's `>> log.jsonl`
        result = subprocess.run(
            [*CLI, 'export', runs.orchestrator, '-o', '/dev/stdout', '--store', url],
            stdout=appended,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == '{"type":"earlier"}' and json.loads(lines[1])['type'] == 'run' and len(lines) > 2


@pytest.mark.skipif(not Path('/dev/stdout').exists(), reason='no /dev/stdout here')
def test_export_through_a_link_to_dev_stdout_writes_through_and_to_a_file_under_dev_replaces_it(
    tmp_path: Path,
) -> None:
    """What decides is whether the link leads to a descriptor, not where its file lies: a file in
    `/dev/shm` is replaced whole, never added to."""
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    log = tmp_path / 'log.jsonl'
    log.write_text('{"type":"earlier"}\n')
    (tmp_path / 'to-stdout').symlink_to('/dev/stdout')
    with log.open('a') as appended:
        result = subprocess.run(
            [*CLI, 'export', runs.orchestrator, '-o', str(tmp_path / 'to-stdout'), '--store', url],
            stdout=appended,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines()[0] == '{"type":"earlier"}' and (tmp_path / 'to-stdout').is_symlink()
    if not Path('/dev/shm').is_dir() or not os.access('/dev/shm', os.W_OK):
        return
    with tempfile.TemporaryDirectory(dir='/dev/shm') as shm:
        real = Path(shm, 'orch.jsonl')
        real.write_text('the export of yesterday\n')
        link = tmp_path / 'latest.jsonl'
        link.symlink_to(real)
        done = run_cli_inprocess('export', runs.orchestrator, '-o', str(link), '--store', url)
        assert done.returncode == 0, done.stderr
        assert json.loads(real.read_text().splitlines()[0])['type'] == 'run' and link.is_symlink()


def test_export_to_a_dash_writes_stdout_not_a_file_named_dash(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path / 'store')
    runs = anyio.run(populate_and_close, store)
    (tmp_path / 'here').mkdir()
    plain = run_cli_inprocess('export', runs.orchestrator, '--store', url)
    dashed = run_cli_inprocess('export', runs.orchestrator, '-o', '-', '--store', url, cwd=tmp_path / 'here')
    assert (dashed.returncode, dashed.stderr) == (0, '')
    assert dashed.stdout == plain.stdout and json.loads(dashed.stdout.splitlines()[0])['type'] == 'run'
    assert list((tmp_path / 'here').iterdir()) == []


def test_a_process_without_stderr_still_runs_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    monkeypatch.setattr(sys, 'stderr', None)  # started with `2>&-`
    assert main(['runs', '--store', url]) == 0
    assert runs.orchestrator in capsys.readouterr().out
    assert main(['export', runs.orchestrator, '-o', str(tmp_path / 'orch.jsonl'), '--store', url]) == 0
    assert (tmp_path / 'orch.jsonl').read_text().startswith('{"type":"run"')
    assert main(['snapshot', 'no-such-run', '--store', url]) == 1  # the exit code still tells
    with pytest.raises(SystemExit) as exited:
        main(['runs', '--no-such-option'])
    assert exited.value.code == 2
