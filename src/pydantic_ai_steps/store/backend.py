"""The interface a storage backend implements: I/O only.

A backend stores rows that the kernel (`store.base.StepStoreBase`) has already encoded, and
returns rows the kernel decodes. It decides nothing: not what is new in a history, not which
snapshots retention keeps, not whether a record is valid or readable. What it must get right is
the unit of a write (`commit`) and the verbatim storage of message-log texts.

The contract, checked by `pydantic_ai_steps.testing.backend.BackendConformance`:

- `commit(batch)` applies, in this order and as one unit where the database allows: the run
  registration, the snapshot (claim its idempotency key, check where the run's message log
  ends, append the log entries, insert the snapshot row), the tool effects (upsert by
  `(run_id, tool_call_id)`; an entry already stored keeps its resolution fields, whatever the row
  says: see `resolve_effect`), the events (insert, skipping a `(run_id, idempotency_key)` already
  present), then the closings (a run's `status` and `ended_at`). It answers:
  - `RunAlreadyExistsError` for a registration whose run id is taken: nothing written;
  - `RunNotFoundError` for records of a run that is not registered (never, or deleted): nothing
    written; a batch that registers the run may carry its records;
  - `STALE` when `snapshot.expected_log_size` is set and the log does not end there (another
    writer extended it): nothing written;
  - `SUPPRESSED` when the snapshot's idempotency key was claimed before (claims outlive the
    snapshot), whatever `expected_log_size` says (a replay comes after its own appends): the
    snapshot and its appends are not written, the rest of the batch is;
  - otherwise the log size after the appends (or `None` when the batch has no snapshot).
- `resolve_effect(run_id, tool_call_id, resolution, overwrite=)` writes one entry's resolution
  fields (`RESOLUTION_FIELDS`) and nothing else, as one conditional write: only while the entry is
  `started` and, unless `overwrite`, has no resolution. It answers whether it wrote. Never a read
  then a write: a `completed` upsert racing it keeps its status, and of two racing resolutions one
  is written and the other answered `False`. The kernel decides what to resolve and what a refusal
  means.
- Log texts are opaque strings and are stored byte for byte: no JSON column that reorders keys,
  no parsed sub-document. Patches address members of an earlier text by position.
- The appends of one snapshot take the next indices of the run's log, contiguously, starting at
  the log end (`expected_log_size` when given).
- Fetches return what is stored; a record the backend cannot even parse (a torn line) comes back
  as `Damaged`, so the kernel can skip it with a warning.
- A backend whose storage limits the size of one entry (MongoDB's 16 MiB documents) may declare
  `max_text_bytes: int`, the longest log text (UTF-8 bytes) it stores. The kernel then moves
  payloads out of a longer message text (to the media store, whatever their size) or raises
  `RecordTooLargeError` before anything is written. It is an optional attribute, not a member of
  the `Backend` protocol: the kernel reads it with `getattr`, so backends without a limit say nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .._errors import InvalidRecordError
from .._records import RunQuery, RunStatus, SnapshotState
from .codec import RESOLUTION_FIELDS, Encoding, Row
from .log_entries import LogEntry

__all__ = [
    'RESOLUTION_FIELDS',
    'STALE',
    'SUPPRESSED',
    'Backend',
    'Closing',
    'CommitOutcome',
    'Damaged',
    'LogEntry',
    'LogSlice',
    'Probe',
    'Row',
    'SnapshotRow',
    'SnapshotWrite',
    'WriteBatch',
    'resolved_effect',
    'upserted_effect',
]

STALE: Literal['stale'] = 'stale'
"""A commit outcome: the run's log does not end where the batch expected; nothing was written."""
SUPPRESSED: Literal['suppressed'] = 'suppressed'
"""A commit outcome: the snapshot's idempotency key was claimed before; the snapshot was not written."""
CommitOutcome = int | None | Literal['stale', 'suppressed']
"""The log size after the snapshot's appends, `None` without a snapshot, or why no snapshot was written."""


@dataclass(frozen=True, slots=True)
class Damaged:
    """A stored record the backend could not parse at all. The kernel logs it and skips it."""

    where: str
    """Names the record for the warning: a file and line, a table and key."""
    reason: str


@dataclass(kw_only=True, slots=True)
class SnapshotWrite:
    """A snapshot and the message-log entries it needs, ready to store."""

    run_id: str
    row: Row
    """The snapshot's fields (`codec.SNAPSHOT_FIELDS`); the backend sets `row['log_size']`."""
    appends: Sequence[tuple[int, str]]
    """`(position, text)` of each new entry, stored at the next log indices in this order, verbatim."""
    expected_log_size: int | None
    """Where this writer last saw the log end; `None`: wherever it ends now."""
    key: str | None
    """The idempotency key to claim (also in `row`)."""


@dataclass(frozen=True, slots=True)
class Closing:
    """A run's closing event was written: its status and when."""

    run_id: str
    status: RunStatus
    ended_at: Any
    """In the backend's encoding (ISO text or a `datetime`)."""


@dataclass(kw_only=True, slots=True)
class WriteBatch:
    """Everything one `commit` writes, encoded. Empty parts are empty, never missing."""

    run: Row | None = None
    snapshot: SnapshotWrite | None = None
    tool_effects: Sequence[Row] = ()
    events: Sequence[Row] = ()
    closings: Sequence[Closing] = ()
    run_ids: frozenset[str] = field(default_factory=frozenset[str])
    """Every run the batch writes records for (the registered one included)."""

    @property
    def replay_safe(self) -> bool:
        """Whether committing the batch twice stores what committing it once does (or refuses, never duplicates).

        A backend may then retry it after a connection died with the outcome unknown. Keyed events
        and a keyed snapshot apply once; effects are upserted; a registration replayed after it
        landed is refused as a taken run id (the capability recognises its own `registration_id`).
        An event or a snapshot without a key could be stored twice.
        """
        if any(event.get('idempotency_key') is None for event in self.events):
            return False
        return self.snapshot is None or self.snapshot.key is not None

    @property
    def named_runs(self) -> str:
        """The batch's runs for an error message: `'a', 'b'`."""
        return ', '.join(repr(run_id) for run_id in sorted(self.run_ids))

    def unencodable(self, where: str, error: BaseException) -> InvalidRecordError:
        """The refusal of a batch holding a lone surrogate, which UTF-8 storage cannot take (`where`:
        `'stored in SQLite'`), said without quoting the text that holds it."""
        return InvalidRecordError(
            f'a text of this write for run {self.named_runs} cannot be {where}: {error}; '
            'nothing of the write was stored'
        )


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """One stored snapshot as found: its number, its fields, and (older layouts) its texts."""

    seq: int
    row: Row | Damaged
    texts: Sequence[str] | Damaged | None = None
    """Set by a backend reading a layout that kept the history inline or elsewhere; `None` when
    the row names its history in the message log (`message_count`, `log_size`)."""


@dataclass(frozen=True, slots=True)
class LogSlice:
    """Entries of a run's message log, and the indices below the slice's end known to be unreadable."""

    entries: Sequence[LogEntry]
    missing: tuple[range, ...] = ()
    """Index ranges that held entries the backend could not read (a damaged line, a row of other
    types); entries removed on purpose (compaction) are not missing."""
    readable_end: int | None = None
    """Where the readable log ends, for a backend that can lose its tail (a torn or lost last line):
    no entry at or beyond it could be read. `None`: nothing is known to be lost."""


def log_slice(rows: Iterable[tuple[object, object, object]]) -> LogSlice:
    """A slice of `(log_index, position, text)` rows as read. A row whose index is an int but whose
    position or text is of another type (edited by hand, or by another program) is missing, so the
    snapshots that need it read as damaged; a row without an int index names no entry."""
    entries: list[LogEntry] = []
    missing: list[range] = []
    for index, position, text in rows:
        if type(index) is not int:
            continue
        if type(position) is int and type(text) is str:
            entries.append(LogEntry(index, position, text))
        else:
            missing.append(range(index, index + 1))
    return LogSlice(entries, tuple(missing))


@dataclass(frozen=True, slots=True)
class Probe:
    """What is at a backend's location, for tools that must not create a store by looking (the CLI)."""

    exists: bool
    """Something is there (a file, a directory, a database with tables of this layout or others)."""
    step_store: bool
    """It holds a step store (possibly an empty one)."""
    size_bytes: int | None = None
    """What it takes on disk or on the server; `None` when the backend cannot tell."""
    detail: str = ''
    """Why it is not a step store, when it exists and is not (or why it could not be read)."""
    readable: bool = True
    """`False` when something is there that this process cannot read (permissions, a read-only
    directory beside a WAL database): whether it is a step store is not known."""


@runtime_checkable
class Backend(Protocol):
    """The storage primitives behind every `StepStoreBase` store. All methods are async."""

    encoding: Encoding
    """How this backend wants values represented in the rows it is given and returns."""

    async def commit(self, batch: WriteBatch) -> CommitOutcome: ...

    async def fetch_run(self, run_id: str) -> Row | Damaged | None:
        """The run's row with `status` and `ended_at` (both `None` while it has not closed)."""
        ...

    async def fetch_runs(self, query: RunQuery) -> Sequence[Row | Damaged]:
        """Rows of the runs matching `query`, ordered by `started_at` and, among equal start times, by
        registration (both reversed for newest first), cut to `query.limit`. A backend may return more
        rows than match, or rows in registration order alone, only when it honours no limit: the
        kernel filters, sorts by `started_at` keeping the given order among equal ones, and cuts
        again, so a backend can push down what it can index."""
        ...

    async def fetch_events(self, run_id: str) -> Sequence[Row | Damaged]:
        """The run's events in append order."""
        ...

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> Sequence[Row | Damaged]:
        """The run's tool effects (one, or those `started` without a resolution), in the order the
        calls were first recorded."""
        ...

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        """Set the entry's resolution fields to `resolution` (a field it leaves out is cleared), leaving
        every other field as stored, if the entry is `started` and (unless `overwrite`) unresolved, in
        one conditional write. Whether the entry was changed."""
        ...

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> Sequence[SnapshotRow]:
        """The run's snapshots, newest first unless `oldest_first`; only `complete` ones unless
        `include_interrupted`; only seqs below `below_seq` when given."""
        ...

    async def fetch_snapshot_states(self, run_id: str) -> Sequence[tuple[int, SnapshotState | str]]:
        """`(seq, state)` of every snapshot of the run, for retention."""
        ...

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        """The run's log entries with `index < below_index` and `position < positions_below`."""
        ...

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        """Remove these snapshots (their idempotency-key claims stay)."""
        ...

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        """Remove every record of these runs, each run at once, and return the ids that existed."""
        ...

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        """Remove these entries of a run's message log (superseded versions no snapshot needs)."""
        ...

    def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        """Every stored text that contains `needle` (message log, inline histories of older
        layouts): media garbage collection finds the blobs still referenced this way."""
        ...

    async def reclaim_space(self) -> None:
        """Give freed space back to the file system where the storage keeps it (SQLite's free pages)."""
        ...

    async def probe(self) -> Probe:
        """What is at the backend's location, creating nothing."""
        ...

    async def aclose(self) -> None:
        """Release connections and files. Idempotent."""
        ...


@runtime_checkable
class TidiesLeftovers(Protocol):
    """A backend whose writes can leave something behind when their process is killed midway (the
    File store's temporary files). Whole-store maintenance (`prune`, `collect_garbage`, never a dry
    run) asks it to remove what no reader or live writer can still need."""

    async def tidy_leftovers(self) -> None: ...


def upserted_effect(row: Row, stored: Row | None) -> Row:
    """What an effect upsert leaves for a backend that keeps whole rows (a dict, a JSON line): `row`,
    with the resolution fields of the entry already `stored`, if any."""
    if stored is None:
        return row
    kept = {name: value for name, value in row.items() if name not in RESOLUTION_FIELDS}
    kept.update((name, stored[name]) for name in RESOLUTION_FIELDS if name in stored)
    return kept


def resolved_effect(stored: Row, resolution: Row) -> Row:
    """The `stored` entry with its resolution fields replaced by `resolution`'s, for whole-row backends."""
    kept = {name: value for name, value in stored.items() if name not in RESOLUTION_FIELDS}
    kept.update((name, resolution[name]) for name in RESOLUTION_FIELDS if name in resolution)
    return kept
