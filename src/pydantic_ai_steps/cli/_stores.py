"""The store a command names: resolved through the one registry (`store.registry`), opened without
creating anything, and checked to be a step store before a command reads it."""

from __future__ import annotations

import anyio

from .._errors import StoreUnavailableError, sqlstate
from ..media._protocol import MediaStore
from ..store.backend import Probe
from ..store.maintenance import CollectableMediaStore
from ..store.protocol import ManagedStepStore
from ..store.registry import StoreLocation, StoreUrlError, resolve, schemes_help
from ._errors import CliError

__all__ = ['STORE_VARIABLE', 'locate', 'media_blob_count', 'open_existing', 'schemes_help', 'unreachable']

STORE_VARIABLE = 'PYDANTIC_AI_STEPS_STORE'
"""The environment variable naming the store a command reads when `--store` is not given."""
PROBE_SECONDS = 10.0
"""How long a command waits for a server store's first answer. A driver's own wait is longer (pymongo
selects a server for 30 s, riding out a replica-set election): right for a worker, not for a person
at a terminal asking about a server that is down."""


def locate(value: str) -> StoreLocation:
    """Parse a `--store` value, as the CLI's error if it names nothing."""
    try:
        return resolve(value)
    except StoreUrlError as error:
        raise CliError(str(error)) from None


async def open_existing(value: str) -> tuple[StoreLocation, ManagedStepStore]:
    """Open a store that must already exist: inspecting never creates one, nor writes into anything."""
    location = locate(value)
    try:
        store = location.open()
    except StoreUrlError as error:
        raise CliError(str(error)) from None
    probe: Probe | None = None
    try:
        with anyio.move_on_after(PROBE_SECONDS):  # not `fail_after`: a driver's own TimeoutError says more
            probe = await store.probe()
    except BaseException as error:
        await store.aclose()
        if isinstance(error, StoreUrlError):  # what the driver found wrong with the URL when it used it
            raise CliError(f'cannot open the store at {location.url}: {error}') from None
        no = refusal(error)
        if no is not None:
            raise CliError(f'cannot open the store at {location.url}: the server refused: {no}') from None
        reason = unreachable(error)
        if reason is not None:
            raise CliError(f'cannot reach the store at {location.url}: {reason}') from None
        raise
    if probe is None:
        await store.aclose()
        raise CliError(f'the store at {location.url} did not answer within {PROBE_SECONDS:g} s')
    if not probe.exists:
        await store.aclose()
        raise CliError(f'no store at {location.url}' + (f' ({probe.detail})' if probe.detail else ''))
    if not probe.readable:
        await store.aclose()
        raise CliError(f'cannot read the store at {location.url}: {probe.detail}')
    if not probe.step_store:
        await store.aclose()
        raise CliError(f'{location.url} is not a step store: {probe.detail}')
    return location, store


REFUSALS = frozenset({'3D000', '28000', '28P01'})
"""SQLSTATEs of a PostgreSQL server that answered and said no: no such database, no such role (or
no `pg_hba.conf` entry), a wrong password. Permanent, so the driver's error stays what a program
sees; the CLI says it in one line."""
MONGO_REFUSALS = frozenset({13, 18})
"""MongoDB's `Unauthorized` and `AuthenticationFailed` codes."""


def refusal(error: BaseException) -> str | None:
    """What a server that answered and refused said (its message only: pymongo's goes on with the
    whole reply), or `None` for any other error."""
    if sqlstate(error) in REFUSALS:
        return str(error)
    try:
        from pymongo.errors import OperationFailure
    except ImportError:  # pragma: no cover - the mongodb extra is not installed
        return None
    if isinstance(error, OperationFailure) and error.code in MONGO_REFUSALS:
        return str(error).split(', full error:', 1)[0]
    return None


def unreachable(error: BaseException) -> str | None:
    """What a driver said when the server could not be reached (its first clause only: pymongo's
    message goes on with the whole topology), or `None` for any other error."""
    if isinstance(error, StoreUnavailableError):
        return str(error)
    try:
        from pymongo.errors import ConnectionFailure

        from .._mongo import driver_said
    except ImportError:  # pragma: no cover - the mongodb extra is not installed
        return None
    if isinstance(error, ConnectionFailure):
        return driver_said(error)
    return None


async def media_blob_count(media: MediaStore | None) -> int | None:
    """How many blobs a store's media store holds (`None`: it cannot list them)."""
    if media is None:
        return 0
    if not isinstance(media, CollectableMediaStore):
        return None
    count = 0
    async for _ in media.list_blobs():
        count += 1
    return count
