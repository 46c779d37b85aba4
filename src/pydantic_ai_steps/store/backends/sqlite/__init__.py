"""`SqliteStepStore`: every record in one SQLite database, WAL mode, one connection per store.

Tables (SPEC section 4, plus what message-once storage and migrations need; see `_schema`):

- `runs` (`run_id` primary key), indexed for every `list_runs` filter and order;
- `events` (`seq` the rowid: AUTOINCREMENT in databases created before version 3), unique on
  `(run_id, idempotency_key)`, its one index (a database the upstream package created keeps that
  package's two instead, which do the same work);
- `snapshots` (`seq` AUTOINCREMENT, `state`, `message_count`, `log_size`): a row names its history
  by two numbers; `messages` (`run_id`, `log_index`, `position`, `message`) is the run's message
  log, written once per message version. Rows of older layouts (the history inline, or the
  upstream package's `snapshot_messages` / `snapshot_message_refs`) still read (`_legacy`);
- `snapshot_idempotency_keys` (applied snapshot keys; they outlive pruning), `tool_effects`
  (primary key `(run_id, tool_call_id)`, upserted), `schema_version`.
"""

from __future__ import annotations

import os
import sqlite3
from datetime import timedelta
from typing import Literal

from ...._errors import check_bool
from ...._sqlite import database_file, database_path, require_cross_thread_use
from ....media._protocol import MediaStore
from ...base import StepStoreBase
from ._backend import SqliteBackend

__all__ = ['SqliteStepStore']


class SqliteStepStore(StepStoreBase):
    """A `StepStore` in a SQLite database file (or a connection you already have).

    ```python
    from pydantic_ai_steps.step_persistence import SqliteStepStore

    store = SqliteStepStore(database='runs.db', max_snapshots_per_run=8)
    ```

    Give exactly one of `database=` (a path, a relative one taken from the working directory when the
    store is made; the store opens and owns one connection, lazily, on a worker thread; a call that
    cannot wait for a lock then runs right on the event loop, any other on a worker) or `connection=`
    (a `sqlite3.Connection` that must be opened with `check_same_thread=False`, because store calls run
    on worker threads; the caller owns and closes it). On a shared connection each write is its own
    `BEGIN IMMEDIATE` transaction, committed at once; if you have a transaction open, the write goes in
    a savepoint inside it and commits with yours. Calls through this store are serialized, but other
    users of a shared connection must not run statements on it at the same time.

    Payloads of `media_threshold_bytes` or more go to `media_store`: by default a
    `SqliteMediaStore` on the same database (table `media`), through a connection of its own
    (except for an in-memory database, which only the given connection can reach); `None` keeps
    them inline.

    What survives what: WAL mode is switched on (for a shared connection too). With
    `durable=False` (`synchronous=NORMAL`) a committed call survives a crash of the process, and
    a power loss can roll back the last transactions but never corrupts the database. With
    `durable=True` (`synchronous=FULL`) every commit is flushed to disk before the call returns,
    so it survives power loss as well. A new database file is created readable by its owner only.
    The database is migrated to this release's layout by the first write, never by a read. A
    database with tables of these names that are another application's (a `runs` table of its
    own, say) is refused with `NotAStoreError` before anything in it changes.
    """

    def __init__(
        self,
        *,
        database: str | os.PathLike[str] | None = None,
        connection: sqlite3.Connection | None = None,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        durable: bool = False,
        max_run_age: timedelta | None = None,
    ) -> None:
        if (database is None) == (connection is None):
            raise ValueError(
                'SqliteStepStore needs exactly one of database= (a path the store opens itself) or '
                f'connection= (an open sqlite3.Connection); got database={database!r}, connection={connection!r}'
            )
        check_bool(durable, 'durable')
        if connection is not None:
            require_cross_thread_use(connection, 'SqliteStepStore')
        path = database_path(database, 'SqliteStepStore') if database is not None else None
        backend = SqliteBackend(database=path, connection=connection, durable=durable)
        owned = media_store == 'auto'
        if media_store == 'auto':
            from ....media.stores.sqlite import SqliteMediaStore
            from ._media import OwnMediaStore

            # Same database, own connection: the media store serializes its calls with its own lock,
            # so on a shared connection its commit could land inside this store's transaction.
            file = path if path is not None else database_file(connection)
            if file is not None:
                media_store = OwnMediaStore(database=file, durable=durable)
            else:  # an in-memory database exists only on that connection: both stores take turns on it
                media_store = SqliteMediaStore(connection=connection, durable=durable, lock=backend.lock)
        super().__init__(
            backend,
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            max_run_age=max_run_age,
            owns_media_store=owned,
        )
        self.durable = durable
        self._database = path

    @property
    def database(self) -> str | None:
        """The database path this store opened (`None` for a caller's connection)."""
        return self._database

    def __repr__(self) -> str:
        where = f'database={self._database!r}' if self._database is not None else 'connection=<caller-owned>'
        return (
            f'SqliteStepStore({where}, max_snapshots_per_run={self.max_snapshots_per_run}, '
            f'media_store={self.media_store!r}, durable={self.durable})'
        )

    def close(self) -> None:
        """Close the connections this store opened (its own and its default media store's).

        A later call reopens them. `aclose()` does the same without blocking the event loop.
        """
        backend = self.backend
        assert isinstance(backend, SqliteBackend)
        backend.close()
        if self._owns_media:
            close = getattr(self.media_store, 'close', None)
            if callable(close):
                close()
