"""`MongoStepStore`: every record in one MongoDB database, on pymongo's `AsyncMongoClient`.

Collections and indexes: see `_layout` (the seed's `runs`, `events`, `snapshots`, `tool_effects`
and `counters`, plus the runs' `message_log`); how one write stays correct without transactions in
two round trips: see `_backend` (the documents it sends, built and checked first: `_plan`); the
upstream package's layouts it still reads: see `_legacy`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from ...._mongo import ClientHandle, MongoClient, check_database_name, url_problem
from ....media._protocol import MediaStore
from ...base import StepStoreBase
from ...registry import StoreLocation, StoreUrlError
from ._backend import MAX_TEXT_BYTES, MongoBackend

__all__ = ['MAX_TEXT_BYTES', 'MongoStepStore', 'open_location']


class MongoStepStore(StepStoreBase):
    """A `StepStore` in a MongoDB database (MongoDB 5.0 or later; one client-level `bulkWrite` per write on 8.0+).

    ```python
    from pydantic_ai_steps.step_persistence import MongoStepStore

    store = MongoStepStore(db_url='mongodb://localhost:27017', database='agents')
    ```

    Give exactly one of `client=` (a pymongo `AsyncMongoClient`: yours to close) or `db_url=` (the
    store opens its own client, and `aclose()` or leaving `async with store:` closes it). The first
    write creates the collections' indexes (so the user needs the privilege to) and records the
    layout version; reads never create anything.

    Payloads of `media_threshold_bytes` or more go to `media_store`: by default a `MongoMediaStore`
    on the same client and database (collections `media` and `media_chunks`); `None` keeps them
    inline. Each message version is one document of the message log, so a history of any length
    fits; a single message whose text would pass MongoDB's 16 MiB document limit has its payloads
    moved to the media store whatever their size, and a record that still cannot fit raises
    `RecordTooLargeError` naming it before anything is written. `RunRecord.metadata` and
    `StepEvent.metadata` are nested documents: keys with `.` or a leading `$` need MongoDB 5.0+; a
    key with a NUL byte raises `InvalidRecordError`.

    What survives what: a write that returned is acknowledged with the client's write concern
    (`w=majority` in a `mongodb://...?w=majority` URL makes it survive a primary's loss). A write cut
    short by a crash or a lost connection leaves nothing a read sees (see `_backend`); the driver's
    retryable writes (on by default, replica sets only) retry it once after a network error.
    """

    def __init__(
        self,
        client: MongoClient | None = None,
        *,
        db_url: str | None = None,
        database: str,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        max_run_age: timedelta | None = None,
    ) -> None:
        handle = ClientHandle(client, db_url, 'MongoStepStore')
        name = check_database_name(database, 'MongoStepStore')
        owned = media_store == 'auto'
        if media_store == 'auto':
            from ....media.stores.mongo import MongoMediaStore

            media_store = MongoMediaStore.sharing(handle, database=name)
        super().__init__(
            MongoBackend(handle, name),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            max_run_age=max_run_age,
            owns_media_store=owned,
        )
        self._handle = handle
        self._database = name

    @property
    def database(self) -> str:
        """The name of the database this store writes in."""
        return self._database

    def __repr__(self) -> str:
        return (
            f'MongoStepStore({self._handle.describe()}, database={self._database!r}, '
            f'max_snapshots_per_run={self.max_snapshots_per_run}, media_store={self.media_store!r})'
        )


def open_location(location: StoreLocation, **options: Any) -> MongoStepStore:
    """The store a `mongodb://host:port/database` URL names (the registry's `mongodb:` scheme).

    The database is the URL's path; the rest of the URL (credentials, `?replicaSet=...`,
    `authSource=...`) goes to pymongo as it is.
    """
    path = urlsplit(location.target).path
    database = unquote(path[1:]) if path.startswith('/') else ''
    if not database:
        raise StoreUrlError(f'{location.url} names no database: put it in the path, as in mongodb://host:27017/agents')
    try:
        check_database_name(database, 'a mongodb: store URL')
    except ValueError as error:
        raise StoreUrlError(f'{location.url}: {error}') from None
    problem = url_problem(location.target)
    if problem is not None:
        raise StoreUrlError(f'bad mongodb store URL {location.url!r}: {problem}') from None
    return MongoStepStore(db_url=location.target, database=database, **options)
