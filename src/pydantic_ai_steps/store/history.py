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

A changed version of a message is usually a stamped copy of the previous one, differing in a few
top-level fields. So a log entry's text is either a full message JSON or a *patch*: the new
version spelled as references into an earlier full text of the same position (`make_patch`,
`apply_patch`, format below). Writers keep the last full text of the newest positions in memory
(`PatchBase`, `TAIL` positions per run), so patching never reads the store; readers resolve a
patch against its base entry, which lies below it in the same log and position, so every reader
that loads a snapshot's entries loads the base too.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.scanner import make_scanner
from typing import Any, Generic, TypeVar, cast

import pydantic
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse

MessageAdapter: pydantic.TypeAdapter[ModelMessage] = pydantic.TypeAdapter(
    ModelMessage, config=pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64')
)
"""One message to/from compact JSON, byte-identical to its element in `ModelMessagesTypeAdapter`."""


_CONFIG = pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64')
_REQUESTS: pydantic.TypeAdapter[list[ModelRequest]] = pydantic.TypeAdapter(list[ModelRequest], config=_CONFIG)
_RESPONSES: pydantic.TypeAdapter[list[ModelResponse]] = pydantic.TypeAdapter(list[ModelResponse], config=_CONFIG)


def message_to_json(message: ModelMessage) -> str:
    """`MessageAdapter.dump_json(message)`, as text, at half the cost for a response.

    pydantic-core serializes a union by trying its members in turn, so a `ModelResponse` pays
    for a failed attempt as a `ModelRequest` first. A one-element list of the concrete class
    gives the same bytes inside its brackets.
    """
    if type(message) is ModelRequest:
        return _REQUESTS.dump_json([message])[1:-1].decode()
    if type(message) is ModelResponse:
        return _RESPONSES.dump_json([message])[1:-1].decode()
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


@dataclass(frozen=True)
class PatchBase:
    """A full message text the log holds at `index`: what a later version of its position can patch."""

    index: int
    text: str


@dataclass
class RunHistory(Generic[StoredT]):
    """What one run has written so far, as parallel lists by history position."""

    messages: list[ModelMessage] = field(default_factory=list[ModelMessage])
    shapes: list[list[object] | None] = field(default_factory=list[list[object] | None])
    stored: list[StoredT] = field(default_factory=list[StoredT])
    """What the store holds per position: a content digest, or a private copy."""
    log_size: int = 0
    bases: dict[int, PatchBase] = field(default_factory=dict[int, PatchBase])
    """The newest full text per position, for the last `TAIL` positions only (the ones still stamped)."""
    weights: list[int] = field(default_factory=list[int])
    """Roughly how many bytes each position's message holds alive (its text, its binary payloads)."""
    weight: int = 0


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

    def base_at(self, position: int) -> PatchBase | None:
        """The newest full text the log holds for `position`, if this process still knows it."""
        return None if self.previous is None else self.previous.bases.get(position)


class HistoryTracker(Generic[StoredT]):
    """Remembers, per run, which message versions a store has written.

    What it remembers keeps the run's message objects alive, so it is bounded: by `max_runs` and
    by `max_bytes` of message weight (least recently saved runs go first), and a run whose
    closing event is written is dropped at once (`forget`). A forgotten run costs only a full
    rewrite of its history at its next save, never correctness.
    """

    def __init__(self, max_runs: int = 512, max_bytes: int = 64 << 20) -> None:
        self._runs: OrderedDict[str, RunHistory[StoredT]] = OrderedDict()
        self._max_runs = max_runs
        self._max_bytes = max_bytes
        self._weight = 0

    @property
    def weight(self) -> int:
        """The bytes of message content the remembered runs hold alive, as estimated."""
        return self._weight

    def __len__(self) -> int:
        return len(self._runs)

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

    def commit(
        self,
        delta: HistoryDelta[StoredT],
        stored: dict[int, StoredT],
        log_size: int,
        bases: Mapping[int, PatchBase] | None = None,
        weights: Mapping[int, int] | None = None,
    ) -> list[StoredT]:
        """Record a successful write: `stored` maps every candidate position to what is now stored.

        `bases` are the full texts this write appended (patches keep their position's base); the
        run keeps the newest base of each of its last `TAIL` positions. `weights` estimates the
        bytes each written position's message holds.

        Returns what is stored for every position of the history (shared with the tracker: read only).
        """
        count = len(delta.messages)
        previous = delta.previous if delta.previous is not None else RunHistory[StoredT]()
        kept = min(count, len(previous.stored))
        shapes: list[list[object] | None] = previous.shapes[:kept] + [None] * (count - kept)
        values: list[StoredT | None] = [*previous.stored[:kept], *([None] * (count - kept))]
        sizes = previous.weights[:kept] + [0] * (count - kept)
        for position, value in stored.items():
            shapes[position] = _shape(delta.messages[position])
            values[position] = value
            if weights is not None:
                sizes[position] = weights.get(position, 0)
        tail = range(max(0, count - TAIL), count)
        run_bases = {position: base for position, base in previous.bases.items() if position in tail}
        if bases:
            run_bases.update((position, base) for position, base in bases.items() if position in tail)
        run = RunHistory(delta.messages, shapes, cast(list[StoredT], values), log_size, run_bases, sizes, sum(sizes))
        self.forget(delta.run_id)
        self._runs[delta.run_id] = run
        self._weight += run.weight
        while len(self._runs) > 1 and (len(self._runs) > self._max_runs or self._weight > self._max_bytes):
            _, evicted = self._runs.popitem(last=False)
            self._weight -= evicted.weight
        return run.stored

    def forget(self, run_id: str) -> None:
        """Drop what is known about a run: it has ended, or a write's outcome is unknown."""
        gone = self._runs.pop(run_id, None)
        if gone is not None:
            self._weight -= gone.weight


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message version in a run's message log."""

    index: int
    position: int
    text: str


def resolve_history(entries: Iterable[LogEntry], message_count: int, log_size: int) -> list[str] | None:
    """The message texts of a snapshot, or `None` if a position has no entry or an unusable patch.

    A patch is resolved against its base entry, which must be among `entries` (within `log_size`),
    hold the same position at a smaller index, and be a full text; otherwise the snapshot is damaged.
    """
    latest: list[LogEntry | None] = [None] * message_count
    kept: list[LogEntry] = []
    for entry in entries:
        if entry.index < log_size and entry.position < message_count:
            kept.append(entry)
            current = latest[entry.position]
            if current is None or current.index < entry.index:
                latest[entry.position] = entry
    texts: list[str] = []
    by_index: dict[int, LogEntry] | None = None
    for entry in latest:
        if entry is None:
            return None
        text = entry.text
        if is_patch(text):
            if by_index is None:
                by_index = {item.index: item for item in kept}
            resolved = _resolve_patch(entry, by_index)
            if resolved is None:
                return None
            text = resolved
        texts.append(text)
    return texts


def resolve_log(
    entries: Iterable[LogEntry],
    missing: Collection[range],
    readable_end: int | None,
    message_count: int,
    log_size: int,
) -> list[str] | None:
    """`resolve_history`, distrusting whatever a missing (unreadable) entry could have superseded.

    A missing index below `log_size` (in a range of unreadable entries, or one at or past `readable_end`) could
    have held a newer version of any position, so each position's newest entry must lie above the
    highest such index. A history written in full after the damage reads; one that depended on
    the lost entry does not, rather than being rebuilt from an older version in silence.
    """
    gap = max((min(gap.stop, log_size) - 1 for gap in missing if gap.start < log_size), default=-1)
    if readable_end is not None and log_size > readable_end:
        gap = log_size - 1
    if gap >= 0:
        entries = [entry for entry in entries if entry.index > gap]
    return resolve_history(entries, message_count, log_size)


def _resolve_patch(entry: LogEntry, by_index: Mapping[int, LogEntry]) -> str | None:
    try:
        base_index, ops = _patch_ops(entry.text)
        base = by_index.get(base_index)
        if base is None or base.position != entry.position or base.index >= entry.index or is_patch(base.text):
            return None
        return _apply_ops(ops, base.text)
    except (ValueError, RecursionError):
        return None


# --- patches --------------------------------------------------------------------------------------
#
# A patch is a JSON object with the single key "$patch" (a message's keys are field names, so a
# message JSON never has it; an object, not an array, so a store that insists a log entry be a
# JSON object keeps it as is) holding an array: the log index of its base entry, then one op per
# top-level member of the new message, in order:
#
#   i             member i of the base, verbatim ("key":value)
#   {"k":v}       a new member, verbatim: the text between the braces
#   [i, e, ...]   member i of the base (an array, e.g. "parts") rebuilt from e: an integer j is
#                 element j of the base's array, verbatim; any other value is a new element
#
# Everything is copied as raw text, never re-encoded, so the result is byte-identical to the text
# the patch was made from (key order, number spelling and escapes included). Only compact JSON
# (no whitespace between tokens, as every writer here produces) is patched. A base is always a
# full text, never a patch, so resolving a version costs one patch at most.

PATCH_PREFIX = '{"$patch":['
"""How every patch text starts; a full message text never does."""

_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))  # (stub is off)
"""The C scanner behind `json.loads`: `(value, end)` of the JSON value at an index, `StopIteration` if none."""
_INT = re.compile(r'-?[0-9]+')


def is_patch(text: str) -> bool:
    return text.startswith(PATCH_PREFIX)


def make_patch(base_index: int, base: str, text: str) -> str | None:
    """`text` as a patch against the full text `base` stored at `base_index`.

    `None` if either is not compact JSON. The caller decides whether the patch is worth storing.
    """
    if is_patch(base):
        return None
    try:
        old = _members(base)
        new = _members(text)
    except (ValueError, RecursionError):
        return None
    by_key: dict[str, int] = {}
    for index, (key, _, _) in enumerate(old):
        by_key.setdefault(key, index)
    ops = [str(base_index)]
    for key, raw, at in new:
        index = by_key.get(key)
        if index is None:
            ops.append('{' + raw + '}')
            continue
        _, old_raw, old_at = old[index]
        if old_raw == raw:
            ops.append(str(index))
            continue
        op = '{' + raw + '}'
        if raw[:at] == old_raw[:old_at] and raw.startswith('[', at) and old_raw.startswith('[', old_at):
            spliced = _array_op(index, old_raw[old_at:], raw[at:])
            if spliced is not None and len(spliced) < len(op):
                op = spliced
        ops.append(op)
    return PATCH_PREFIX + ','.join(ops) + ']}'


def apply_patch(patch: str, base: str) -> str:
    """The text `patch` was made from, given its base text. Raises `ValueError` if it does not apply."""
    if is_patch(base):
        raise ValueError('a patch base must be a full text')
    return _apply_ops(_patch_ops(patch)[1], base)


def patch_base_index(patch: str) -> int:
    """The log index of the entry `patch` applies to. Raises `ValueError` if `patch` is not one."""
    return _patch_ops(patch)[0]


def _array_op(index: int, old_value: str, new_value: str) -> str | None:
    try:
        old = _elements(old_value)
        new = _elements(new_value)
    except (ValueError, RecursionError):
        return None
    positions: dict[str, int] = {}
    for position, raw in enumerate(old):
        positions.setdefault(raw, position)
    items = [str(index)]
    for raw in new:
        position = positions.get(raw)
        if position is not None:
            items.append(str(position))
        elif _INT.fullmatch(raw):
            return None  # a new integer element would read as a reference
        else:
            items.append(raw)
    return '[' + ','.join(items) + ']'


def _patch_ops(patch: str) -> tuple[int, list[str]]:
    members = _members(patch)
    if len(members) != 1 or members[0][0] != '$patch':
        raise ValueError('not a patch')
    _, raw, at = members[0]
    items = _elements(raw[at:])
    if not items:
        raise ValueError('a patch names its base')
    return _index(items[0], None), items[1:]


def _apply_ops(ops: list[str], base: str) -> str:
    old = _members(base)
    pieces: list[str] = []
    for op in ops:
        if op.startswith('{'):
            members = _members(op)
            if len(members) != 1:
                raise ValueError(f'a patch member must be one key and value, got {op[:80]!r}')
            pieces.append(members[0][1])
        elif op.startswith('['):
            items = _elements(op)
            if not items:
                raise ValueError('an array op names its base member')
            _, raw, at = old[_index(items[0], len(old))]
            elements = _elements(raw[at:])
            rebuilt = [elements[_index(item, len(elements))] if _INT.fullmatch(item) else item for item in items[1:]]
            pieces.append(raw[:at] + '[' + ','.join(rebuilt) + ']')
        else:
            pieces.append(old[_index(op, len(old))][1])
    return '{' + ','.join(pieces) + '}'


def _index(raw: str, size: int | None) -> int:
    if not _INT.fullmatch(raw):
        raise ValueError(f'expected an index, got {raw[:80]!r}')
    value = int(raw)
    if value < 0 or (size is not None and value >= size):
        raise ValueError(f'index {value} out of range')
    return value


def _members(text: str) -> list[tuple[str, str, int]]:
    """The top-level members of a compact JSON object: `(key, raw "key":value, offset of value in raw)`."""
    if not text.startswith('{'):
        raise ValueError('not a JSON object')
    members: list[tuple[str, str, int]] = []
    if text == '{}':
        return members
    end = len(text) - 1
    start = 1
    try:
        while True:
            if not text.startswith('"', start):
                raise ValueError('not a compact JSON object')
            key, colon = _scan(text, start)
            if not text.startswith(':', colon):
                raise ValueError('not a compact JSON object')
            stop = _scan(text, colon + 1)[1]
            members.append((key, text[start:stop], colon + 1 - start))
            if stop == end and text[stop] == '}':
                return members
            if not text.startswith(',', stop):
                raise ValueError('not a compact JSON object')
            start = stop + 1
    except StopIteration as error:
        raise ValueError(f'not JSON at {error.value}') from None


def _elements(text: str) -> list[str]:
    """The raw elements of a compact JSON array."""
    if not text.startswith('['):
        raise ValueError('not a JSON array')
    if text == '[]':
        return []
    elements: list[str] = []
    end = len(text) - 1
    start = 1
    try:
        while True:
            stop = _scan(text, start)[1]
            elements.append(text[start:stop])
            if stop == end and text[stop] == ']':
                return elements
            if not text.startswith(',', stop):
                raise ValueError('not a compact JSON array')
            start = stop + 1
    except StopIteration as error:
        raise ValueError(f'not JSON at {error.value}') from None
