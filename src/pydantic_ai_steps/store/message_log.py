"""A snapshot's history into message-log appends, and stored texts back into messages.

Writing (`prepare`): find the candidate messages (`HistoryTracker`), serialize only those, drop the
ones whose content is unchanged, move large payloads to the media store, store a changed version
as a patch of the position's previous full text when that is much smaller. The result is a list
of `(position, text)` appends for the backend. Reading (`load`): the kernel resolves patches
(`log_entries.resolve_log`); this module restores media in the texts that carry markers and rebuilds
the messages. See `history` for the log layout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import pydantic_core
from pydantic_ai.messages import ModelMessage, ModelRequest

from .._errors import InvalidRecordError, RecordTooLargeError
from .._json import compact_json, loads
from .._records import ContinuableSnapshot
from ..media._markers import has_markers, mentions_reserved_key, might_need_externalizing
from ..media._protocol import MediaStore
from ..media._walker import externalize_tree, restore_media
from ._media_puts import INLINE, NEVER, BinaryOffload, RecentPuts, RememberedPuts
from .history import (
    TAIL,
    HistoryDelta,
    HistoryTracker,
    MessageAdapter,
    PatchBase,
    content_digest,
    digest_after,
    message_to_json,
    messages_from_json,
    part_values,
    parts_hash,
    request_to_json,
    stored_digest,
)
from .patch import is_patch, make_patch
from .protocol import SnapshotDelta

if TYPE_CHECKING:
    from _hashlib import HASH

_RequestBase = tuple[list[object], int | None, bool, 'HASH | None']
"""What a full request text appended gives the base it becomes: `PatchBase.parts`, `split`, `moved`, `parts_hash`."""

DEFAULT_MEDIA_THRESHOLD = 64 * 1024
PATCH_RATIO = 2
"""A changed version is stored as a patch only if the patch is at most 1/PATCH_RATIO of its full text."""
FIT_FLOOR_BYTES = 1024
"""The smallest payload moved out of a message text that is too long for its backend (`max_text_bytes`)."""


@dataclass
class PreparedSnapshot:
    """What a backend must write for one snapshot, computed before any I/O."""

    snapshot: ContinuableSnapshot
    appends: list[tuple[int, str]]
    """`(position, stored JSON)` of every message version the log does not hold yet."""
    message_count: int
    known_log_size: int | None
    """The run's log length as this process last wrote it; `None` if the backend must look it up."""
    _delta: HistoryDelta[bytes]
    _digests: dict[int, bytes]
    _weights: dict[int, int]
    _full: dict[int, int] = field(default_factory=dict[int, int])
    """Position -> offset in `appends` of the full texts written for the last `TAIL` positions."""
    _parts: dict[int, _RequestBase] = field(default_factory=dict[int, _RequestBase])
    """Position -> the `PatchBase` fields of those full texts that are a request's."""


class MessageLog:
    """Per-store encoder of snapshots into message-log appends, and decoder back."""

    def __init__(
        self,
        media_store: MediaStore | None,
        threshold_bytes: int,
        max_text_bytes: int | None = None,
        *,
        serialized_full_texts: bool = False,
    ) -> None:
        self.media_store = media_store
        self.threshold_bytes = threshold_bytes
        self.max_text_bytes = max_text_bytes
        """The longest text (UTF-8 bytes) one log entry may hold, when the backend has a limit."""
        self.serialized_full_texts = serialized_full_texts
        """Full texts as their messages serialize, for a store that moves payloads out and wraps a
        caller's marker-like values itself (`DeltaSnapshotStore`; such a text is then not stored
        verbatim, so never a base here). Patches still carry those values wrapped: the store keeps
        a patch as given."""
        self._tracker: HistoryTracker[bytes] = HistoryTracker()
        puts = RecentPuts(media_store) if media_store is not None else None
        self._binaries = BinaryOffload(puts, threshold_bytes) if puts is not None else None
        self._walked_store = RememberedPuts(puts) if puts is not None else None
        """The media store as the walker sees it (see `RememberedPuts`)."""

    @property
    def tracker(self) -> HistoryTracker[bytes]:
        return self._tracker

    async def prepare(self, snapshot: ContinuableSnapshot) -> PreparedSnapshot:
        delta = self._tracker.delta(snapshot.run_id, snapshot.messages)
        appends: list[tuple[int, str]] = []
        digests: dict[int, bytes] = {}
        weights: dict[int, int] = {}
        full: dict[int, int] = {}
        parts: dict[int, _RequestBase] = {}
        tail = len(delta.messages) - TAIL
        for position in delta.candidates:
            original = message = delta.messages[position]
            base = delta.base_at(position)
            placeholders: dict[str, str] = {}
            offloaded = 0
            try:
                restamped = self._restamped(base, message)
                if restamped is not None:
                    text, _, split = restamped  # its parts are its base's: their binaries went out then
                else:
                    if self._binaries is not None:
                        message, placeholders, offloaded = await self._binaries.offload(message)
                    if position >= tail and type(message) is ModelRequest:
                        text, split = request_to_json(message)  # a base its stamped version will reuse
                    else:
                        text, split = message_to_json(message), None
            except pydantic_core.PydanticSerializationError as error:
                if 'surrogates not allowed' not in str(error):
                    raise
                raise _lone_surrogate(snapshot.run_id, position) from None
            moved = restamped is not None and base is not None and base.moved
            spelled = part_values(original) if position >= tail and type(original) is ModelRequest else None
            hashed = None
            if moved:
                digest = stored_digest(text)
            elif split is None:
                digest = content_digest(text)
            else:  # a newest request: its parts are hashed once, for every stamped version of it
                hashed = base.parts_hash if restamped is not None and base is not None else None
                hashed = hashed if hashed is not None else parts_hash(text, split)
                digest = digest_after(hashed, text, split)
            digests[position] = digest
            weights[position] = delta.weight_at(position) if moved else len(text) + offloaded
            if delta.stored_at(position) == digest:
                continue
            if '\ufffd' in text and _holds_lone_surrogate(MessageAdapter.dump_python(message)):
                raise _lone_surrogate(snapshot.run_id, position)  # pydantic put U+FFFD for one in a dict key
            if restamped is None:  # a restamped text is its checked base's, with scalars after the parts
                _check_readable(text, snapshot.run_id, position)
            if moved:
                stored = text  # its base's stored parts, and new fields `_restamped` found nothing to move in
            else:
                stored = await self._externalize(text, placeholders, settled=split if restamped is not None else None)
                if self.max_text_bytes is not None and _utf8_length(stored) > self.max_text_bytes:
                    stored = await self._fit(f'{position} of the snapshot', snapshot, text, stored, placeholders)
            if restamped is not None and stored is text:
                patch = restamped[1] if _worth(restamped[1], text) else None
            else:
                patch = _patch(base, stored)
            if patch is not None:
                appends.append((position, patch))
                continue
            if self.serialized_full_texts:
                stored = text
            if position >= tail:
                full[position] = len(appends)
                if spelled is not None:
                    parts[position] = (spelled, split, moved, hashed) if stored is text else (spelled, None, True, None)
            appends.append((position, stored))
        known = delta.previous.log_size if delta.previous is not None else None
        return PreparedSnapshot(snapshot, appends, len(delta.messages), known, delta, digests, weights, full, parts)

    def _restamped(self, base: PatchBase | None, message: ModelMessage) -> tuple[str, str, int] | None:
        """A stamped request as its base's text with the new fields after the parts (`PatchBase.restamped`).

        A base whose payloads moved out spells markers in its parts, and a walk of a text holding
        them would take them for a caller's values: it is restamped only when the new fields hold
        nothing to move (nor the text grows past the backend's limit); otherwise `None`, and the
        request is serialized and walked whole.
        """
        if base is None or type(message) is not ModelRequest:
            return None
        restamped = base.restamped(message)
        if restamped is None or not base.moved:
            return restamped
        text, _, split = restamped
        if self._walk_needed('{' + text[split + 1 :]):
            return None
        if self.max_text_bytes is not None and _utf8_length(text) > self.max_text_bytes:
            return None
        return restamped

    def committed(self, prepared: PreparedSnapshot, log_size: int, verbatim: Collection[int] | None = None) -> None:
        """The backend wrote `prepared`; the run's log now holds `log_size` entries.

        A backend appends a snapshot's entries contiguously at the end of the log, so the full texts
        just written sit at `log_size - len(appends) + offset`: the bases of later patches. A writer
        whose texts another process stored (`DeltaSnapshotStore`) passes the offsets that process
        stored as given (`verbatim`): only those can be patched.
        """
        first = log_size - len(prepared.appends)
        requests = prepared._parts  # pyright: ignore[reportPrivateUsage]
        unknown = (None, None, False, None)
        bases = {
            position: PatchBase(first + offset, prepared.appends[offset][1], *requests.get(position, unknown))
            for position, offset in prepared._full.items()  # pyright: ignore[reportPrivateUsage]
            if verbatim is None or offset in verbatim
        }
        self._tracker.commit(
            prepared._delta,  # pyright: ignore[reportPrivateUsage]
            prepared._digests,  # pyright: ignore[reportPrivateUsage]
            log_size,
            bases,
            prepared._weights,  # pyright: ignore[reportPrivateUsage]
        )

    async def save(
        self, snapshot: ContinuableSnapshot, write: Callable[[PreparedSnapshot], Awaitable[int | str | None]]
    ) -> int | str | None:
        """Prepare `snapshot`, have the backend `write` it, and remember what was written.

        A `'stale'` outcome means another writer extended the run's log since this process last
        wrote it: nothing was written, so the history is prepared again in full and written once
        more, expecting no particular log end (which cannot be stale: a backend answering so is
        broken, and the save raises rather than drop the batch). Any failure leaves the outcome
        unknown: the run's next save starts over. Returns what `write` returned.
        """
        run_id = snapshot.run_id
        try:
            prepared = await self.prepare(snapshot)
            outcome = await write(prepared)
            if outcome == 'stale':
                self.forget(run_id)
                prepared = await self.prepare(snapshot)
                outcome = await write(prepared)
                if outcome == 'stale':
                    raise RuntimeError(
                        f'the backend answered stale to a snapshot of run {run_id!r} that expected no particular '
                        'log end; nothing of the write was stored'
                    )
        except BaseException:
            self.forget(run_id)
            raise
        if isinstance(outcome, int):
            self.committed(prepared, outcome)
        elif outcome != 'suppressed':
            self.forget(run_id)
        return outcome

    def forget(self, run_id: str) -> None:
        """The run ended, or a write failed or was stale: the next save of it rewrites from scratch."""
        self._tracker.forget(run_id)

    async def stored_text(self, text: str, delta: SnapshotDelta, offset: int) -> str:
        """A full message text of `delta` (at `offset` in its appends) as this store keeps it:
        payloads at or above the threshold moved to the media store, more of them if the text is
        longer than the backend holds (the text itself when nothing is moved)."""
        _check_readable(text, delta.run_id, offset, appended=True)
        stored = await self._externalize(text, {})
        if self.max_text_bytes is not None and _utf8_length(stored) > self.max_text_bytes:
            stored = await self._fit(f'appended at offset {offset} by the snapshot delta', delta, text, stored, {})
        return stored

    async def load(self, texts: Sequence[str]) -> list[ModelMessage]:
        """Rebuild messages from stored texts (patches resolved), putting externalized payloads back."""
        if any(map(is_patch, texts)):
            raise ValueError('a message text is an unresolved patch')
        texts = [await self._restore(text) if has_markers(text) else text for text in texts]
        return messages_from_json(texts)

    async def _externalize(self, text: str, placeholders: dict[str, str], settled: int | None = None) -> str:
        """`text` with its large payloads moved to the media store (`text` itself when none is).

        `settled` is where a restamped request's `parts` end in `text`: they are spelled as in its
        base, which this log stored as serialized, so walking them moves nothing and only the
        members after them are checked.
        """
        checked = text if settled is None else '{' + text[settled + 1 :]
        if not placeholders and not self._walk_needed(checked):
            return text
        if self._walked_store is None:
            # Nothing moves out, but a caller's value spelled like a marker is still wrapped as a
            # literal, so a reader given a media store (the inspector's default) reads it as written.
            media_store, threshold = INLINE, NEVER
        else:
            media_store, threshold = self._walked_store, self.threshold_bytes
        tree: object = await externalize_tree(
            json.loads(text), media_store=media_store, threshold_bytes=threshold, already_stored=placeholders
        )
        return compact_json(tree)

    def _walk_needed(self, text: str) -> bool:
        """Whether walking `text` could change it: a payload to move, or a reserved key to wrap."""
        if self._walked_store is None:
            return mentions_reserved_key(text)
        return might_need_externalizing(text, self.threshold_bytes)

    async def _fit(
        self,
        which: str,
        snapshot: ContinuableSnapshot | SnapshotDelta,
        text: str,
        stored: str,
        placeholders: dict[str, str],
    ) -> str:
        """A message text longer than the backend's `max_text_bytes`, with smaller payloads moved out until it fits.

        Payloads below `threshold_bytes` go to the media store too (the largest first: the threshold
        drops by a factor of four each pass, down to `FIT_FLOOR_BYTES`). Where nothing is left to
        move (no media store, or the bulk is not payloads: a tool call's arguments, say), a
        `RecordTooLargeError` names the message (`which`), its size and the limit, before anything
        is written.
        """
        limit = self.max_text_bytes
        assert limit is not None
        size = _utf8_length(stored)
        if self.media_store is not None:
            threshold = min(self.threshold_bytes, limit) // 4
            while threshold >= FIT_FLOOR_BYTES:
                tree: object = await externalize_tree(
                    json.loads(text),
                    media_store=self.media_store,
                    threshold_bytes=threshold,
                    already_stored=placeholders,
                )
                fitted = compact_json(tree)
                size = _utf8_length(fitted)
                if size <= limit:
                    return fitted
                threshold //= 4
        moved = (
            f'after moving every payload of {FIT_FLOOR_BYTES} bytes or more to the media store'
            if self.media_store is not None
            else 'and the store has no media store to move its payloads to (media_store=None)'
        )
        raise RecordTooLargeError(
            f'message {which} of run {snapshot.run_id!r} at step {snapshot.step_index} is '
            f'{size} bytes as JSON {moved}; this store holds at most {limit} bytes per message'
        )

    async def _restore(self, text: str) -> str:
        media_store = self.media_store if self.media_store is not None else INLINE
        tree: object = await restore_media(loads(text), media_store=media_store)
        return compact_json(tree)


_READER_DEPTH = 190
"""Below this many `[` and `{` a message text cannot reach the 200 levels of nesting pydantic-core's
JSON parser reads (the history's own list is one of them)."""
_READER_DIGITS = 4300
"""The most digits of an integer pydantic-core's JSON parser reads."""
_LONG_INTEGER = re.compile(rf'(?<![0-9])[0-9]{{{_READER_DIGITS + 1}}}')  # tried at the start of each run of digits


def _check_readable(text: str, run_id: str, position: int, *, appended: bool = False) -> None:
    """Refuse a message its readers could not parse back, though pydantic serialized it: nested
    deeper than its parser reads, or holding an integer longer than it converts (a tool's return
    can hold either). Stored, every later snapshot of the run would hold it and be skipped as
    unreadable. Only a text long enough and with brackets enough for either is parsed here."""
    if len(text) < 2 * _READER_DEPTH:
        return
    if text.count('[') + text.count('{') < _READER_DEPTH and (
        len(text) <= _READER_DIGITS or not _LONG_INTEGER.search(text)
    ):
        return
    try:
        pydantic_core.from_json(f'[{text}]')  # the parser readers use, nesting as in a history's list
    except ValueError as error:
        reason = str(error)
        which = (
            f'the message appended at offset {position} by the snapshot delta' if appended else f'message {position}'
        )
        raise InvalidRecordError(
            f'{which} of run {run_id!r} cannot be stored: pydantic-ai could not read it back ({reason}; its '
            f'JSON reader takes at most 200 levels of nesting and integers of at most {_READER_DIGITS} digits); '
            'no record of this write was stored. Return such a value from a tool as text, or shallower'
        ) from None


def _lone_surrogate(run_id: str, position: int) -> InvalidRecordError:
    """A message with a lone surrogate (`'\\udc80'`, what `surrogateescape` decoding of a file name
    leaves) has no JSON form in UTF-8, so no store can hold it."""
    return InvalidRecordError(
        f'message {position} of run {run_id!r} holds text that is not valid Unicode (a lone surrogate, as '
        'surrogateescape decoding leaves), which JSON in UTF-8 cannot hold; no record of this write was stored. '
        "Decode such text with errors='replace' (or 'backslashreplace') before it reaches the history"
    )


def _holds_lone_surrogate(value: object) -> bool:
    """Whether a message's Python dump holds a lone surrogate anywhere, dict keys included (where
    pydantic's JSON writes U+FFFD in its place instead of refusing)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        items = cast(dict[object, object], value).items()
        return any(_holds_lone_surrogate(key) or _holds_lone_surrogate(item) for key, item in items)
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_lone_surrogate(item) for item in cast(Collection[object], value))
    return False


def _utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode('utf-8', 'surrogatepass'))


def _patch(base: PatchBase | None, text: str) -> str | None:
    """`text` as a patch of `base`, if this process knows the position's base and the patch is much smaller."""
    if base is None or len(text) < 64:
        return None
    patch = make_patch(base.index, base.text, text)
    return patch if patch is not None and _worth(patch, text) else None


def _worth(patch: str, text: str) -> bool:
    return len(patch) * PATCH_RATIO <= len(text)
