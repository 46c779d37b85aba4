"""SQLite rules shared by the SQLite step store and the SQLite media store."""

from __future__ import annotations

import sqlite3
import threading
import time


def require_cross_thread_use(connection: sqlite3.Connection, owner: str) -> None:
    """Fail at construction, with the reason, on a connection only its creating thread may use.

    Every store call runs on a worker thread so the event loop never blocks on disk I/O, and
    `sqlite3` refuses such use of a connection opened with the default `check_same_thread=True`,
    but only at its first use, deep inside a run. Probing from another thread now says why.
    """
    failures: list[sqlite3.ProgrammingError] = []

    def probe() -> None:
        try:
            connection.cursor().close()
        except sqlite3.ProgrammingError as error:
            failures.append(error)

    thread = threading.Thread(target=probe, name='pydantic-ai-steps-sqlite-probe', daemon=True)
    thread.start()
    thread.join()
    if not failures:
        return
    error = failures[0]
    if 'thread' in str(error):
        raise ValueError(
            f'{owner}(connection=...) needs a connection opened with sqlite3.connect(..., check_same_thread=False): '
            'the store runs every call on a worker thread so the event loop never blocks on disk I/O, and this '
            'connection may only be used by the thread that created it'
        ) from error
    raise ValueError(f'{owner}(connection=...) cannot use this connection: {error}') from error


def enable_wal(connection: sqlite3.Connection, *, timeout: float = 30.0) -> None:
    """Put the database in WAL mode, waiting out other processes that are opening it too.

    Switching the journal mode needs the database to itself, and SQLite answers `database is
    locked` at once, without its busy handler, when another connection holds it (two processes
    creating one store together do exactly that). A database already in WAL mode needs nothing.
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            if connection.execute('PRAGMA journal_mode').fetchone()[0] != 'wal':
                connection.execute('PRAGMA journal_mode=WAL')
            return
        except sqlite3.OperationalError as error:
            if ('locked' not in str(error) and 'busy' not in str(error)) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
