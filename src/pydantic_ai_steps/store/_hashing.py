"""Hashing `BinaryContent` payloads once per object, off the event loop when they are large."""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from pydantic_ai.messages import BinaryContent


class HashedBinaries:
    """The sha256 digest and pydantic-ai identifier of `BinaryContent` objects seen before.

    A history carries the same `BinaryContent` objects from run to run (`message_history=`), and
    each new run's first snapshot serializes every message again; hashing a large payload twice
    (sha256 for its address, sha1 for pydantic-ai's `identifier`) costs more than the rest of the
    snapshot. Entries are keyed by object identity, hold the object weakly (an entry leaves with
    its object), and are used only while the object still holds the same `data`.

    A payload of `OFF_LOOP_HASH_BYTES` or more is hashed on worker threads, both hashes side by
    side (`hashlib` releases the GIL), so the event loop keeps serving other runs meanwhile: about
    1.6 ms of hashing per MiB would otherwise stall it.
    """

    def __init__(self) -> None:
        self._entries: dict[int, _HashedBinary] = {}

    async def digest_and_identifier(self, binary: BinaryContent) -> tuple[bytes, str]:
        """`sha256(binary.data)` and `binary.identifier`, each computed once per object and data."""
        key = id(binary)
        entry = self._entries.get(key)
        explicit = binary._identifier  # pyright: ignore[reportPrivateUsage]
        if entry is None or entry.ref() is not binary or entry.data is not binary.data:
            entries = self._entries

            def forget(_: object, key: int = key) -> None:
                entries.pop(key, None)

            data = binary.data
            if len(data) >= OFF_LOOP_HASH_BYTES:
                digest, identifier = await _hash_off_loop(binary, derive_identifier=not explicit)
            else:
                digest, identifier = hashlib.sha256(data).digest(), None
            entry = _HashedBinary(weakref.ref(binary, forget), data, digest, identifier)
            entries[key] = entry
        if explicit:
            return entry.digest, explicit
        if entry.identifier is None:
            entry.identifier = binary.identifier  # derived from the data: a hash of its own
        return entry.digest, entry.identifier


OFF_LOOP_HASH_BYTES = 1 << 20
"""`BinaryContent` payloads at least this large are hashed on worker threads (see `_HashedBinaries`)."""


async def _hash_off_loop(binary: BinaryContent, *, derive_identifier: bool) -> tuple[bytes, str | None]:
    """sha256 of `binary.data` and, if asked, `binary.identifier`, on two worker threads at once."""
    data = binary.data
    results: dict[str, Any] = {}

    async def digest() -> None:
        results['digest'] = await anyio.to_thread.run_sync(_sha256_digest, data)

    async def identifier() -> None:
        results['identifier'] = await anyio.to_thread.run_sync(_identifier_of, binary)

    async with anyio.create_task_group() as group:
        group.start_soon(digest)
        if derive_identifier:
            group.start_soon(identifier)
    return results['digest'], results.get('identifier')


def _sha256_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass
class _HashedBinary:
    ref: weakref.ref[BinaryContent]
    data: bytes
    digest: bytes
    identifier: str | None = None
    """`binary.identifier` as derived from `data` (when the object sets none of its own)."""


def _identifier_of(binary: BinaryContent) -> str:
    return binary.identifier
