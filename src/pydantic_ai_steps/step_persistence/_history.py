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
reused by a new value and fool the comparison. Only the newest positions are compared value by
value (`TAIL`); the settled rest by object identity, in one C-level pass. Cost per boundary:
that pass, a few pointer comparisons, and serializing the candidates only.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

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
    """Identity of every value; `map`/`all` keep this loop in C."""
    return len(left) == len(right) and all(map(operator.is_, left, right))


TAIL = 8
"""How many of the newest positions of the last write are re-checked value by value.

pydantic-ai stamps a request only while it is the newest one or next to it (the pending
tool-return request of the last boundary, stamped when it is sent). Older positions are
compared by object identity alone, in C, so a boundary costs the same however long the
history is. A history processor that rewrites older messages builds new objects (as
pydantic-ai's own do) and is seen; one that assigned into an old message's fields in place
would not be, so don't.
"""

StoredT = TypeVar('StoredT')


@dataclass
class RunHistory(Generic[StoredT]):
    """What one run has written so far, as parallel lists by history position."""

    messages: list[ModelMessage] = field(default_factory=list[ModelMessage])
    shapes: list[list[object] | None] = field(default_factory=list[list[object] | None])
    stored: list[StoredT] = field(default_factory=list[StoredT])
    """What the store holds per position: a content digest, or a private copy."""
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
        if self.previous is None or position >= len(self.previous.stored):
            return None
        return self.previous.stored[position]


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
        seen = previous.messages
        overlap = min(len(current), len(seen))
        settled = max(0, len(seen) - TAIL) if overlap == len(seen) else 0
        if settled and not all(map(operator.is_, seen[:settled], current[:settled])):
            settled = 0  # the history was rewritten: check every position
        candidates: list[int] = []
        for position in range(settled, len(current)):
            if position < overlap:
                message = current[position]
                shape = previous.shapes[position]
                if seen[position] is message and shape is not None and _same(shape, _shape(message)):
                    continue
            candidates.append(position)
        return HistoryDelta(run_id, current, candidates, previous)

    def commit(self, delta: HistoryDelta[StoredT], stored: dict[int, StoredT], log_size: int) -> list[StoredT]:
        """Record a successful write: `stored` maps every candidate position to what is now stored.

        Returns what is stored for every position of the history (shared with the tracker: read only).
        """
        count = len(delta.messages)
        previous = delta.previous if delta.previous is not None else RunHistory[StoredT]()
        kept = min(count, len(previous.stored))
        shapes: list[list[object] | None] = previous.shapes[:kept] + [None] * (count - kept)
        values: list[StoredT | None] = [*previous.stored[:kept], *([None] * (count - kept))]
        for position, value in stored.items():
            shapes[position] = _shape(delta.messages[position])
            values[position] = value
        run = RunHistory(delta.messages, shapes, cast(list[StoredT], values), log_size)
        self._runs[delta.run_id] = run
        self._runs.move_to_end(delta.run_id)
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)
        return run.stored

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
