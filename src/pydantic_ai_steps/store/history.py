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
(`is`) to last time cannot have changed unless mutated deep inside a value in place; anything
else is a *candidate*, re-serialized and compared by content. The one value pydantic-ai does
mutate in place is a request's `metadata` dict (it adds its own keys there after a boundary, when
counting tokens before a request), so the `metadata` of the newest messages is also remembered as
JSON text, and a message whose text differs is a candidate.
Holding references (not `id()`s) keeps the compared objects alive, so an address can never be
reused by a new value and fool the comparison. Only the newest positions are compared value by
value (`TAIL`); the settled rest by object identity, in one C-level pass. Cost per boundary:
that pass, a few pointer comparisons, and serializing the candidates only.

A changed version of a message is usually a stamped copy of the previous one, differing in a few
top-level fields. So a log entry's text is either a full message JSON or a *patch*: the new
version spelled as references into an earlier full text of the same position (`store/patch.py`
has the format). Writers keep the last full text of the newest positions in memory
(`PatchBase`, `TAIL` positions per run), so patching never reads the store; readers resolve a
patch against its base entry (`log_entries`), which lies below it in the same log and position,
so every reader that loads a snapshot's entries loads the base too. A stamped request whose parts
are those its base was serialized from is not serialized again: its text is the base's `parts`
member and its own other fields (`PatchBase.restamped`), the tool results being what costs to
serialize.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import pydantic
import pydantic_core
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse

from .patch import restamp, scalar_members

if TYPE_CHECKING:
    from _hashlib import HASH

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


_PARTS = {0: {'parts'}}
"""The first request's `parts`, as `include=` or `exclude=` of a one-request list."""
_PARTS_FIRST = '{"parts":'


def request_tail(request: ModelRequest) -> str | None:
    """What `message_to_json(request)` spells after its `parts` member: `,"timestamp":...}`.

    pydantic-ai stamps a request's own fields after a boundary saved it; its parts stay as they
    were, and they are what costs to serialize (tool results), so a stamped version serializes
    only the other fields. `None` if it has none.
    """
    text = _REQUESTS.dump_json([request], exclude=_PARTS)[1:-1].decode()
    return ',' + text[1:] if len(text) > 2 else None


_TAIL_KEYS = tuple(f'"{field.name}":' for field in dataclasses.fields(ModelRequest) if field.name != 'parts')
"""How the members after a request's `parts` start, in the order pydantic serializes them."""
_TAIL_START = ',' + _TAIL_KEYS[0]
_SCALAR_TAIL = frozenset({'timestamp', 'instructions', 'kind', 'run_id', 'conversation_id', 'state'})
"""Fields after a request's parts whose values serialize as JSON scalars (strings, `null`)."""
_SCALARS_BUT_METADATA = {key[1:-2] for key in _TAIL_KEYS} - {'metadata'} <= _SCALAR_TAIL
"""Whether every field after the parts but `metadata` is a scalar: a field added to `ModelRequest`
later turns the checked path of `request_to_json` back on until it is known here."""


def request_to_json(request: ModelRequest) -> tuple[str, int]:
    """`message_to_json(request)`, and where its `parts` member ends in it, so a later stamped
    version of the request can reuse the parts' text without scanning it for its end (`PatchBase.split`).

    The fields after the parts are scalars as a rule: they are found from the end, where the last
    `,"timestamp":` starts them (no scalar value can spell that unescaped). With an object among
    them (`metadata`), the members found must be exactly the request's field names, or the parts
    are serialized a second time, alone, to measure them.
    """
    text = _REQUESTS.dump_json([request])[1:-1].decode()
    split = text.rfind(_TAIL_START)
    if split > 0 and request.metadata is None and _SCALARS_BUT_METADATA:
        return text, split
    members = scalar_members(text[split:]) if split > 0 else None
    if members is not None and len(members) == len(_TAIL_KEYS) and all(map(str.startswith, members, _TAIL_KEYS)):
        return text, split
    return text, len(_REQUESTS.dump_json([request], include=_PARTS)[1:-2].decode())


def part_values(message: ModelMessage) -> list[object]:
    """References to everything the framework reassigns on a message's parts."""
    values: list[object] = []
    try:
        for part in message.parts:
            values += _READERS[type(part)](part)
    except AttributeError:  # a field never assigned
        return [value for part in message.parts for value in field_values(part)]
    return values


class _Readers(dict[type, Callable[[Any], tuple[object, ...]]]):
    """Per class, a function reading the values of its dataclass fields (what serializes), by name.

    Not `vars()`: asked for its `__dict__`, a CPython object trades the attribute values it keeps
    inline for a dict of its own, and every later attribute read of it takes the slow path. The
    history tracker looks at every message once, and pydantic-ai reads every message of the
    history at every step. A reader raises `AttributeError` for a field never assigned.
    """

    def __missing__(self, cls: type) -> Callable[[Any], tuple[object, ...]]:
        read = self[cls] = _reader(cls)
        return read


def _reader(cls: type) -> Callable[[Any], tuple[object, ...]]:
    names = [field.name for field in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        (name,) = names
        return lambda value: (getattr(value, name),)
    return _attributes


_READERS = _Readers()


def field_values(value: object) -> tuple[object, ...]:
    """References to the values of an object's dataclass fields (its attributes, if one was never assigned)."""
    try:
        return _READERS[type(value)](value)
    except AttributeError:  # a field never assigned
        return _attributes(value)


def _attributes(value: object) -> tuple[object, ...]:
    return tuple(vars(value).values())


def messages_from_json(texts: Iterable[str]) -> list[ModelMessage]:
    """Rebuild a history from per-message JSON texts without re-encoding them one by one."""
    return ModelMessagesTypeAdapter.validate_json('[' + ','.join(texts) + ']')


def messages_to_json(messages: Sequence[ModelMessage]) -> str:
    return ModelMessagesTypeAdapter.dump_json(list(messages)).decode()


def content_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def parts_hash(text: str, split: int) -> HASH:
    """The hash state of `text[:split]`, a request's JSON up to the end of its `parts`."""
    return hashlib.sha256(text[:split].encode())


def digest_after(parts: HASH, text: str, split: int) -> bytes:
    """`content_digest(text)` for a text that starts with the `parts` hashed in `parts`: the large
    member (tool results) is hashed once however often its request is stamped."""
    state = parts.copy()
    state.update(text[split:].encode())
    return state.digest()


def stored_digest(text: str) -> bytes:
    """The digest of a message as stored, its payloads moved out (markers, literals), kept apart from
    `content_digest` of a message's own JSON: a message may spell what another version was stored as."""
    return hashlib.sha256(b'\0stored\0' + text.encode()).digest()


def _shape(message: ModelMessage) -> list[object]:
    """References to everything the framework reassigns on a message or its parts, in one list."""
    values = list(field_values(message))
    values += part_values(message)
    return values


def _metadata_text(message: ModelMessage) -> object:
    """`message.metadata` as JSON text (`None` without any); what cannot be serialized equals nothing."""
    if message.metadata is None:
        return None
    try:
        return pydantic_core.to_json(message.metadata, bytes_mode='base64')
    except (ValueError, RecursionError):  # PydanticSerializationError is a ValueError
        return object()


def _same(left: list[object], right: list[object]) -> bool:
    """Identity of every value; `map`/`all` keep this loop in C."""
    return len(left) == len(right) and all(map(operator.is_, left, right))


TAIL = 4
"""How many of the newest positions of the last write are re-checked value by value.

pydantic-ai changes in place only the newest message of the last boundary (its pending
tool-return request, stamped when it is sent, and maybe its `metadata` dict written into);
`tests/step_persistence/test_stamps.py` watches real runs for that, on every pydantic-ai the suite
runs, and allows 2. Four keeps one more tool cycle beyond it. Older positions are compared by
object identity alone, in C, so a boundary costs the same however long the history is. A history
processor that rewrites older messages builds new objects (as pydantic-ai's own do) and is seen;
one that assigned into an old message's fields in place would not be, so don't.
"""

StoredT = TypeVar('StoredT')


@dataclass
class PatchBase:
    """A full message text the log holds at `index`: what a later version of its position can patch.

    Not frozen (a frozen dataclass sets each field through `object.__setattr__`): a boundary makes
    one per message it writes in full, and nothing changes one after it is made."""

    index: int
    text: str
    parts: list[object] | None = field(default=None, compare=False)
    """`part_values` of the request `text` was serialized from: a version with the same parts
    spells them as `text` does (see `request_tail`)."""
    split: int | None = field(default=None, compare=False)
    """Where the request's `parts` member ends in `text`, when its writer knows (`request_to_json`)."""
    moved: bool = field(default=False, compare=False)
    """Whether `text` is the request's JSON with payloads moved to the media store (or caller values
    wrapped as literals): its parts spell markers, not the request's own values."""
    parts_hash: HASH | None = field(default=None, compare=False)
    """`text` up to `split` hashed, unless `moved`: a stamped version's `content_digest` hashes only its tail."""

    def __getstate__(self) -> dict[str, object]:
        """Without `parts_hash`, which `hashlib` cannot pickle: a copied store hashes those parts again."""
        return {**self.__dict__, 'parts_hash': None}

    def restamped(self, request: ModelRequest) -> tuple[str, str, int] | None:
        """This text with `request`'s fields after the parts, a patch of this text spelling it, and
        where the parts end in it, when the request differs from this text's only after the parts;
        `None` otherwise (the caller serializes the whole request). Unless `moved`, the text is
        `request`'s JSON."""
        if self.parts is None or not self.text.startswith(_PARTS_FIRST) or not _same(self.parts, part_values(request)):
            return None
        tail = request_tail(request)
        restamped = (
            restamp(self.index, self.text, tail, self.split, serialized=self.split is not None)
            if tail is not None
            else None
        )
        if tail is None or restamped is None:
            return None
        text, patch = restamped
        return text, patch, len(text) - len(tail)


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
    metadata: dict[int, object] = field(default_factory=dict[int, object])
    """`_metadata_text` of the stored version of each of the last `TAIL` positions (`None`: no metadata)."""
    weights: list[int] = field(default_factory=list[int])
    """Roughly how many bytes each position's message holds alive (its text, its binary payloads)."""
    weight: int = 0
    generation: int = 0
    """How many writes of the run this process has recorded: a delta taken before the last one is stale."""


@dataclass
class HistoryDelta(Generic[StoredT]):
    """The candidates of one boundary: positions whose message may differ from what is stored."""

    run_id: str
    messages: list[ModelMessage]
    candidates: list[int]
    previous: RunHistory[StoredT] | None
    """`None` when this process has not written the run before (so every position is a candidate)."""
    generation: int = 0
    """`previous.generation` when the delta was taken."""
    shapes: dict[int, list[object]] = field(default_factory=dict[int, list[object]])
    """`_shape` of each candidate, taken before it is serialized: what a later change is judged against."""
    metadata: dict[int, object] = field(default_factory=dict[int, object])
    """`_metadata_text` of each candidate (`None`: no metadata), taken with its shape."""

    def stored_at(self, position: int) -> StoredT | None:
        if self.previous is None or position >= len(self.previous.stored):
            return None
        return self.previous.stored[position]

    def base_at(self, position: int) -> PatchBase | None:
        """The newest full text the log holds for `position`, if this process still knows it."""
        return None if self.previous is None else self.previous.bases.get(position)

    def weight_at(self, position: int) -> int:
        """What the stored version of `position` was estimated to hold alive, in bytes (0 if unknown)."""
        if self.previous is None or position >= len(self.previous.weights):
            return 0
        return self.previous.weights[position]


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
            shapes = {position: _shape(message) for position, message in enumerate(current)}
            metadata = {position: _metadata_text(message) for position, message in enumerate(current)}
            return HistoryDelta(run_id, current, list(shapes), None, shapes=shapes, metadata=metadata)
        seen = previous.messages
        overlap = min(len(current), len(seen))
        settled = max(0, len(seen) - TAIL) if overlap == len(seen) else 0
        if settled and not all(map(operator.is_, itertools.islice(seen, settled), current)):
            settled = 0  # the history was rewritten: check every position
        shapes: dict[int, list[object]] = {}
        metadata: dict[int, object] = {}
        for position in range(settled, len(current)):
            message = current[position]
            shape = _shape(message)
            text = _metadata_text(message)
            if position < overlap:
                known = previous.shapes[position]
                if (
                    seen[position] is message
                    and known is not None
                    and _same(known, shape)
                    and text == previous.metadata.get(position)
                ):
                    continue
            shapes[position] = shape
            metadata[position] = text
        return HistoryDelta(run_id, current, list(shapes), previous, previous.generation, shapes, metadata)

    def commit(
        self,
        delta: HistoryDelta[StoredT],
        stored: dict[int, StoredT],
        log_size: int,
        bases: Mapping[int, PatchBase] | None = None,
        weights: Mapping[int, int] | None = None,
    ) -> None:
        """Record a successful write: `stored` maps every candidate position to what is now stored.

        `bases` are the full texts this write appended (patches keep their position's base); the
        run keeps the newest base of each of its last `TAIL` positions. `weights` estimates the
        bytes each written position's message holds. The run's record is updated in place, so a
        boundary costs what it wrote, not the history's length.
        """
        run_id = delta.run_id
        run = delta.previous
        if run is None:
            self.forget(run_id)  # what a concurrent first write recorded meanwhile: this one covers every position
            run = RunHistory[StoredT]()
        elif self._runs.get(run_id) is not run or run.generation != delta.generation:
            # Another write of this run was recorded after this delta was taken: what the store
            # holds per position is no longer known here, so the next save rewrites in full.
            self.forget(run_id)
            return
        else:
            self._weight -= run.weight
        count = len(delta.messages)
        tail = count - TAIL
        values = cast('list[StoredT | None]', run.stored)
        # `bases` and `metadata` hold only positions of the last write's window (its last `TAIL`);
        # those that leave it go (as a rule the two oldest), so a boundary never walks the history.
        for position in range(max(0, len(values) - TAIL), len(values)):
            if not tail <= position < count:
                run.bases.pop(position, None)
                run.metadata.pop(position, None)
        if len(values) > count:
            run.weight -= sum(run.weights[count:])
            del run.shapes[count:], values[count:], run.weights[count:]
        added = count - len(values)
        run.shapes += [None] * added
        values += [None] * added
        run.weights += [0] * added
        for position, value in stored.items():
            run.shapes[position] = delta.shapes[position]
            values[position] = value
            if position >= tail:
                run.metadata[position] = delta.metadata.get(position)
            if weights is not None:
                size = weights.get(position, 0)
                run.weight += size - run.weights[position]
                run.weights[position] = size
        if bases:
            for position, base in bases.items():
                if tail <= position < count:
                    run.bases[position] = base
        run.messages = delta.messages
        run.log_size = log_size
        run.generation += 1
        self._runs.pop(run_id, None)
        self._runs[run_id] = run
        self._weight += run.weight
        while len(self._runs) > 1 and (len(self._runs) > self._max_runs or self._weight > self._max_bytes):
            _, evicted = self._runs.popitem(last=False)
            self._weight -= evicted.weight

    def forget(self, run_id: str) -> None:
        """Drop what is known about a run: it has ended, or a write's outcome is unknown."""
        gone = self._runs.pop(run_id, None)
        if gone is not None:
            self._weight -= gone.weight
