"""Drive the real console script in a subprocess, in a pipe or on a pseudo-terminal."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.cli._stores import close_store
from pydantic_ai_steps.step_persistence import StepStore

from .populate import Population, populate

CLI = [sys.executable, '-m', 'pydantic_ai_steps.cli']
TIMEOUT = 180


def cli_env(**overrides: str | None) -> dict[str, str]:
    """The test's environment without NO_COLOR (so a pipe alone must turn colour off), plus overrides."""
    env = {key: value for key, value in os.environ.items() if key != 'NO_COLOR'}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(
    *args: str, cwd: Path | None = None, module: str = 'pydantic_ai_steps.cli', **env: str | None
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> ARGS` in a pipe; `module='pydantic_ai_steps'` is the README's spelling."""
    return subprocess.run(
        [sys.executable, '-m', module, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(**env),
        timeout=TIMEOUT,
        check=False,
    )


@dataclass
class TtyResult:
    returncode: int
    stdout: str
    stderr: str


def run_on_tty(*args: str, columns: int = 200, **env: str | None) -> TtyResult:
    """Run with stdout and stderr each on its own pseudo-terminal, as in an interactive shell."""
    import pty

    out_master, out_slave = pty.openpty()
    err_master, err_slave = pty.openpty()
    process = subprocess.Popen(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=out_slave,
        stderr=err_slave,
        env=cli_env(COLUMNS=str(columns), **env),
    )
    os.close(out_slave)
    os.close(err_slave)
    chunks: dict[int, list[bytes]] = {out_master: [], err_master: []}
    open_fds = {out_master, err_master}
    while open_fds:
        ready, _, _ = select.select(list(open_fds), [], [], TIMEOUT)
        if not ready:
            process.kill()
            raise TimeoutError(f'{args} produced no output for {TIMEOUT} s')
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its end
                data = b''
            if data:
                chunks[fd].append(data)
            else:
                open_fds.discard(fd)
                os.close(fd)
    returncode = process.wait(timeout=TIMEOUT)

    def text(fd: int) -> str:
        return b''.join(chunks[fd]).decode().replace('\r\n', '\n')

    return TtyResult(returncode, text(out_master), text(err_master))


def open_store(kind: str, root: Path) -> tuple[StepStore, str]:
    """A real store of `kind` under `root`, and the URL the CLI names it by."""
    if kind == 'sqlite':
        from pydantic_ai_steps.step_persistence import SqliteStepStore

        path = root / 'steps.db'
        return SqliteStepStore(database=path), f'sqlite:///{path}'
    from pydantic_ai_steps.step_persistence import FileStepStore

    directory = root / 'steps'
    return FileStepStore(directory), f'file://{directory}'


@dataclass(frozen=True)
class PopulatedStore:
    kind: str
    url: str
    root: Path
    runs: Population


@pytest.fixture(scope='module', params=['sqlite', 'file'])
def populated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PopulatedStore:
    """One store of each shipped kind holding `populate`'s runs, shared by a module's tests."""
    kind: str = request.param
    root = tmp_path_factory.mktemp(kind)
    store, url = open_store(kind, root)
    runs = anyio.run(populate_and_close, store)
    return PopulatedStore(kind, url, root, runs)


async def populate_and_close(store: StepStore) -> Population:
    """`populate`, then release the store, so the commands under test are its only readers."""
    try:
        return await populate(store)
    finally:
        await close_store(store)
