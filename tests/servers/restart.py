"""Stop, start and restart the live PostgreSQL and SecantusDB servers that `scripts/services.sh`
started, on the same port and the same data, for failure tests.

Everything comes from the variables `scripts/services.sh start` exports (see its header); without
them these functions skip the calling test (fail under CI=true), like `tests.conftest.require_env`.

The servers are shared by the whole run: a test that stops one must start it again before it ends
(use try/finally), and such tests must not run in parallel with other server tests (no xdist
worker split across them).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from urllib.parse import urlsplit

import pymongo
from pymongo.errors import PyMongoError

from tests.conftest import require_env

# PostgreSQL refuses to run as root; scripts/services.sh made the `postgres` user own the cluster.
POSTGRES_OS_USER = 'postgres'


# ---------------------------------------------------------------- PostgreSQL


def _pg_ctl(*args: str) -> None:
    env = require_env('TEST_POSTGRES_PGCTL', 'TEST_POSTGRES_DATA', 'TEST_POSTGRES_LOG')
    cmd = [env['TEST_POSTGRES_PGCTL'], '-D', env['TEST_POSTGRES_DATA'], *args]
    if os.geteuid() == 0:
        cmd = ['runuser', '-u', POSTGRES_OS_USER, '--', *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f'{shlex.join(cmd)} failed ({done.returncode}): {done.stdout}{done.stderr}')


def stop_postgres(mode: str = 'fast') -> None:
    """Stop the server and wait until it is down. `mode`: `smart`, `fast` (default: roll back open
    transactions, close connections, checkpoint) or `immediate` (no checkpoint: the next start runs
    crash recovery, as after a power cut of the server process)."""
    _pg_ctl('stop', '-m', mode, '-w', '-t', '60')


def start_postgres() -> None:
    """Start the server on the same port and data directory (its settings are in postgresql.conf)
    and wait until it accepts connections."""
    log = require_env('TEST_POSTGRES_LOG')['TEST_POSTGRES_LOG']
    _pg_ctl('start', '-w', '-t', '60', '-l', log)


def restart_postgres(mode: str = 'fast') -> None:
    """Stop the server (see `stop_postgres` for `mode`) and start it again on the same port and data."""
    stop_postgres(mode)
    start_postgres()


# ---------------------------------------------------------------- SecantusDB (MongoDB wire protocol)


def _mongo_env() -> dict[str, str]:
    return require_env('TEST_MONGODB_URL', 'TEST_MONGODB_CMD', 'TEST_MONGODB_PIDFILE', 'TEST_MONGODB_LOG')


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent to reap it has exited all the same
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return True


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_mongodb(sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> None:
    """Stop the server and wait until it has exited and its port is closed. SIGTERM (default) is a
    clean shutdown, about 4 s; SIGKILL is a crash, and the next start recovers from the WiredTiger log."""
    env = _mongo_env()
    pidfile = env['TEST_MONGODB_PIDFILE']
    with open(pidfile) as f:
        pid = int(f.read().strip())
    os.kill(pid, sig)
    port = _port_of(env['TEST_MONGODB_URL'])
    deadline = time.monotonic() + timeout
    while _alive(pid) or _port_open(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f'SecantusDB (pid {pid}) still running {timeout} s after {sig.name}')
        time.sleep(0.05)
    os.unlink(pidfile)


def start_mongodb(timeout: float = 60) -> None:
    """Start the server with the exact command line `scripts/services.sh` used (same port, same
    storage), record its PID where `services.sh stop` looks for it, and wait for a real ping."""
    env = _mongo_env()
    argv = shlex.split(env['TEST_MONGODB_CMD'])
    # Detached like services.sh's `spawn`: its own session, output appended to the same log, and not
    # a child of this process (the shell exits at once), so pytest never waits for it.
    launch = 'setsid "$@" >>"$STEPS_LOG" 2>&1 </dev/null & echo $!'
    done = subprocess.run(
        ['sh', '-c', launch, 'sh', *argv],
        env={**os.environ, 'STEPS_LOG': env['TEST_MONGODB_LOG']},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pid = int(done.stdout.strip())
    with open(env['TEST_MONGODB_PIDFILE'], 'w') as f:
        f.write(f'{pid}\n')
    deadline = time.monotonic() + timeout
    while True:
        try:
            with pymongo.MongoClient(env['TEST_MONGODB_URL'], serverSelectionTimeoutMS=500) as client:
                if client.admin.command('ping').get('ok') == 1:
                    return
        except PyMongoError:
            pass
        if not _alive(pid):
            raise RuntimeError(f'SecantusDB exited during start; see {env["TEST_MONGODB_LOG"]}')
        if time.monotonic() > deadline:
            raise TimeoutError(f'SecantusDB did not answer a ping within {timeout} s')
        time.sleep(0.1)


def restart_mongodb(sig: signal.Signals = signal.SIGTERM) -> None:
    """Stop the server (see `stop_mongodb` for `sig`) and start it again on the same port and storage."""
    stop_mongodb(sig)
    start_mongodb()
