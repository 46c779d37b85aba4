"""The media store as a message log uses it: puts remembered for a while, binaries put straight from
messages, and a stand-in for no media store.

A writer puts a payload before any text references it. The same bytes come back often (an image
sent in every turn, a long tool result written again when its request is stamped), so a log
remembers what this process put lately and does not send it again (`RecentPuts`); garbage
collection is held to a grace period long enough for that trust (`BLOB_MEMO_SECONDS`).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from pydantic_ai.messages import BinaryContent, ModelMessage

from ..media._context import EMPTY_CONTEXT, MediaContext
from ..media._protocol import MediaStore
from ..media._uri import parse_media_uri, uri_for_digest
from ._hashing import OFF_LOOP_HASH_BYTES, HashedBinaries

PLACEHOLDER_PREFIX = b'\x00pydantic-ai-steps media placeholder\x00'

BLOB_MEMO_SECONDS = 300.0
"""How long this process trusts that a blob it put is still in the media store. Media garbage
collection never removes a blob put within its grace period (an hour by default, and never less
than twice this while writers run: `maintenance.MIN_LIVE_GRACE`), so a writer that re-puts anything
older than this never references a blob that collection removed, even with a slow commit or a
media server whose clock is minutes off. A collection run in this process removes what it deleted
from every writer's trust at once (`forget_collected`)."""
_BLOBS_REMEMBERED = 4096
_collected: dict[bytes, float] = {}
"""Digest -> when (monotonic) a garbage collection in this process deleted it, for `BLOB_MEMO_SECONDS`."""


def forget_collected(uris: Collection[str]) -> None:
    """Blobs a garbage collection deleted: no writer of this process trusts an earlier put of them."""
    now = time.monotonic()
    for stale in [digest for digest, when in _collected.items() if now - when >= BLOB_MEMO_SECONDS]:
        del _collected[stale]  # no trusted put is that old any more
    for uri in uris:
        _collected[bytes.fromhex(parse_media_uri(uri))] = now


_Filing = tuple[str | None, str | None, tuple[tuple[str, str], ...]]


def _filed_by(context: MediaContext) -> _Filing:
    """Everything of a put's context a media store may file the blob by, as a hashable value."""
    return context.media_type, context.filename, tuple(sorted(context.metadata.items()))


class RecentPuts:
    """Puts to one media store, each skipped if this process put the same bytes with the same context lately."""

    def __init__(self, store: MediaStore) -> None:
        self.store = store
        self._put_at: OrderedDict[tuple[bytes, _Filing], float] = OrderedDict()
        """`(digest, context)` -> when this process last put it (bounded, most recent last)."""

    async def put_once(self, data: bytes, digest: bytes, context: MediaContext) -> str:
        """Put `data` (whose sha256 is `digest`) in the media store, unless this process put it lately.

        The same bytes (an image sent in every turn, a long tool result written again when its
        request is stamped) are not sent to the media store again within `BLOB_MEMO_SECONDS`, if
        they were put with the same context: a store may file a blob by its context
        (`key_strategy(uri, context)`), and reads ask with the context it was put with.
        """
        filed = _filed_by(context)
        put_at = self._put_at.get((digest, filed))
        now = time.monotonic()
        if put_at is not None and now - put_at < BLOB_MEMO_SECONDS and _collected.get(digest, -1.0) < put_at:
            self._put_at.move_to_end((digest, filed))
            return uri_for_digest(digest.hex())
        uri = await self.store.put(data, context=context)
        stored = (bytes.fromhex(parse_media_uri(uri)), filed)
        self._put_at[stored] = now
        self._put_at.move_to_end(stored)
        if len(self._put_at) > _BLOBS_REMEMBERED:
            self._put_at.popitem(last=False)
        return uri


class BinaryOffload:
    """Large `BinaryContent` bytes put in the media store straight from the message objects."""

    def __init__(self, puts: RecentPuts, threshold_bytes: int) -> None:
        self._puts = puts
        self.threshold_bytes = threshold_bytes
        self._hashed = HashedBinaries()

    async def offload(self, message: ModelMessage) -> tuple[ModelMessage, dict[str, str], int]:
        """Put large `BinaryContent` bytes in the media store straight from the message objects.

        Serializing a 256 KiB image only to parse, decode and hash its base64 again costs more
        than the rest of a boundary, so the bytes go to the media store as they are and the
        message is serialized with a small placeholder in their place (on a shallow copy; the
        live message is never touched). The placeholder is derived from the content hash, so the
        serialized text still identifies the content. Payloads nested elsewhere (say, inside a
        dict returned by a tool) are found by the JSON walk as before. Also returns how many
        bytes were moved out.
        """
        placeholders: dict[str, str] = {}
        parts: list[Any] | None = None
        moved = 0
        for index, part in enumerate(message.parts):
            content = getattr(part, 'content', None)
            if not _may_hold_binaries(content):
                continue
            replaced, size = await self._offload_content(content, placeholders)
            if replaced is not content:
                moved += size
                parts = parts if parts is not None else list(message.parts)
                stand_in = copy.copy(part)
                stand_in.content = replaced  # pyright: ignore[reportAttributeAccessIssue]
                parts[index] = stand_in
        if parts is None:
            return message, placeholders, 0
        light = copy.copy(message)
        light.parts = parts
        return light, placeholders, moved

    async def _offload_content(self, content: object, placeholders: dict[str, str]) -> tuple[object, int]:
        if isinstance(content, BinaryContent):
            replaced = await self._placeholder(content, placeholders)
            return replaced, len(content.data) if replaced is not content else 0
        if not isinstance(content, list | tuple):
            return content, 0
        items = cast('Sequence[object]', content)
        large = [item for item in items if isinstance(item, BinaryContent) and len(item.data) >= self.threshold_bytes]
        if not large:
            return items, 0
        swapped = [
            await self._placeholder(item, placeholders) if isinstance(item, BinaryContent) else item for item in items
        ]
        moved = sum(len(item.data) for item in large)
        return (swapped if isinstance(content, list) else tuple(swapped)), moved

    async def _placeholder(self, binary: BinaryContent, placeholders: dict[str, str]) -> BinaryContent:
        if len(binary.data) < self.threshold_bytes:
            return binary
        digest, identifier = await self._hashed.digest_and_identifier(binary)
        media_type = binary.media_type if isinstance(binary.media_type, str) else None  # pyright: ignore[reportUnnecessaryIsInstance]
        uri = await self._puts.put_once(binary.data, digest, MediaContext(media_type=media_type))
        placeholder = PLACEHOLDER_PREFIX + bytes.fromhex(parse_media_uri(uri))
        stand_in = copy.copy(binary)
        stand_in._identifier = identifier  # pyright: ignore[reportPrivateUsage]
        stand_in.data = placeholder
        placeholders[base64.urlsafe_b64encode(placeholder).decode()] = uri
        return stand_in


def _may_hold_binaries(content: object) -> bool:
    """Whether a part's content is, or lists, what `BinaryOffload` moves out (most parts hold text)."""
    return isinstance(content, BinaryContent | list | tuple)


class RememberedPuts:
    """A log's media store as the walker sees it: payloads this process put lately are not put again.

    Payloads of `OFF_LOOP_HASH_BYTES` or more go to the store as they are (it hashes them, off the
    event loop where it must); smaller ones are hashed here first, which costs less than a put.
    """

    def __init__(self, puts: RecentPuts) -> None:
        self._puts = puts
        self._store = puts.store

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        if len(data) >= OFF_LOOP_HASH_BYTES:
            return await self._store.put(data, context=context)
        return await self._puts.put_once(data, hashlib.sha256(data).digest(), context)

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        return await self._store.get(uri, context=context)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return await self._store.exists(uri, context=context)

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return await self._store.public_url(uri, context=context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        return await self._store.get_metadata(uri, context=context)


class InlineOnly:
    """The media store of a store that keeps payloads inline: literals unwrap, a marker cannot be read."""

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        raise AssertionError('a store without a media store moves nothing out')  # threshold `NEVER`

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        raise FileNotFoundError(f'media not found: {uri}: this store keeps payloads inline (media_store=None)')

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return False

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        raise FileNotFoundError(f'media not found: {uri}: this store keeps payloads inline (media_store=None)')


INLINE = InlineOnly()
NEVER = 1 << 62
