"""MongoDB rules shared by the Mongo step store and the Mongo media store.

- `ClientHandle`: the `AsyncMongoClient` a store talks through, either the caller's (never closed
  here) or one the store opened from `db_url=` and owns. An owned client is created on first use,
  closed by `aclose()`, and opened again by a later call, like the SQLite stores' connections.
  pymongo binds a client to the event loop it is first used on, so an owned client is also closed
  when that loop shuts down (`asyncio.run` and `anyio.run` cancel what is still pending: a task
  waiting for that closes it), and a later call on another loop opens a fresh one. A caller's
  client is the caller's to use on one loop and to close.
- `Writer`: ordered writes to several collections. On MongoDB 8.0 and later one client-level
  `bulkWrite` command carries them all (one round trip); on older servers each run of writes to one
  collection is one `bulk_write` of that collection, in the same order.
- BSON limits, checked before anything is sent: `checked_document` (a document over 16 MiB, a key
  with a NUL byte, an integer beyond 64 bits raise errors naming the record).
- A server that cannot be reached: `reports_unreachable` makes each I/O method of a store raise
  `StoreUnavailableError` (see `ClientHandle.unreachable`), as the PostgreSQL stores do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import ipaddress
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal, NoReturn, SupportsIndex, TypeVar, cast
from urllib.parse import parse_qsl, urlsplit

import bson
from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, ReadPreference, common
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ClientBulkWriteException,
    ConfigurationError,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.operations import DeleteMany, InsertOne, UpdateMany, UpdateOne
from pymongo.uri_parser import parse_uri, split_options

from ._errors import InvalidRecordError, RecordTooLargeError, StoreUnavailableError, StoreUrlError
from ._urls import redacted_url

Document = dict[str, Any]
MongoClient = AsyncMongoClient[Document]

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""MongoDB's BSON document limit (`maxBsonObjectSize`): no write sends a larger document."""
CODEC = CodecOptions[Document](document_class=dict, tz_aware=True, tzinfo=UTC)
"""How the stores read documents whatever the caller's client is set to: plain dicts, aware UTC times."""
DUPLICATE_KEY = 11000
_DATABASE_FORBIDDEN = re.compile(r'[/\\. "$*<>:|?\x00]')


def check_database_name(database: object, owner: str) -> str:
    if not isinstance(database, str) or not database:
        raise ValueError(f'{owner} needs database= (the name of a MongoDB database), got {database!r}')
    bad = _DATABASE_FORBIDDEN.search(database)
    if bad is not None or len(database.encode()) > 63:
        why = f'it contains {bad.group()!r}' if bad is not None else 'it is longer than 63 bytes'
        raise ValueError(f'invalid MongoDB database name {database!r}: {why}')
    return database


def url_problem(db_url: str) -> str | None:
    """What pymongo finds wrong with a MongoDB URL (never the URL itself: it may hold a password), or
    `None`. Everything found without a server: what the store's client finds when it is made
    (`new_client`: the credentials a mechanism needs, a TLS file it cannot read), an unknown or
    invalid option (the client only warns of one), and a `mongodb+srv://` host that is an IP address
    (which pymongo finds only at the first call, when it would look up the name's DNS records)."""
    scheme, _, rest = db_url.partition('://')
    try:
        if scheme == 'mongodb':
            parse_uri(db_url)
        else:  # an SRV URL: its options checked as above, its hosts by the client, its DNS lookup later
            query = rest.partition('?')[2]
            if query:
                split_options(query, validate=True, warn=False)
        client = new_client(db_url)
        host = next(iter(client.topology_description.server_descriptions()), ('', None))[0]
        if scheme == 'mongodb+srv' and _is_ip_address(host):
            return (
                'a mongodb+srv:// URL names a host whose DNS records list the servers, not an IP address; '
                'to name the server itself, use mongodb://'
            )
    except (PyMongoError, ValueError, OSError, TypeError) as error:  # OSError: a TLS file it cannot read
        said = str(error)
        unknown = _unknown_options(db_url) if said.startswith('Unknown option') else []
        return f'unknown option {", ".join(map(repr, unknown))}: {said}' if unknown else said  # pymongo names none
    return None


def new_client(db_url: str) -> MongoClient:
    """The client a store opens from `db_url` (it connects at its first call)."""
    return AsyncMongoClient(db_url, tz_aware=True, appname='pydantic-ai-steps')


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _unknown_options(db_url: str) -> list[str]:
    known = {*common.URI_OPTIONS_VALIDATOR_MAP, *common.URI_OPTIONS_ALIAS_MAP, *common.URI_OPTIONS_DEPRECATION_MAP}
    query = urlsplit(db_url).query
    pairs = parse_qsl(query.replace(';', '&'), keep_blank_values=True)  # pymongo takes either separator
    return [name for name, _ in pairs if name.lower() not in known]


class ClientHandle:
    """The caller's `AsyncMongoClient`, or one opened from a URL and owned (see the module docs)."""

    def __init__(self, client: MongoClient | None, db_url: str | None, owner: str) -> None:
        if (client is None) == (db_url is None):
            raise ValueError(
                f'{owner} needs exactly one of client= (an AsyncMongoClient you own) or db_url= '
                '(a mongodb:// URL; the store then owns its client and aclose() closes it)'
            )
        if client is not None and not isinstance(client, AsyncMongoClient):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f'{owner} client= must be a pymongo AsyncMongoClient, got {type(client).__name__}')
        url = cast(object, db_url)
        if url is not None and (not isinstance(url, str) or not url.startswith(('mongodb://', 'mongodb+srv://'))):
            shown = redacted_url(url) if isinstance(url, str) else repr(url)
            raise StoreUrlError(f'{owner} db_url= must be a mongodb:// or mongodb+srv:// URL, got {shown}')
        problem = None if db_url is None else url_problem(db_url)
        if db_url is not None and problem is not None:
            raise StoreUrlError(f'{owner} db_url={redacted_url(db_url)!r} is not a usable URL: {problem}') from None
        self._client = client
        self._url = db_url
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: asyncio.Task[None] | None = None

    @property
    def owned(self) -> bool:
        return self._url is not None

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(
            'a MongoDB store cannot be pickled or copied: it holds a client and, built from db_url=, the '
            "URL's credentials, which must not be written into a pickle; build a new store where another is needed"
        )

    def describe(self) -> str:
        """How a repr names the connection: the URL without its password, or `client=<caller-owned>`."""
        return f'db_url={redacted_url(self._url)!r}' if self._url is not None else 'client=<caller-owned>'

    def unreachable(self, error: BaseException) -> StoreUnavailableError | None:
        """`StoreUnavailableError` naming the server (never the password) if `error` says it could not be
        reached, else `None` (see `nothing_reached`)."""
        if not nothing_reached(error):
            return None
        if self._url is not None:
            where = f'named by db_url={redacted_url(self._url)!r}'
        else:
            known = self._client.topology_description.server_descriptions() if self._client is not None else {}
            where = f'of client= ({", ".join(f"{host}:{port}" for host, port in known)})'
        return StoreUnavailableError(f'the MongoDB server {where} could not be reached: {driver_said(error)}')

    def get(self) -> MongoClient:
        """The client to use now, on the running event loop."""
        if self._url is None:
            assert self._client is not None
            return self._client
        loop = asyncio.get_running_loop()
        if self._client is None or (self._loop is not loop and (self._loop is None or self._loop.is_closed())):
            opened = new_client(self._url)
            self._client, self._loop = opened, loop
            self._closer = loop.create_task(
                _close_when_cancelled(opened), name='pydantic-ai-steps: close MongoDB client'
            )
            return opened
        return self._client

    def database(self, name: str) -> AsyncDatabase[Document]:
        return self.get().get_database(name, codec_options=CODEC, read_preference=ReadPreference.PRIMARY)

    async def aclose(self) -> None:
        """Close an owned client (a later call opens a new one); a caller's client is left alone."""
        closer, self._closer = self._closer, None
        if self._url is None or closer is None:
            return
        self._client = None
        if closer.get_loop() is asyncio.get_running_loop():
            closer.cancel()  # it closes the client
            with contextlib.suppress(asyncio.CancelledError):
                await closer


async def _close_when_cancelled(client: MongoClient) -> None:
    """Wait until cancelled (by `aclose()`, or by the event loop shutting down), then close `client`."""
    try:
        await asyncio.Event().wait()
    finally:
        await client.close()


def nothing_reached(error: BaseException) -> bool:
    """Whether pymongo's `error` says no server could be reached, so nothing of the operation was sent.

    - `ServerSelectionTimeoutError`: no server answered within `serverSelectionTimeoutMS` (refused,
      unknown host, down). pymongo raises it only when no attempt of the operation went out: a retry
      that cannot select a server raises the first attempt's error instead.
    - A `ConnectionFailure` caused by `ConnectionRefusedError`: opening a new connection was refused.
    - A `ConfigurationError` caused by the DNS lookup of a `mongodb+srv://` host (no such name, no
      answer in time): PostgreSQL's stores report an unknown host the same way.

    A connection lost or timing out during a command (`AutoReconnect`, `NetworkTimeout`) stays
    pymongo's error: the server may have applied the command, as with the PostgreSQL stores, where
    a connection lost mid-statement stays the driver's error.
    """
    cause = error.__cause__
    if isinstance(error, ServerSelectionTimeoutError):
        return True
    if isinstance(error, AutoReconnect):
        return isinstance(cause, ConnectionRefusedError)
    return isinstance(error, ConfigurationError) and type(cause).__module__.startswith('dns.')


def driver_said(error: BaseException) -> str:
    """pymongo's message without what it appends: the configured timeouts and the whole topology."""
    return str(error).split(' (configured timeouts', 1)[0].split(', Timeout:', 1)[0]


_C = TypeVar('_C', bound=type)


def reports_unreachable(handle_attribute: str) -> Callable[[_C], _C]:
    """A class decorator: each public async method and async generator of the class raises
    `StoreUnavailableError` (chained from pymongo's error) where its server could not be reached.
    `handle_attribute` names the instance's `ClientHandle`. One rule for every call, not a `try` each."""

    def decorate(cls: _C) -> _C:
        for name, member in list(vars(cls).items()):
            if name.startswith('_'):
                continue
            if inspect.iscoroutinefunction(member):
                setattr(cls, name, _reporting_coroutine(member, handle_attribute))
            elif inspect.isasyncgenfunction(member):
                setattr(cls, name, _reporting_generator(member, handle_attribute))
        return cls

    return decorate


def _reporting_coroutine(method: Callable[..., Awaitable[Any]], attribute: str) -> object:
    @functools.wraps(method)
    async def reporting(self: object, *args: Any, **kwargs: Any) -> Any:
        with _unreachable_reported(self, attribute):
            return await method(self, *args, **kwargs)

    return reporting


def _reporting_generator(method: Callable[..., AsyncGenerator[Any, None]], attribute: str) -> object:
    @functools.wraps(method)
    async def reporting(self: object, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        with _unreachable_reported(self, attribute):
            async with contextlib.aclosing(method(self, *args, **kwargs)) as items:
                async for item in items:
                    yield item

    return reporting


@contextlib.contextmanager
def _unreachable_reported(owner: object, attribute: str) -> Generator[None]:
    """pymongo's error, as `StoreUnavailableError` where the server of `owner`'s handle could not be reached."""
    try:
        yield
    except PyMongoError as error:
        unavailable = cast(ClientHandle, getattr(owner, attribute)).unreachable(error)
        if unavailable is None:
            raise
        raise unavailable from error


def collection(database: AsyncDatabase[Document], name: str) -> AsyncCollection[Document]:
    return database.get_collection(name, codec_options=CODEC, read_preference=ReadPreference.PRIMARY)


# --- writes to several collections, in order ---------------------------------------------------------

Role = Literal[
    'register', 'reset', 'append', 'snapshot', 'effect', 'event', 'closing', 'guard', 'chunk', 'manifest', 'delete'
]


@dataclass(frozen=True, slots=True)
class Write:
    """One write of an ordered batch: its collection, the operation, and what it is for (`role`)."""

    collection: str
    kind: Literal['insert', 'update', 'update_many', 'delete_many']
    document: Document
    """The document to insert, or the filter of an update or delete."""
    update: Document | None = None
    upsert: bool = False
    role: Role = 'delete'
    run_id: str | None = None

    def model(self, namespace: str | None = None) -> Any:
        """The pymongo operation (with its `namespace` for a client-level bulk write)."""
        if self.kind == 'insert':
            return InsertOne(self.document, namespace=namespace)
        if self.kind == 'delete_many':
            return DeleteMany(self.document, namespace=namespace)
        assert self.update is not None
        if self.kind == 'update':
            return UpdateOne(self.document, self.update, upsert=self.upsert, namespace=namespace)
        return UpdateMany(self.document, self.update, upsert=self.upsert, namespace=namespace)


class WriteFailed(Exception):
    """Write `index` of a batch failed with `code`; the writes before it were applied, none after it."""

    def __init__(self, index: int, code: int | None, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.code = code


@dataclass
class Writer:
    """Sends ordered writes: one client `bulkWrite` on MongoDB 8.0+, one `bulk_write` per collection before."""

    handle: ClientHandle
    database: str
    client_bulk: bool | None = None
    """`None` until the server is known; `False` on servers before 8.0 (or when forced, for tests)."""

    async def apply(self, writes: Sequence[Write]) -> None:
        """Apply `writes` in order, stopping at the first that fails (`WriteFailed`)."""
        if not writes:
            return
        if self.client_bulk is not False:
            try:
                await self._client_bulk(writes)
                self.client_bulk = True
                return
            except InvalidOperation as error:
                if self.client_bulk or '8.0' not in str(error):
                    raise
                self.client_bulk = False  # a server before 8.0: no client-level bulkWrite
        await self._per_collection(writes)

    async def _client_bulk(self, writes: Sequence[Write]) -> None:
        namespace = f'{self.database}.'
        models: list[Any] = [write.model(namespace + write.collection) for write in writes]
        try:
            client: Any = self.handle.get()
            await client.bulk_write(models, ordered=True)
        except ClientBulkWriteException as error:
            if error.error is not None:
                cause = error.error
                raise cause if isinstance(cause, BaseException) else OperationFailure(str(cause)) from None
            failed = _first_error(error.write_errors)
            if failed is None:
                raise
            raise WriteFailed(int(failed.get('idx', 0)), _code(failed), str(failed.get('errmsg', ''))) from None

    async def _per_collection(self, writes: Sequence[Write]) -> None:
        database = self.handle.database(self.database)
        start = 0
        while start < len(writes):
            end = start
            while end < len(writes) and writes[end].collection == writes[start].collection:
                end += 1
            target = collection(database, writes[start].collection)
            try:
                await target.bulk_write([write.model() for write in writes[start:end]], ordered=True)
            except BulkWriteError as error:
                failed = _first_error(error.details.get('writeErrors'))
                if failed is None:
                    raise
                index = start + int(failed.get('index', 0))
                raise WriteFailed(index, _code(failed), str(failed.get('errmsg', ''))) from None
            start = end


def _first_error(errors: object) -> Mapping[str, Any] | None:
    if isinstance(errors, list) and errors and isinstance(errors[0], Mapping):
        return errors[0]  # pyright: ignore[reportUnknownVariableType]
    return None


def _code(failed: Mapping[str, Any]) -> int | None:
    code = failed.get('code')
    return code if isinstance(code, int) else None


# --- BSON limits -------------------------------------------------------------------------------------


def checked_document(document: Mapping[str, Any], what: str, *, limit: int = MAX_DOCUMENT_BYTES) -> int:
    """The document's BSON size; raises naming `what` if MongoDB cannot store it, before anything is sent.

    A key with a NUL byte (BSON keys are C strings), an integer beyond 64 bits and text that is not
    valid Unicode raise `InvalidRecordError`; a document over 16 MiB raises `RecordTooLargeError`.
    """
    bad_key = _nul_key(document, 0)
    if bad_key is not None:
        raise InvalidRecordError(
            f'{what} has the key {bad_key!r}, which holds a NUL byte: MongoDB field names cannot contain one'
        )
    try:
        size = len(bson.encode(document))
    except OverflowError as error:
        raise InvalidRecordError(f'{what} holds an integer MongoDB cannot store (64 bits at most): {error}') from None
    except (bson.InvalidDocument, UnicodeError) as error:
        raise InvalidRecordError(f'{what} cannot be stored in MongoDB: {error}') from None
    if size > limit:
        raise RecordTooLargeError(
            f'{what} is {size} bytes as a BSON document; MongoDB stores documents of at most {limit} bytes '
            '(16 MiB): nothing was written'
        )
    return size


def _nul_key(value: object, depth: int) -> str | None:
    if depth > 100:
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
            if isinstance(key, str) and '\x00' in key:
                return key
            found = _nul_key(item, depth + 1)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for item in value:  # pyright: ignore[reportUnknownVariableType]
            found = _nul_key(item, depth + 1)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    return None


def is_duplicate(error: PyMongoError) -> bool:
    return isinstance(error, OperationFailure) and error.code == DUPLICATE_KEY


__all__ = [
    'CODEC',
    'DUPLICATE_KEY',
    'MAX_DOCUMENT_BYTES',
    'ClientHandle',
    'Document',
    'MongoClient',
    'Write',
    'WriteFailed',
    'Writer',
    'check_database_name',
    'checked_document',
    'collection',
    'driver_said',
    'is_duplicate',
    'nothing_reached',
    'reports_unreachable',
]
