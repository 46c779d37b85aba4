"""SQLite rules shared by the SQLite step store and the SQLite media store."""

from __future__ import annotations

import sqlite3
import threading


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
