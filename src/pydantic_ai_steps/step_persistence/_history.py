"""Message-once history storage: each message version of a run is written once.

A run's history grows by appending, so saving the whole list at every boundary makes step N cost
O(N) and the store O(N^2). Instead every store keeps, per run, an append-only *message log* of
`(position, message)` entries, and a snapshot records only two numbers: how many messages its
history has (`message_count`) and how long the log was when it was saved (`log_size`). The
history of a snapshot is, for each position below `message_count`, the newest log entry for that
position among the first `log_size` entries. A boundary therefore writes only the messages that
are new or changed, and snapshots stay a constant size however long the run gets. Pruning a
snapshot never breaks another one: every snapshot resolves against the log on its own.

Deciding what changed is the subtle part. pydantic-ai stamps fields (`timestamp`, `run_id`,
`conversation_id`, `instructions`, extra parts) onto a request *after* the boundary that first
saw it, by assigning attributes of the same object; a history processor may replace messages.
So "new" cannot mean "beyond the previous length" or "a different object". `HistoryTracker`
remembers, per position, the object it saw and references to that object's attribute values
(and those of its parts). A message whose object and attribute values are all identical
(`is`) to last time cannot have changed unless mutated deep inside a value in place, which
pydantic-ai does not do; anything else is a *candidate*, re-serialized and compared by content.
Holding references (not `id()`s) keeps the compared objects alive, so an address can never be
reused by a new value and fool the comparison. Cost per boundary: a pointer comparison per
message and attribute, plus serializing the candidates only.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import pydantic
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

MessageAdapter: pydantic.TypeAdapter[ModelMessage] = pydantic.TypeAdapter(
    ModelMessage, config=pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64')
)
"""One message to/from compact JSON, byte-identical to its element in `ModelMessagesTypeAdapter`."""


def message_to_json(message: ModelMessage) -> str:
    return MessageAdapter.dump_json(message).decode()


def messages_from_json(texts: Iterable[str]) -> list[ModelMessage]:
    """Rebuild a history from per-message JSON texts without re-encoding them one by one."""
    return ModelMessagesTypeAdapter.validate_json('[' + ','.join(texts) + ']')


def messages_to_json(messages: Sequence[ModelMessage]) -> str:
    return ModelMessagesTypeAdapter.dump_json(list(messages)).decode()


def content_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _shape(message: ModelMessage) -> list[object]:
    """References to everything the framework reassigns on a message or its parts."""
    values: list[object] = list(vars(message).values())
    for part in message.parts:
        values += vars(part).values()
    return values


def _same(left: list[object], right: list[object]) -> bool:
    """Identity of every value; `map`/`all` keep this loop in C, it runs per message per step."""
    return len(left) == len(right) and all(map(operator.is_, left, right))


StoredT = TypeVar('StoredT')


@dataclass
class _Seen(Generic[StoredT]):
    message: ModelMessage
    shape: list[object]
    stored: StoredT
    """What the store holds for this position: a content digest, or a private copy."""


@dataclass
class RunHistory(Generic[StoredT]):
    """What one run has written so far: one entry per history position, and the log length."""

    positions: list[_Seen[StoredT]] = field(default_factory=list[_Seen[StoredT]])
    log_size: int = 0


@dataclass
class HistoryDelta(Generic[StoredT]):
    """The candidates of one boundary: positions whose message may differ from what is stored."""

    run_id: str
    messages: list[ModelMessage]
    candidates: list[int]
    previous: RunHistory[StoredT] | None
    """`None` when this process has not written the run before (so every position is a candidate)."""

    def stored_at(self, position: int) -> StoredT | None:
        if self.previous is None or position >= len(self.previous.positions):
            return None
        return self.previous.positions[position].stored


class HistoryTracker(Generic[StoredT]):
    """Remembers, per run, which message versions a store has written.

    Bounded: runs beyond `max_runs` (least recently saved first) are forgotten, which costs only
    a full rewrite of that run's history at its next save, never correctness.
    """

    def __init__(self, max_runs: int = 512) -> None:
        self._runs: OrderedDict[str, RunHistory[StoredT]] = OrderedDict()
        self._max_runs = max_runs

    def delta(self, run_id: str, messages: Sequence[ModelMessage]) -> HistoryDelta[StoredT]:
        current = list(messages)
        previous = self._runs.get(run_id)
        if previous is None:
            return HistoryDelta(run_id, current, list(range(len(current))), None)
        seen = previous.positions
        candidates: list[int] = []
        for position, message in enumerate(current):
            if position < len(seen):
                entry = seen[position]
                if entry.message is message and _same(entry.shape, _shape(message)):
                    continue
            candidates.append(position)
        return HistoryDelta(run_id, current, candidates, previous)

    def commit(self, delta: HistoryDelta[StoredT], stored: dict[int, StoredT], log_size: int) -> None:
        """Record a successful write: `stored` maps every candidate position to what is now stored."""
        previous = delta.previous.positions if delta.previous is not None else []
        positions: list[_Seen[StoredT]] = []
        for position, message in enumerate(delta.messages):
            if position in stored:
                positions.append(_Seen(message, _shape(message), stored[position]))
            else:
                positions.append(previous[position])
        self._runs[delta.run_id] = RunHistory(positions, log_size)
        self._runs.move_to_end(delta.run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop what is known about a run, e.g. after a failed write whose outcome is unknown."""
        self._runs.pop(run_id, None)


@dataclass(frozen=True)
class LogEntry:
    """One message version in a run's message log."""

    index: int
    position: int
    text: str


def resolve_history(entries: Iterable[LogEntry], message_count: int, log_size: int) -> list[str] | None:
    """The message texts of a snapshot, or `None` if a position has no entry (damaged log)."""
    latest: list[LogEntry | None] = [None] * message_count
    for entry in entries:
        if entry.index < log_size and entry.position < message_count:
            current = latest[entry.position]
            if current is None or current.index < entry.index:
                latest[entry.position] = entry
    texts: list[str] = []
    for entry in latest:
        if entry is None:
            return None
        texts.append(entry.text)
    return texts
