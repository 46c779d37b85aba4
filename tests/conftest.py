"""Shared test fixtures.

Tests that need a live server read its address from environment variables that `scripts/test`
exports after starting the servers. Without them a test skips with the reason, except under
`CI=true`, where a missing server is a failure: CI must never pass by skipping.

The suite runs in parallel (`pytest -n 2` in `scripts/test`): the shared servers serve every
xdist worker at once, so each test works in names of its own (a table prefix, a database, a key
prefix) and never changes a server for everyone. A test that stops, restarts or kills a server,
or arms a fail point (which acts on every client), does it to a private server instead:
`private_postgres`, `private_mongodb`.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pydantic_ai_steps import _files
from tests.servers.restart import PrivateMongoDB, PrivatePostgres


@pytest.fixture
def anyio_backend() -> str:
    return 'asyncio'


def require_env(*names: str) -> dict[str, str]:
    """Return the named environment variables, or skip (fail under CI) when one is missing."""
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        reason = f'live server not configured: {", ".join(missing)} unset (run the suite through scripts/test)'
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(reason)
        pytest.skip(reason)
    return {name: os.environ[name] for name in names}


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of this test's own, for a test that stops, restarts or kills it (about
    1 s to create: initdb and a start). See `tests/servers/restart.py`."""
    server = PrivatePostgres(require_env('TEST_POSTGRES_BIN')['TEST_POSTGRES_BIN'])
    yield server
    server.close()


@pytest.fixture(scope='module')
def private_mongodb_server() -> Iterator[PrivateMongoDB]:
    server = PrivateMongoDB(require_env('TEST_MONGODB_CMD')['TEST_MONGODB_CMD'])
    yield server
    server.close()


@pytest.fixture
def private_mongodb(private_mongodb_server: PrivateMongoDB) -> PrivateMongoDB:
    """A SecantusDB server of this module's own (one per module in each xdist worker: about 1 s to
    start), running when the test begins, for tests that stop or kill it or arm its fail points
    (which act on every client of the server). See `tests/servers/restart.py`."""
    if not private_mongodb_server.running:  # a test that failed while it was down
        private_mongodb_server.start()
    return private_mongodb_server


class _StatAs:
    """A stat result that reports another owner."""

    def __init__(self, info: os.stat_result, uid: int) -> None:
        self._info = info
        self.st_uid = uid

    def __getattr__(self, name: str) -> Any:
        return getattr(self._info, name)


@pytest.fixture
def give_away(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make an entry look owned by another user to `os.lstat`, `os.stat` and `os.fstat`.

    `chown` to another user needs root, so the owner is changed in what the stat calls report
    (by inode), which works for every user and in CI. The entry itself is left as it is.
    """
    foreign: set[tuple[int, int]] = set()
    other = (os.geteuid() + 1) if hasattr(os, 'geteuid') else 1

    def patched(real: Callable[..., os.stat_result]) -> Callable[..., Any]:
        def stat_call(*args: Any, **kwargs: Any) -> Any:
            info = real(*args, **kwargs)
            return _StatAs(info, other) if (info.st_dev, info.st_ino) in foreign else info

        return stat_call

    for name in ('lstat', 'stat', 'fstat'):
        monkeypatch.setattr(os, name, patched(getattr(os, name)))

    def give(path: Path) -> None:
        info = os.lstat(path)
        foreign.add((info.st_dev, info.st_ino))

    return give


@pytest.fixture
def plant_fifo() -> Iterator[Callable[[Path], None]]:
    """Make a FIFO at a path; the test fails if anything waits to read it.

    Opening a FIFO for reading waits for a writer, so a store that did would hang the suite. After
    a few seconds a watchdog opens each FIFO for writing, which lets such a reader go on (to an
    empty read), and the test then fails naming the FIFO it waited on.
    """
    fifos: list[Path] = []
    released: list[Path] = []
    done = threading.Event()

    def watch() -> None:
        if done.wait(5):
            return
        while not done.wait(0.05):
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # only while a reader has it open
                except OSError as error:
                    if error.errno not in (errno.ENXIO, errno.ENOENT):
                        raise
                else:
                    released.append(fifo)

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()

    def plant(path: Path) -> None:
        os.mkfifo(path, 0o600)
        fifos.append(path)

    yield plant
    done.set()
    watchdog.join()
    assert not released, f'waited to read the FIFO at {released[0]}'


@pytest.fixture
def an_hour_later(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Move the clock the tidying of temporary files reads past `_files.STALE_TEMP_SECONDS`: what
    a killed process left until now is old to it."""

    def later() -> None:
        offset = _files.STALE_TEMP_SECONDS + 1
        monkeypatch.setattr(_files, 'time', SimpleNamespace(time=lambda: time.time() + offset))

    return later
