"""Private PostgreSQL and SecantusDB servers, for the tests that stop, restart or kill a server.

The servers `scripts/services.sh` started are shared by every test of the run, in every xdist
worker at once: stopping one would break whatever else is connected to it at that moment. A test
that takes a server down takes down one of its own instead: `PrivatePostgres` and `PrivateMongoDB`
start a second server from what `services.sh` exports (`TEST_POSTGRES_BIN`, `TEST_MONGODB_CMD`, see
its header) with the same settings, on a free port, over fresh data in a new temporary directory.
`stop`, `start` and `restart` act on that instance only, and bring it back on the same port and
data; `close` kills it and deletes the directory. The `private_postgres` and `private_mongodb`
fixtures (`tests/conftest.py`) hand them out.

Without the variables the fixtures skip the test (fail under CI=true), like
`tests.conftest.require_env`; a variable naming a program that does not exist fails the same way.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from pymongo.errors import PyMongoError

# PostgreSQL refuses to run as root: as services.sh does, initdb and pg_ctl then run as this user.
POSTGRES_OS_USER = 'postgres'


def require_program(path: str) -> str:
    """`path`, if it is an executable file; else skip the test (fail under CI=true)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        reason = f'test server program missing: {path}'
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1, below the kernel's ephemeral range: while a private server is
    down for a restart, no outgoing connection of another process can be given its port."""
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path('/proc/sys/net/ipv4/ip_local_port_range').read_text().split()[0])
    for _ in range(100):
        port = random.randrange(10_000, max(low, 10_001))
        with socket.socket() as probe:
            try:
                probe.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError('no free TCP port found on 127.0.0.1')


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return '\n'.join(path.read_text(errors='replace').splitlines()[-lines:])
    except OSError:
        return '(no log)'


def _private_directory(kind: str) -> Path:
    # In /tmp, as services.sh does: every parent must be traversable by the `postgres` user, which a
    # pytest temporary directory (0700) is not.
    return Path(tempfile.mkdtemp(prefix=f'steps-{kind}-private.', dir='/tmp'))


# ---------------------------------------------------------------- PostgreSQL


class PrivatePostgres:
    """A PostgreSQL cluster of its own, with the shared server's binaries and settings.

    `dsn` names its `postgres` database, superuser `steps` (trust auth), fsync and
    synchronous_commit on.
    """

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.initdb = require_program(os.path.join(bindir, 'initdb'))
        self.pg_ctl = require_program(os.path.join(bindir, 'pg_ctl'))
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            require_program(shutil.which('runuser') or '/usr/sbin/runuser')
        self.root = _private_directory('postgres')
        self.data = self.root / 'data'
        self.log = self.root / 'server.log'
        self.port = 0
        try:
            if self.as_postgres:
                os.chmod(self.root, 0o755)  # mkdtemp gives 0700
                shutil.chown(self.root, POSTGRES_OS_USER, POSTGRES_OS_USER)
            # --no-sync: initdb's own files are not flushed (nothing here outlives the machine);
            # the server's settings below keep every commit durable.
            self._run(
                self.initdb, '-D', str(self.data), '-U', 'steps', '--auth=trust', '--encoding=UTF8',
                '--locale=C.UTF-8', '--no-sync',
            )  # fmt: skip
            self._create()
        except BaseException:
            self.close()
            raise

    @property
    def dsn(self) -> str:
        return f'postgresql://steps@127.0.0.1:{self.port}/postgres'

    def _run(self, *cmd: str) -> None:
        argv = ['runuser', '-u', POSTGRES_OS_USER, '--', *cmd] if self.as_postgres else list(cmd)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f'{shlex.join(argv)} failed ({done.returncode}): {done.stdout}{done.stderr}\n'
                f'server log:\n{_tail(self.log)}'
            )

    def _create(self) -> None:
        """Start the server on a free port (another if that one was taken in the meantime)."""
        original = (self.data / 'postgresql.conf').read_text()
        for attempt in range(3):
            self.port = free_port()
            # The settings of scripts/services.sh, in postgresql.conf so that a plain start keeps them.
            (self.data / 'postgresql.conf').write_text(
                f'{original}\n# tests/servers/restart.py\n'
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                'fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n'
            )
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    def stop(self, mode: str = 'fast') -> None:
        """Stop the server and wait until it is down. `mode`: `smart`, `fast` (roll back open
        transactions, close connections, checkpoint) or `immediate` (no checkpoint: the next start
        runs crash recovery, as after a power cut of the server process)."""
        self._run(self.pg_ctl, '-D', str(self.data), 'stop', '-m', mode, '-w', '-t', '60')

    def start(self) -> None:
        """Start the server on its port and data directory and wait until it accepts connections."""
        self._run(self.pg_ctl, '-D', str(self.data), '-l', str(self.log), 'start', '-w', '-t', '60')

    def restart(self, mode: str = 'fast') -> None:
        """`stop(mode)`, then `start()`: the same port, the same data."""
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server if it runs (its data is thrown away: no checkpoint) and delete it all."""
        if (self.data / 'postmaster.pid').exists():
            try:
                self.stop('immediate')
            except RuntimeError:
                pid = int((self.data / 'postmaster.pid').read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------- SecantusDB (MongoDB wire protocol)


def _replace_option(argv: list[str], option: str, value: str) -> None:
    if option not in argv or argv.index(option) + 1 >= len(argv):
        raise RuntimeError(f'TEST_MONGODB_CMD has no {option} VALUE: {shlex.join(argv)}')
    argv[argv.index(option) + 1] = value


class PrivateMongoDB:
    """A SecantusDB server of its own: the shared server's exact command line (`TEST_MONGODB_CMD`:
    the same program, a one-node replica set, fail points enabled, an fsync on every commit) with
    its own port, storage and (empty) config file."""

    def __init__(self, command: str) -> None:
        self.argv = shlex.split(command)
        require_program(self.argv[0])
        self.root = _private_directory('mongodb')
        self.storage = self.root / 'data'
        self.log = self.root / 'server.log'
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        try:
            config = self.root / 'secantusd.toml'
            config.touch()  # an explicit empty file: no config discovered elsewhere
            _replace_option(self.argv, '--config', str(config))
            _replace_option(self.argv, '--storage-path', str(self.storage))
            for attempt in range(3):
                self.port = free_port()
                _replace_option(self.argv, '--port', str(self.port))
                try:
                    self.start()
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f'mongodb://127.0.0.1:{self.port}'

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60) -> None:
        """Start the server on its port and storage and wait until it answers a ping."""
        assert not self.running, 'already running'
        with open(self.log, 'ab') as log:
            # Its own session, as services.sh's `spawn`: a Ctrl-C in the terminal is not for it.
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(self.url, serverSelectionTimeoutMS=500)
            try:
                # Still alive: the answer came from this server, not from one that had the port.
                if client.admin.command('ping').get('ok') == 1 and self.running:
                    return
            except PyMongoError:
                pass
            finally:
                client.close()
            if self.process.poll() is not None:
                raise RuntimeError(f'SecantusDB exited during start ({self.process.returncode}):\n{_tail(self.log)}')
            if time.monotonic() > deadline:
                raise TimeoutError(f'SecantusDB did not answer a ping within {timeout} s:\n{_tail(self.log)}')
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop the server and wait until it has exited and its port is closed. SIGTERM (default) is a
        clean shutdown, about 4 s; SIGKILL is a crash, and the next start recovers from the WiredTiger log."""
        process = self.process
        assert process is not None and self.running, 'not running'
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f'SecantusDB (pid {process.pid}) still running {timeout} s after {sig.name}') from None
        deadline = time.monotonic() + timeout
        while _port_open(self.port):
            if time.monotonic() > deadline:
                raise TimeoutError(f'port {self.port} still open {timeout} s after SecantusDB exited')
            time.sleep(0.05)

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """`stop(sig)`, then `start()`: the same port, the same storage."""
        self.stop(sig)
        self.start()

    def close(self) -> None:
        """Kill the server if it runs (its storage is thrown away) and delete it all."""
        if self.process is not None and self.running:
            self.process.kill()
            self.process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)
