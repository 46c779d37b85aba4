"""Drive the command line: in this process (`main(argv)`, the default), or as the real console
script in a subprocess, in a pipe or on a pseudo-terminal, where the process boundary is the point.

Starting `python -m pydantic_ai_steps.cli` costs ~1.7 s of importing pydantic_ai, so tests call
`run_cli_inprocess`, which runs the same `main` the console script runs, with stdout and stderr
captured in a pipe's stead. `run_cli` (a real subprocess) is kept for what only a process shows:
the installed console script, `python -m`, exit statuses, terminals, broken pipes, the demo's kill.
Set `PYDANTIC_AI_STEPS_CLI_TESTS=subprocess` to run every in-process call as a subprocess instead,
to check the two agree.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import select
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.cli import main
from pydantic_ai_steps.step_persistence import StepStore
from tests.conftest import require_env

from .populate import Population, populate

CLI = [sys.executable, '-m', 'pydantic_ai_steps.cli']
TIMEOUT = 180
ALL_IN_SUBPROCESSES = os.environ.get('PYDANTIC_AI_STEPS_CLI_TESTS') == 'subprocess'


def cli_env(**overrides: str | None) -> dict[str, str]:
    """The test's environment without NO_COLOR (so a pipe alone must turn colour off), plus overrides."""
    env = {key: value for key, value in os.environ.items() if key != 'NO_COLOR'}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass(frozen=True)
class CliResult:
    """What a command left behind, read like a `subprocess.CompletedProcess`."""

    returncode: int
    stdout: str
    stderr: str


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


class TerminalStringIO(io.StringIO):
    """A `StringIO` that says it is a terminal, so the CLI writes to it as to one (colour, width)."""

    def isatty(self) -> bool:
        return True


def run_cli_inprocess(*args: str, cwd: Path | None = None, tty: bool = False, **env: str | None) -> CliResult:
    """`main(ARGS)` in this process, as `run_cli` runs the console script in a pipe.

    stdout and stderr are `StringIO`s (not terminals: no colour, no width, no progress), NO_COLOR
    is unset and `env` applied (`None` unsets) with monkeypatch, `cwd` is entered with chdir, all
    undone on return. argparse's `SystemExit` becomes the exit code. What a process with nothing
    configured would also print on stderr is captured there too: log records of WARNING and above
    (logging's last-resort handler) and warnings Python shows by default (deprecation and resource
    warnings, hidden from a user, are passed on to pytest). `tty=True` makes stdout say it is a
    terminal, so colour is on (unless `NO_COLOR` is given) and tables fit `COLUMNS`.
    """
    if ALL_IN_SUBPROCESSES and not tty:
        completed = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=cli_env(**env), timeout=TIMEOUT, check=False
        )
        return CliResult(completed.returncode, completed.stdout, completed.stderr)
    stdout, stderr = TerminalStringIO() if tty else io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stderr)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.delenv('NO_COLOR', raising=False)
        for key, value in env.items():
            if value is None:
                patch.delenv(key, raising=False)
            else:
                patch.setenv(key, value)
        if cwd is not None:
            patch.chdir(cwd)
        patch.setattr(sys, 'stdout', stdout)
        patch.setattr(sys, 'stderr', stderr)
        root.addHandler(handler)
        try:
            returncode = main(list(args))
        except SystemExit as exit:  # argparse: --help and usage errors
            returncode = _exit_status(exit.code, stderr)
        finally:
            root.removeHandler(handler)
    for warning in caught:
        if issubclass(
            warning.category, (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
        ):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        else:
            stderr.write(warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno))
    return CliResult(returncode, stdout.getvalue(), stderr.getvalue())


def _exit_status(code: object, stderr: io.StringIO) -> int:
    """The status `sys.exit(code)` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    stderr.write(f'{code}\n')
    return 1


def run_on_tty(*args: str, columns: int = 200, **env: str | None) -> CliResult:
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

    return CliResult(returncode, text(out_master), text(err_master))


def postgres_prefix(root: Path) -> str:
    """The table prefix of the PostgreSQL store "under" `root`: the same for every call with it."""
    return 't_cli_' + hashlib.sha256(str(root).encode()).hexdigest()[:12]


def open_store(kind: str, root: Path) -> tuple[StepStore, str]:
    """A real store of `kind` under `root` (for PostgreSQL: a table prefix derived from it), and its URL."""
    if kind == 'postgres':
        from pydantic_ai_steps.step_persistence import PostgresStepStore

        dsn = require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']
        prefix = postgres_prefix(root)
        return PostgresStepStore(dsn=dsn, table=prefix), f'{dsn}?table={prefix}'
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


STORE_KINDS = ['sqlite', 'file', 'postgres']


def drop_postgres_store(root: Path) -> None:
    from tests.postgres.conftest import drop_prefix

    drop_prefix(require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN'], postgres_prefix(root))


@pytest.fixture(scope='module', params=STORE_KINDS)
def populated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PopulatedStore]:
    """One store of each shipped kind holding `populate`'s runs, shared by a module's tests."""
    kind: str = request.param
    root = tmp_path_factory.mktemp(kind)
    store, url = open_store(kind, root)
    runs = anyio.run(populate_and_close, store)
    yield PopulatedStore(kind, url, root, runs)
    if kind == 'postgres':
        drop_postgres_store(root)


async def populate_and_close(store: StepStore) -> Population:
    """`populate`, then release the store, so the commands under test are its only readers."""
    try:
        return await populate(store)
    finally:
        await store.aclose()
