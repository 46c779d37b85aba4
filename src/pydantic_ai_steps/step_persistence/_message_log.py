"""The pipeline every persistent store shares between a snapshot and its message log.

Writing: find the candidate messages (`HistoryTracker`), serialize only those, drop the ones
whose content is unchanged, move large payloads to the media store, store a changed version as a
patch of the position's previous full text when that is much smaller, and hand the store a list
of `(position, text)` appends. Reading: the store resolves patches (`resolve_history`); then
restore media in the texts that carry markers and rebuild the messages. A store only does I/O
around these two calls; see `_history` for the log layout.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, cast

import anyio
from pydantic_ai.messages import BinaryContent, ModelMessage

from ..media._context import MediaContext
from ..media._protocol import MediaStore
from ..media._uri import parse_media_uri, uri_for_digest
from ..media._walker import externalize_tree, has_markers, might_need_externalizing, restore_media
from ._history import (
    TAIL,
    HistoryDelta,
    HistoryTracker,
    PatchBase,
    content_digest,
    is_patch,
    make_patch,
    message_to_json,
    messages_from_json,
)
from ._records import ContinuableSnapshot, SnapshotState
from .stores._offload import run_blocking

DEFAULT_MEDIA_THRESHOLD = 64 * 1024
logger = logging.getLogger('pydantic_ai_steps')


@dataclass(frozen=True)
class SnapshotMeta:
    """A stored snapshot's fields, apart from its messages."""

    step_index: int
    conversation_id: str | None
    parent_run_id: str | None
    agent_name: str | None
    timestamp: datetime
    state: SnapshotState
    idempotency_key: str | None


_PLACEHOLDER_PREFIX = b'\x00pydantic-ai-steps media placeholder\x00'


STALE: Literal['stale'] = 'stale'
"""A write outcome: another writer extended the run's log since this process last wrote it."""
SUPPRESSED: Literal['suppressed'] = 'suppressed'
"""A write outcome: the snapshot's idempotency key was applied before; nothing was written."""
WriteOutcome = int | Literal['stale', 'suppressed']
"""What a store's write of a `PreparedSnapshot` did: the log size it left, or why it wrote nothing."""


class StoredSnapshot(Protocol):
    """A snapshot as a store found it: its seq, its fields and its messages' stored texts."""

    @property
    def seq(self) -> int: ...

    @property
    def meta(self) -> SnapshotMeta: ...

    @property
    def texts(self) -> list[str]: ...


@dataclass
class PreparedSnapshot:
    """What a store must write for one snapshot, computed before any I/O."""

    snapshot: ContinuableSnapshot
    appends: list[tuple[int, str]]
    """`(position, stored JSON)` of every message version the log does not hold yet."""
    message_count: int
    known_log_size: int | None
    """The run's log length as this process last wrote it; `None` if the store must look it up."""
    _delta: HistoryDelta[bytes]
    _digests: dict[int, bytes]
    _full: dict[int, int] = field(default_factory=dict[int, int])
    """Position -> offset in `appends` of the full texts written for the last `TAIL` positions."""


class MessageLog:
    """Per-store encoder of snapshots into message-log appends, and decoder back."""

    def __init__(self, media_store: MediaStore | None, threshold_bytes: int) -> None:
        self.media_store = media_store
        self.threshold_bytes = threshold_bytes
        self._stored_blobs: OrderedDict[bytes, None] = OrderedDict()
        """Digests this process has put in `media_store` (bounded, most recent last)."""
        self._hashed = _HashedBinaries()
        self._tracker: HistoryTracker[bytes] = HistoryTracker()

    async def prepare(self, snapshot: ContinuableSnapshot) -> PreparedSnapshot:
        delta = self._tracker.delta(snapshot.run_id, snapshot.messages)
        appends: list[tuple[int, str]] = []
        digests: dict[int, bytes] = {}
        full: dict[int, int] = {}
        tail = len(delta.messages) - TAIL
        for position in delta.candidates:
            message, placeholders = await self._offload_binaries(delta.messages[position])
            text = message_to_json(message)
            digest = content_digest(text)
            digests[position] = digest
            if delta.stored_at(position) == digest:
                continue
            stored = await self._externalize(text, placeholders)
            patch = _patch(delta.base_at(position), stored)
            if patch is not None:
                appends.append((position, patch))
                continue
            if position >= tail:
                full[position] = len(appends)
            appends.append((position, stored))
        known = delta.previous.log_size if delta.previous is not None else None
        return PreparedSnapshot(snapshot, appends, len(delta.messages), known, delta, digests, full)

    def committed(self, prepared: PreparedSnapshot, log_size: int) -> None:
        """The store wrote `prepared`; the run's log now holds `log_size` entries.

        A store appends a snapshot's entries contiguously at the end of the log, so the full texts
        just written sit at `log_size - len(appends) + offset`: the bases of later patches.
        """
        first = log_size - len(prepared.appends)
        bases = {
            position: PatchBase(first + offset, prepared.appends[offset][1])
            for position, offset in prepared._full.items()  # pyright: ignore[reportPrivateUsage]
        }
        self._tracker.commit(prepared._delta, prepared._digests, log_size, bases)  # pyright: ignore[reportPrivateUsage]

    def forget(self, run_id: str) -> None:
        """A write failed or was suppressed: the next save of the run rewrites from scratch."""
        self._tracker.forget(run_id)

    async def save(
        self, snapshot: ContinuableSnapshot, write: Callable[[PreparedSnapshot], Awaitable[WriteOutcome]]
    ) -> None:
        """Prepare `snapshot`, have the store `write` it, and remember what was written.

        A `STALE` outcome means the tracker no longer describes the stored log (another writer
        extended it), so the history is written again in full.
        """
        prepared = await self.prepare(snapshot)
        outcome = await write(prepared)
        if outcome == STALE:
            self.forget(snapshot.run_id)
            prepared = await self.prepare(snapshot)
            outcome = await write(prepared)
        if isinstance(outcome, int):
            self.committed(prepared, outcome)

    async def newest_readable(
        self, run_id: str, find: Callable[[int | None], Awaitable[StoredSnapshot | None]]
    ) -> ContinuableSnapshot | None:
        """The newest snapshot that reads, falling back past damaged ones (SPEC 3.6).

        `find(below)` returns the newest stored snapshot with a seq below `below` (any when `None`).
        """
        below: int | None = None
        while (found := await find(below)) is not None:
            loaded = await self.snapshot(run_id, found.meta, found.texts, f'snapshot {found.seq}')
            if loaded is not None:
                return loaded
            below = found.seq
        return None

    async def all_readable(self, run_id: str, found: Iterable[StoredSnapshot]) -> list[ContinuableSnapshot]:
        """Every snapshot that reads, in the order given; damaged ones skipped with a warning."""
        snapshots: list[ContinuableSnapshot] = []
        for item in found:
            loaded = await self.snapshot(run_id, item.meta, item.texts, f'snapshot {item.seq}')
            if loaded is not None:
                snapshots.append(loaded)
        return snapshots

    async def snapshot(
        self, run_id: str, meta: SnapshotMeta, texts: list[str], where: str
    ) -> ContinuableSnapshot | None:
        """The snapshot stored as `meta` + `texts`, or `None` (with a warning naming `where`) if unreadable.

        Readers skip a damaged snapshot rather than raise, and fall back to an older one.
        """
        try:
            messages = await self.load(texts)
        except Exception:
            logger.warning('skipping unreadable %s of run %r', where, run_id, exc_info=True)
            return None
        return ContinuableSnapshot(
            run_id=run_id,
            step_index=meta.step_index,
            messages=messages,
            conversation_id=meta.conversation_id,
            parent_run_id=meta.parent_run_id,
            agent_name=meta.agent_name,
            timestamp=meta.timestamp,
            state=meta.state,
            idempotency_key=meta.idempotency_key,
        )

    async def load(self, texts: list[str]) -> list[ModelMessage]:
        """Rebuild messages from stored texts (patches already resolved), putting externalized payloads back."""
        if any(map(is_patch, texts)):
            raise ValueError('a message text is an unresolved patch')
        if self.media_store is not None:
            texts = [await self._restore(text) if has_markers(text) else text for text in texts]
        return messages_from_json(texts)

    async def _externalize(self, text: str, placeholders: dict[str, str]) -> str:
        if self.media_store is None or not (placeholders or might_need_externalizing(text, self.threshold_bytes)):
            return text
        tree: object = await externalize_tree(
            json.loads(text),
            media_store=self.media_store,
            threshold_bytes=self.threshold_bytes,
            already_stored=placeholders,
        )
        return _compact(tree)

    async def _offload_binaries(self, message: ModelMessage) -> tuple[ModelMessage, dict[str, str]]:
        """Put large `BinaryContent` bytes in the media store straight from the message objects.

        Serializing a 256 KiB image only to parse, decode and hash its base64 again costs more
        than the rest of a boundary, so the bytes go to the media store as they are and the
        message is serialized with a small placeholder in their place (on a shallow copy; the
        live message is never touched). The placeholder is derived from the content hash, so the
        serialized text still identifies the content. Payloads nested elsewhere (say, inside a
        dict returned by a tool) are found by the JSON walk as before.
        """
        placeholders: dict[str, str] = {}
        if self.media_store is None:
            return message, placeholders
        parts: list[Any] | None = None
        for index, part in enumerate(message.parts):
            content = getattr(part, 'content', None)
            replaced = await self._offload_content(content, placeholders)
            if replaced is not content:
                parts = parts if parts is not None else list(message.parts)
                stand_in = copy.copy(part)
                stand_in.content = replaced  # pyright: ignore[reportAttributeAccessIssue]
                parts[index] = stand_in
        if parts is None:
            return message, placeholders
        light = copy.copy(message)
        light.parts = parts
        return light, placeholders

    async def _offload_content(self, content: object, placeholders: dict[str, str]) -> object:
        if isinstance(content, BinaryContent):
            return await self._placeholder(content, placeholders)
        if not isinstance(content, list | tuple):
            return content
        items = cast(Sequence[object], content)
        if not any(isinstance(item, BinaryContent) and len(item.data) >= self.threshold_bytes for item in items):
            return items
        swapped = [
            await self._placeholder(item, placeholders) if isinstance(item, BinaryContent) else item for item in items
        ]
        return swapped if isinstance(content, list) else tuple(swapped)

    async def _placeholder(self, binary: BinaryContent, placeholders: dict[str, str]) -> BinaryContent:
        if len(binary.data) < self.threshold_bytes:
            return binary
        assert self.media_store is not None
        digest, identifier = await self._hashed.digest_and_identifier(binary)
        if digest in self._stored_blobs:
            # Content-addressed and never deleted by any store: the same bytes (say, an image sent
            # in every turn) are not sent to the media store again.
            self._stored_blobs.move_to_end(digest)
            uri = uri_for_digest(digest.hex())
        else:
            media_type = binary.media_type if isinstance(binary.media_type, str) else None  # pyright: ignore[reportUnnecessaryIsInstance]
            uri = await self.media_store.put(binary.data, context=MediaContext(media_type=media_type))
            self._stored_blobs[bytes.fromhex(parse_media_uri(uri))] = None
            if len(self._stored_blobs) > _STORED_BLOBS_REMEMBERED:
                self._stored_blobs.popitem(last=False)
        placeholder = _PLACEHOLDER_PREFIX + bytes.fromhex(parse_media_uri(uri))
        stand_in = copy.copy(binary)
        stand_in._identifier = identifier  # pyright: ignore[reportPrivateUsage]
        stand_in.data = placeholder
        placeholders[base64.urlsafe_b64encode(placeholder).decode()] = uri
        return stand_in

    async def _restore(self, text: str) -> str:
        assert self.media_store is not None
        tree: object = await restore_media(json.loads(text), media_store=self.media_store)
        return _compact(tree)


class _HashedBinaries:
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
        results['digest'] = await run_blocking(_sha256_digest, data)

    async def identifier() -> None:
        results['identifier'] = await run_blocking(getattr, binary, 'identifier')

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


_STORED_BLOBS_REMEMBERED = 4096
PATCH_RATIO = 2
"""A changed version is stored as a patch only if the patch is at most 1/PATCH_RATIO of its full text."""


def _patch(base: PatchBase | None, text: str) -> str | None:
    """`text` as a patch of `base`, if this process knows the position's base and the patch is much smaller."""
    if base is None or len(text) < 64:
        return None
    patch = make_patch(base.index, base.text, text)
    return patch if patch is not None and len(patch) * PATCH_RATIO <= len(text) else None


def _compact(tree: object) -> str:
    return json.dumps(tree, ensure_ascii=False, separators=(',', ':'))
