"""The pipeline every persistent store shares between a snapshot and its message log.

Writing: find the candidate messages (`HistoryTracker`), serialize only those, drop the ones
whose content is unchanged, move large payloads to the media store, and hand the store a list of
`(position, text)` appends. Reading: restore media in the texts that carry markers and rebuild
the messages. A store only does I/O around these two calls; see `_history` for the log layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage

from ..media._protocol import MediaStore
from ..media._walker import externalize_media, has_markers, might_need_externalizing, restore_media
from ._history import HistoryDelta, HistoryTracker, content_digest, message_to_json, messages_from_json
from ._records import ContinuableSnapshot

DEFAULT_MEDIA_THRESHOLD = 64 * 1024


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


class MessageLog:
    """Per-store encoder of snapshots into message-log appends, and decoder back."""

    def __init__(self, media_store: MediaStore | None, threshold_bytes: int) -> None:
        self.media_store = media_store
        self.threshold_bytes = threshold_bytes
        self._tracker: HistoryTracker[bytes] = HistoryTracker()

    async def prepare(self, snapshot: ContinuableSnapshot) -> PreparedSnapshot:
        delta = self._tracker.delta(snapshot.run_id, snapshot.messages)
        appends: list[tuple[int, str]] = []
        digests: dict[int, bytes] = {}
        for position in delta.candidates:
            text = message_to_json(delta.messages[position])
            digest = content_digest(text)
            digests[position] = digest
            if delta.stored_at(position) == digest:
                continue
            appends.append((position, await self._externalize(text)))
        known = delta.previous.log_size if delta.previous is not None else None
        return PreparedSnapshot(snapshot, appends, len(delta.messages), known, delta, digests)

    def committed(self, prepared: PreparedSnapshot, log_size: int) -> None:
        """The store wrote `prepared`; the run's log now holds `log_size` entries."""
        self._tracker.commit(prepared._delta, prepared._digests, log_size)  # pyright: ignore[reportPrivateUsage]

    def forget(self, run_id: str) -> None:
        """A write failed or was suppressed: the next save of the run rewrites from scratch."""
        self._tracker.forget(run_id)

    async def load(self, texts: list[str]) -> list[ModelMessage]:
        """Rebuild messages from stored texts, putting externalized payloads back."""
        if self.media_store is not None:
            texts = [await self._restore(text) if has_markers(text) else text for text in texts]
        return messages_from_json(texts)

    async def _externalize(self, text: str) -> str:
        if self.media_store is None or not might_need_externalizing(text, self.threshold_bytes):
            return text
        tree: object = await externalize_media(
            json.loads(text), media_store=self.media_store, threshold_bytes=self.threshold_bytes
        )
        return _compact(tree)

    async def _restore(self, text: str) -> str:
        assert self.media_store is not None
        tree: object = await restore_media(json.loads(text), media_store=self.media_store)
        return _compact(tree)


def _compact(tree: object) -> str:
    return json.dumps(tree, ensure_ascii=False, separators=(',', ':'))
