"""`FileStepStore`: one directory per run, append-only JSON lines, snapshots as small files.

Layout under the store directory (SPEC section 4, plus the files that make it cheap and safe):

```
<dir>/_index/runs.jsonl           one line per registered run: the lineage index list_runs reads
<dir>/<run_id>/run.json           the RunRecord (written once, exclusively)
<dir>/<run_id>/events.jsonl       one StepEvent per line
<dir>/<run_id>/tool_effects.jsonl one ToolEffectRecord per line; the last line of a call wins
<dir>/<run_id>/messages.jsonl     the run's message log: {"i": log index, "p": position, "m": message}
<dir>/<run_id>/snapshots/<seq>.json  one snapshot: its fields plus {"message_count", "log_size"}
<dir>/<run_id>/snapshot-keys.jsonl   one line per saved snapshot: {"seq", "state", "key"}
<dir>/media/                      the default DiskMediaStore
```

Why it is shaped like this:

- *Message-once.* A snapshot file holds two numbers instead of its history; the history lives in
  `messages.jsonl`, written once per message version (see `_history`), so a boundary costs the
  same at step 500 as at step 5.
- *Per-process caches, checked against the files.* Idempotency keys, the tool-effect ledger, the
  snapshot ledger and the lineage index are kept in memory and refreshed by reading only the bytes
  appended since the last look (the byte offset is remembered), so no call re-reads a whole file
  on the hot path, yet writes by other processes are seen.
- *Crash safety.* `run.json` and snapshot files are written to a temporary file in the same
  directory and moved into place (`os.link`, which also refuses to overwrite, or `os.replace`).
  Every append is one `write` of whole lines to a file opened with `O_APPEND`, under an advisory
  `flock` so appenders in several processes never interleave or race a check-then-append. A file
  that ends in a torn line (a process died inside a `write`) gets a newline before the next
  append, so the damage stays confined to that line. Readers skip torn or garbled lines and
  unreadable snapshot files with a logged warning and fall back to the newest readable snapshot
  (SPEC 3.6); they never raise for damaged data.
- *Indexed lineage.* `list_runs` reads `_index/runs.jsonl` (incrementally) instead of every run
  directory. A registration appends its index line *before* it claims `run.json`, so a crash can
  leave an index line for a run that does not exist (ignored: `run.json` decides) but never a run
  missing from the index. A missing index is rebuilt from the run directories; a garbled line
  triggers a scan that appends lines for any run the index lacks, then a marker so the repair is
  done once.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import re
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from ..._files import fsync_dir
from ...media._protocol import MediaStore
from .._codec import (
    event_from_dict,
    event_to_dict,
    optional_str,
    required_int,
    run_from_dict,
    run_to_dict,
    snapshot_state,
    timestamp,
    tool_effect_from_dict,
    tool_effect_to_dict,
)
from .._errors import RunAlreadyExistsError, check_file_safe_run_id, check_max_snapshots, check_threshold
from .._history import LogEntry, resolve_history
from .._message_log import STALE, SUPPRESSED, MessageLog, PreparedSnapshot, SnapshotMeta, WriteOutcome
from .._records import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, ToolEffectRecord
from .._retention import snapshots_to_keep
from ._offload import WouldBlock, held, may_wait, run_blocking, run_soon

if sys.platform != 'win32':
    import fcntl

    def _lock_fd(fd: int) -> None:
        """`flock` the file; when the caller may not wait (see `_offload`), only if it is free."""
        if may_wait():
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WouldBlock from None

else:  # pragma: no cover - Windows has no flock; see the class docstring

    def _lock_fd(fd: int) -> None:
        del fd


__all__ = ['FileStepStore']

logger = logging.getLogger('pydantic_ai_steps.file_store')

INDEX_DIR = '_index'
INDEX_FILE = 'runs.jsonl'
RUN_FILE = 'run.json'
EVENTS_FILE = 'events.jsonl'
EFFECTS_FILE = 'tool_effects.jsonl'
MESSAGES_FILE = 'messages.jsonl'
SNAPSHOT_LEDGER_FILE = 'snapshot-keys.jsonl'
SNAPSHOTS_DIR = 'snapshots'

_MAX_CACHED_RUNS = 256
_SEQ_STEM = re.compile(r'[0-9]{1,18}')
_LOG_PREFIX = re.compile(rb'\{"i":([0-9]+),"p":([0-9]+),"m":')


class FileStepStore:
    """A `StepStore` in a directory tree of JSON files, safe for several processes at once.

    ```python
    from pydantic_ai_steps.step_persistence import FileStepStore

    store = FileStepStore('runs', max_snapshots_per_run=8)
    ```

    `max_snapshots_per_run` bounds the snapshots kept per run (the N newest plus the newest
    `complete` one). Payloads of `media_threshold_bytes` or more go to `media_store` (default a
    `DiskMediaStore` in `<directory>/media`; `None` keeps them inline). Run ids must match
    `[A-Za-z0-9_.-]{1,200}` without `..`, because they name directories.

    What survives what:

    - *A process crash* (exception, `SIGKILL`, OOM kill) loses nothing a store call had returned
      from: every write is in the operating system's cache the moment the call returns. A call cut
      short leaves at most a torn last line or a stray temporary file, which readers skip.
    - *Power loss or a kernel crash* with `durable=False` (the default) can lose the writes of
      the last few seconds, and the file system may keep some of them but not others. Readers still
      never raise: a snapshot whose messages did not all reach the disk is skipped for an older
      complete one. A run whose index line was lost no longer shows in `list_runs`; delete
      `<directory>/_index` to have it rebuilt from the run directories.
    - With `durable=True` every call `fsync`s the files it wrote, and the directory when it
      created an entry, before returning, so a returned call survives power loss too (on a disk
      that honours flushes). This costs a disk flush per call: milliseconds, not microseconds.

    Several processes may share one directory. Appends and snapshot writes to the same run are
    serialized with `flock` (POSIX only: on Windows, keep each run to one process).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | Literal['auto'] | None = 'auto',
        media_threshold_bytes: int = 65536,
        durable: bool = False,
    ) -> None:
        self._root = Path(directory)
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        threshold = check_threshold(media_threshold_bytes)
        if media_store == 'auto':
            from ...media.stores.disk import DiskMediaStore

            media_store = DiskMediaStore(self._root / 'media', durable=durable)
        self.media_store: MediaStore | None = media_store
        self.durable = durable
        self._log = MessageLog(media_store, threshold)
        self._runs: OrderedDict[str, _RunState] = OrderedDict()
        self._runs_lock = threading.Lock()
        self._index = _Index(self._root)

    @property
    def directory(self) -> Path:
        """The directory this store writes under."""
        return self._root

    def __repr__(self) -> str:
        return (
            f'FileStepStore({str(self._root)!r}, max_snapshots_per_run={self.max_snapshots_per_run}, '
            f'media_store={self.media_store!r}, durable={self.durable})'
        )

    # --- runs -------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        check_file_safe_run_id(record.run_id)
        await run_soon(self._register_run, copy.copy(record), inline=not self.durable)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        check_file_safe_run_id(run_id)
        return await run_soon(self._get_run, run_id)

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        return await run_blocking(self._index.list_runs, parent_run_id, conversation_id, self.durable)

    # --- events -----------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        await self._append_events([event])

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        check_file_safe_run_id(run_id)
        return await run_blocking(self._list_events, run_id)

    # --- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        check_file_safe_run_id(snapshot.run_id)
        await self._log.save(snapshot, self._write_prepared)

    async def write_records(
        self,
        *,
        run: RunRecord | None = None,
        snapshot: ContinuableSnapshot | None = None,
        tool_effects: Sequence[ToolEffectRecord] = (),
        events: Sequence[StepEvent] = (),
    ) -> None:
        """The run, the snapshot, the tool effects, then the events (see `RecordBatchStore`).

        Three files, written in that order, each with one append per run: a crash in between
        leaves a snapshot whose ledger entries still say `started` (the call is then reported as
        possibly done, which it is), never a closed entry whose result no snapshot holds.
        """
        if run is not None:
            await self.register_run(run)
        if snapshot is not None:
            await self.save_snapshot(snapshot)
        if tool_effects:
            await self._record_tool_effects(tool_effects)
        if events:
            await self._append_events(events)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        check_file_safe_run_id(run_id)
        return await self._log.newest_readable(
            run_id, lambda below: run_blocking(self._read_newest_snapshot, run_id, include_interrupted, below)
        )

    async def list_snapshots(self, *, run_id: str, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """Every retained snapshot of the run, oldest first; `interrupted` ones only if asked."""
        check_file_safe_run_id(run_id)
        return await self._log.all_readable(
            run_id, await run_blocking(self._read_all_snapshots, run_id, include_interrupted)
        )

    # --- tool effects -----------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._record_tool_effects([record])

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        check_file_safe_run_id(run_id)
        return await run_soon(self._get_tool_effect, run_id, tool_call_id)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        check_file_safe_run_id(run_id)
        return await run_soon(self._list_unresolved, run_id)

    async def _append_events(self, events: Sequence[StepEvent]) -> None:
        for run_id, batch in _by_run(events):
            lines = [(event.idempotency_key, _line(event_to_dict(event))) for event in batch]
            await run_soon(self._append_event_lines, run_id, lines, inline=not self.durable)

    async def _record_tool_effects(self, records: Sequence[ToolEffectRecord]) -> None:
        for run_id, batch in _by_run(records):
            copies = [copy.copy(record) for record in batch]
            await run_soon(self._append_effects, run_id, copies, inline=not self.durable)

    # === blocking bodies (worker threads, or the event loop when nothing waits) ===============

    def _run_dir(self, run_id: str) -> Path:
        return self._root / run_id

    def _state(self, run_id: str) -> _RunState:
        """This process's cache for a run (bounded LRU; a forgotten run is simply re-read)."""
        with self._runs_lock:
            state = self._runs.get(run_id)
            if state is None:
                state = self._runs[run_id] = _RunState(_RunPaths(self._root / run_id))
                while len(self._runs) > _MAX_CACHED_RUNS:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(run_id)
            return state

    def _drop_state(self, run_id: str) -> None:
        with self._runs_lock:
            self._runs.pop(run_id, None)

    def _register_run(self, record: RunRecord) -> None:
        run_dir = self._run_dir(record.run_id)
        target = run_dir / RUN_FILE
        if target.exists():
            raise RunAlreadyExistsError(record.run_id)
        created = _make_dir(run_dir)
        if created and self.durable:
            fsync_dir(self._root)
        line = _line(run_to_dict(record))
        # The index line goes first: a crash between the two leaves a line for a run that does
        # not exist (list_runs ignores it), never a run that the index cannot find.
        self._index.append(line, self.durable)
        if not _write_exclusive(target, line, self.durable):
            raise RunAlreadyExistsError(record.run_id)
        self._index.registered(record)

    def _get_run(self, run_id: str) -> RunRecord | None:
        path = self._run_dir(run_id) / RUN_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return run_from_dict(_object(raw))
        except ValueError:
            logger.warning('unreadable run record %s; using its index entry', path, exc_info=True)
            return self._index.record_from_index(run_id)

    def _append_event_lines(self, run_id: str, lines: list[tuple[str | None, bytes]]) -> None:
        """Append events as one write, skipping those whose idempotency key the run already has."""
        state = self._state(run_id)
        path = state.paths.events
        with held(state.lock), _append_locked(path, durable=self.durable) as appender:
            if any(key is not None for key, _ in lines):
                state.events.sync_fd(appender.fd, path, state.add_event_lines)
            fresh: list[bytes] = []
            new_keys: set[str] = set()
            for key, line in lines:
                if key is not None:
                    if key in state.event_keys or key in new_keys:
                        continue
                    new_keys.add(key)
                fresh.append(line)
            if not fresh:
                return
            appender.write(b''.join(fresh), self.durable)
            if state.events.follows(appender):
                state.event_keys.update(new_keys)

    def _list_events(self, run_id: str) -> list[StepEvent]:
        path = self._run_dir(run_id) / EVENTS_FILE
        events: list[StepEvent] = []
        for line in _read_lines(path):
            try:
                events.append(event_from_dict(_object(line)))
            except ValueError:
                logger.warning('skipping unreadable event line in %s: %r', path, line[:200], exc_info=True)
        return events

    def _append_effects(self, run_id: str, records: list[ToolEffectRecord]) -> None:
        state = self._state(run_id)
        path = state.paths.effects
        with held(state.lock), _append_locked(path, durable=self.durable) as appender:
            appender.write(b''.join(_line(tool_effect_to_dict(record)) for record in records), self.durable)
            if state.effects_tail.follows(appender):
                for record in records:
                    state.effects[record.tool_call_id] = record

    def _get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        state = self._state(run_id)
        with held(state.lock):
            state.effects_tail.sync_path(state.paths.effects, state.add_effect_lines)
            record = state.effects.get(tool_call_id)
            return copy.copy(record) if record is not None else None

    def _list_unresolved(self, run_id: str) -> list[ToolEffectRecord]:
        state = self._state(run_id)
        with held(state.lock):
            state.effects_tail.sync_path(state.paths.effects, state.add_effect_lines)
            return [copy.copy(record) for record in state.effects.values() if record.status == 'started']

    # --- snapshot writes --------------------------------------------------------------------

    async def _write_prepared(self, prepared: PreparedSnapshot) -> WriteOutcome:
        try:
            return await run_soon(self._write_snapshot, prepared, inline=not self.durable)
        except BaseException as error:
            # The outcome is unknown (maybe partly written): the next save rewrites from scratch,
            # and after an I/O error (say, the run directory was deleted) re-reads the run's files.
            self._log.forget(prepared.snapshot.run_id)
            if isinstance(error, OSError):
                self._drop_state(prepared.snapshot.run_id)
            raise

    def _write_snapshot(self, prepared: PreparedSnapshot) -> WriteOutcome:
        """Append the new message versions, write the snapshot file, ledger it, prune.

        Runs under the run's `flock` (taken on `messages.jsonl`), so writers of one run in any
        process take turns and the log index, the snapshot seq and the key check stay consistent.
        Returns the log size the snapshot resolves against, `'suppressed'` for a replayed key, or
        `'stale'` when the log grew behind this process's back.
        """
        snapshot = prepared.snapshot
        state = self._state(snapshot.run_id)
        paths = state.paths
        run_dir = paths.run_dir
        durable = self.durable
        with held(state.lock), _append_locked(paths.messages, durable=durable) as log:
            if not state.snapshots_dir_ready:
                if _make_dir(paths.snapshots) and durable:
                    fsync_dir(run_dir)
                state.snapshots_dir_ready = True
            self._sync_ledger(state)
            key = snapshot.idempotency_key
            if key is not None and key in state.snapshot_keys:
                return SUPPRESSED
            state.log_tail.sync_fd(log.fd, paths.messages, state.add_log_lines, torn=state.add_torn_log_line)
            if prepared.known_log_size is not None and prepared.known_log_size != state.next_log_index:
                return STALE
            if prepared.appends:
                base = state.next_log_index
                payload = b''.join(
                    _log_line(base + offset, position, text) for offset, (position, text) in enumerate(prepared.appends)
                )
                log.write(payload, durable)
                if state.log_tail.follows(log):
                    state.next_log_index = base + len(prepared.appends)
                else:  # pragma: no cover - only without flock (Windows) could another writer slip in
                    return STALE
            log_size = state.next_log_index
            seq = state.max_seq + 1
            body = _snapshot_body(snapshot, prepared.message_count, log_size)
            snapshots_dir = paths.snapshots
            while not _write_exclusive(snapshots_dir / f'{seq}.json', body, durable, sync_dir=False):
                seq += 1  # a file no ledger line names (a crash between the two writes): step over it
            if durable:
                fsync_dir(snapshots_dir)
            ledger_line = _line({'seq': seq, 'state': snapshot.state, 'key': key})
            with _append_locked(paths.ledger, lock=False) as ledger:
                ledger.write(ledger_line, durable)
                # Out of step only without flock (Windows): the next sync re-reads this line, harmlessly.
                state.ledger_tail.follows(ledger)
            state.max_seq = seq
            state.live[seq] = snapshot.state
            if key is not None:
                state.snapshot_keys.add(key)
            self._prune(state, snapshots_dir)
            return log_size

    def _sync_ledger(self, state: _RunState) -> None:
        """Catch up with the snapshot ledger; on first sight of a run, with its snapshot files too."""
        if not state.ledger_loaded:
            state.reset_snapshots()
        state.ledger_tail.sync_path(state.paths.ledger, state.add_ledger_lines)
        if state.ledger_loaded:
            return
        # First look at this run in this process: files the ledger does not name (written by the
        # upstream package, or before a crash cut the ledger line) must still count for seq
        # allocation and retention. Their state is read once from the file.
        snapshots_dir = state.paths.snapshots
        for seq in _snapshot_seqs(snapshots_dir):
            state.max_seq = max(state.max_seq, seq)
            if seq not in state.live:
                file_state = _peek_state(snapshots_dir / f'{seq}.json')
                if file_state is not None:
                    state.live[seq] = file_state
        present = set(_snapshot_seqs(snapshots_dir))
        for seq in [seq for seq in state.live if seq not in present]:
            del state.live[seq]
        state.ledger_loaded = True

    def _prune(self, state: _RunState, snapshots_dir: Path) -> None:
        keep = snapshots_to_keep(state.live.items(), self.max_snapshots_per_run)
        if keep is None:
            return
        for seq in [seq for seq in state.live if seq not in keep]:
            (snapshots_dir / f'{seq}.json').unlink(missing_ok=True)
            del state.live[seq]

    # --- snapshot reads ---------------------------------------------------------------------

    def _read_newest_snapshot(self, run_id: str, include_interrupted: bool, below: int | None) -> _FoundSnapshot | None:
        run_dir = self._run_dir(run_id)
        seqs = sorted(_snapshot_seqs(run_dir / SNAPSHOTS_DIR), reverse=True)
        older = (seq for seq in seqs if below is None or seq < below)
        return next(_resolved_snapshots(run_dir, older, include_interrupted), None)

    def _read_all_snapshots(self, run_id: str, include_interrupted: bool) -> list[_FoundSnapshot]:
        run_dir = self._run_dir(run_id)
        seqs = sorted(_snapshot_seqs(run_dir / SNAPSHOTS_DIR))
        return list(_resolved_snapshots(run_dir, seqs, include_interrupted))


_Recorded = TypeVar('_Recorded', StepEvent, ToolEffectRecord)


def _by_run(records: Sequence[_Recorded]) -> list[tuple[str, list[_Recorded]]]:
    """Records grouped by run (checking each run id), in their order within a run."""
    groups: dict[str, list[_Recorded]] = {}
    for record in records:
        check_file_safe_run_id(record.run_id)
        groups.setdefault(record.run_id, []).append(record)
    return list(groups.items())


# === per-run cache ============================================================================


@dataclass
class _Tail:
    """How far this process has read an append-only file (by byte offset and inode)."""

    offset: int = 0
    inode: int | None = None

    def reset(self) -> None:
        self.offset = 0
        self.inode = None

    def sync_path(self, path: Path, consume: _Consumer) -> None:
        """Read complete lines appended since the last sync (a partial last line is left for later)."""
        try:
            info = os.stat(path)
            if info.st_ino == self.inode and info.st_size == self.offset:
                return  # nothing new: the common case, one stat instead of open + fstat + close
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self.inode is not None:
                self.reset()
                consume([], True)
            return
        try:
            self._sync(fd, path, consume, None)
        finally:
            os.close(fd)

    def sync_fd(self, fd: int, path: Path, consume: _Consumer, torn: Callable[[], None] | None = None) -> None:
        """Like `sync_path`, on a file this process holds the `flock` of.

        No other writer can be mid-append, so a partial last line is a torn one: it is counted
        (`torn`) and closed with a newline so the next append starts on a fresh line.
        """
        self._sync(fd, path, consume, torn)

    def follows(self, appender: _Appender) -> bool:
        """After an append: advance past it if the cache had read everything before it."""
        if appender.size_before == self.offset and appender.inode == self.inode:
            self.offset = appender.size_after
            return True
        return False

    def _sync(self, fd: int, path: Path, consume: _Consumer, torn: Callable[[], None] | None) -> None:
        info = os.fstat(fd)
        if info.st_ino != self.inode or info.st_size < self.offset:
            if self.inode is not None:
                logger.warning('%s was replaced or truncated; re-reading it', path)
            self.offset = 0
            self.inode = info.st_ino
            consume([], True)
        size = info.st_size
        if size == self.offset:
            return
        data = _read_at(fd, size - self.offset, self.offset)
        end = data.rfind(b'\n') + 1
        lines = data[:end].split(b'\n')[:-1] if end else []
        self.offset += end
        if lines:
            consume(lines, False)
        if end < len(data) and torn is not None:
            logger.warning('%s ends in a torn line (%d bytes); skipping it', path, len(data) - end)
            os.write(fd, b'\n')
            self.offset = size + 1
            torn()


_Consumer = Callable[[list[bytes], bool], None]
"""Receives new complete lines, and whether to forget what it read before (file replaced)."""


class _RunPaths:
    """The files of one run, joined once (path building showed up in profiles of the hot path)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.events = run_dir / EVENTS_FILE
        self.effects = run_dir / EFFECTS_FILE
        self.messages = run_dir / MESSAGES_FILE
        self.ledger = run_dir / SNAPSHOT_LEDGER_FILE
        self.snapshots = run_dir / SNAPSHOTS_DIR


@dataclass
class _RunState:
    """What this process knows about one run's files; every field is guarded by `lock`."""

    paths: _RunPaths
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: _Tail = field(default_factory=_Tail)
    event_keys: set[str] = field(default_factory=set[str])
    effects_tail: _Tail = field(default_factory=_Tail)
    effects: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])
    log_tail: _Tail = field(default_factory=_Tail)
    next_log_index: int = 0
    ledger_tail: _Tail = field(default_factory=_Tail)
    ledger_loaded: bool = False
    snapshot_keys: set[str] = field(default_factory=set[str])
    live: dict[int, SnapshotState] = field(default_factory=dict[int, SnapshotState])
    max_seq: int = 0
    snapshots_dir_ready: bool = False

    def add_event_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.event_keys.clear()
        for line in lines:
            try:
                key = _object(line).get('idempotency_key')
            except ValueError:
                logger.warning('skipping unreadable event line: %r', line[:200])
                continue
            if isinstance(key, str):
                self.event_keys.add(key)

    def add_effect_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.effects.clear()
        for line in lines:
            try:
                record = tool_effect_from_dict(_object(line))
            except ValueError:
                logger.warning('skipping unreadable tool effect line: %r', line[:200], exc_info=True)
                continue
            self.effects[record.tool_call_id] = record

    def add_log_lines(self, lines: list[bytes], reset: bool) -> None:
        """Track the next free log index: past every entry and every garbled line seen."""
        if reset:
            self.next_log_index = 0
        for line in lines:
            match = _LOG_PREFIX.match(line)
            if match is None:
                if line.strip():
                    self.next_log_index += 1  # a damaged entry used an index: never reuse it
                continue
            self.next_log_index = max(self.next_log_index, int(match.group(1)) + 1)

    def add_torn_log_line(self) -> None:
        self.next_log_index += 1

    def add_ledger_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.reset_snapshots()
        for line in lines:
            try:
                value: object = json.loads(line)
            except ValueError:
                logger.warning('skipping unreadable snapshot ledger line: %r', line[:200])
                continue
            if isinstance(value, str):  # the upstream layout: one applied key per line
                self.snapshot_keys.add(value)
                continue
            if not isinstance(value, dict):
                logger.warning('skipping unreadable snapshot ledger line: %r', line[:200])
                continue
            entry = cast(dict[str, Any], value)
            key, seq = entry.get('key'), entry.get('seq')
            if isinstance(key, str):
                self.snapshot_keys.add(key)
            if isinstance(seq, int) and seq > 0:
                self.max_seq = max(self.max_seq, seq)
                try:
                    self.live[seq] = snapshot_state(entry.get('state'))
                except ValueError:
                    logger.warning('snapshot ledger names an unknown state: %r', line[:200])

    def reset_snapshots(self) -> None:
        self.snapshot_keys.clear()
        self.live.clear()
        self.max_seq = 0


# === the lineage index ========================================================================


class _Index:
    """`_index/runs.jsonl`, mirrored in memory and refreshed from its tail.

    Lines are full run records. Which runs exist is decided by `run.json`: a line whose run has
    no `run.json` is a registration that has not finished (or never will); when a run has several
    lines (a registration raced a duplicate), `run.json` says which one is real.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._path = root / INDEX_DIR / INDEX_FILE
        self._lock = threading.Lock()
        self._tail = _Tail()
        self._lines: dict[str, list[RunRecord]] = {}
        self._by_conversation: dict[str, dict[str, None]] = {}
        self._by_parent: dict[str, dict[str, None]] = {}
        self._confirmed: dict[str, RunRecord] = {}
        self._registered_here: set[str] = set()
        self._repaired_through = 0
        self._needs_repair = False

    # --- writing ----------------------------------------------------------------------------

    def append(self, line: bytes, durable: bool) -> None:
        for _ in range(3):
            try:
                with _append_locked(self._path, lock=False, create=False) as appender:
                    appender.write(line, durable)
                return
            except FileNotFoundError:
                with held(self._lock):
                    self._rebuild(durable)
        raise FileNotFoundError(f'could not create the run index {self._path}')

    def registered(self, record: RunRecord) -> None:
        # No lock: this runs after the registration's writes, where waiting (a reader may hold
        # the lock for a while) is not allowed on the event loop; `set.add` is atomic.
        self._registered_here.add(record.run_id)

    # --- reading ----------------------------------------------------------------------------

    def list_runs(self, parent_run_id: str | None, conversation_id: str | None, durable: bool) -> list[RunRecord]:
        with self._lock:
            self._refresh(durable)
            if conversation_id is not None:
                candidates = list(self._by_conversation.get(conversation_id, ()))
                if parent_run_id is not None:
                    parents = self._by_parent.get(parent_run_id, {})
                    candidates = [run_id for run_id in candidates if run_id in parents]
            elif parent_run_id is not None:
                candidates = list(self._by_parent.get(parent_run_id, ()))
            else:
                candidates = list(self._lines)
            matches: list[RunRecord] = []
            for run_id in candidates:
                record = self._confirm(run_id)
                if record is None:
                    continue
                if conversation_id is not None and record.conversation_id != conversation_id:
                    continue
                if parent_run_id is not None and record.parent_run_id != parent_run_id:
                    continue
                matches.append(_copy_run(record))
        matches.sort(key=lambda record: record.started_at)
        return matches

    def record_from_index(self, run_id: str) -> RunRecord | None:
        with held(self._lock):
            self._refresh(False)
            lines = self._lines.get(run_id)
            return _copy_run(lines[-1]) if lines else None

    def _confirm(self, run_id: str) -> RunRecord | None:
        record = self._confirmed.get(run_id)
        if record is not None:
            return record
        lines = self._lines[run_id]
        run_file = self._root / run_id / RUN_FILE
        if len(lines) == 1 and (run_id in self._registered_here or run_file.exists()):
            record = lines[0]
        else:
            try:
                record = run_from_dict(_object(run_file.read_bytes()))
            except FileNotFoundError:
                return None
            except ValueError:
                logger.warning('unreadable run record %s; using its index entry', run_file, exc_info=True)
                record = lines[-1]
        self._confirmed[run_id] = record
        return record

    def _refresh(self, durable: bool) -> None:
        if not self._path.exists():
            if not self._root.exists():
                return  # nothing stored yet, and a read must not create the directory
            self._rebuild(durable)
        self._tail.sync_path(self._path, self._add_lines)
        if self._needs_repair:
            self._repair(durable)

    def _add_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self._lines.clear()
            self._by_conversation.clear()
            self._by_parent.clear()
            self._confirmed.clear()
            self._repaired_through = 0
            self._needs_repair = False
        position = self._tail.offset - sum(len(line) + 1 for line in lines)
        for line in lines:
            position += len(line) + 1
            if not line.strip():
                continue
            try:
                data = _object(line)
                repaired = data.get('repaired_through')
                if isinstance(repaired, int):
                    self._repaired_through = max(self._repaired_through, repaired)
                    self._needs_repair = False
                    continue
                record = run_from_dict(data)
            except ValueError:
                if position > self._repaired_through:
                    logger.warning('damaged line in run index %s: %r', self._path, line[:200])
                    self._needs_repair = True
                continue
            self._add_record(record)

    def _add_record(self, record: RunRecord) -> None:
        run_id = record.run_id
        lines = self._lines.setdefault(run_id, [])
        lines.append(record)
        if len(lines) > 1:
            self._confirmed.pop(run_id, None)
        if record.conversation_id is not None:
            self._by_conversation.setdefault(record.conversation_id, {})[run_id] = None
        if record.parent_run_id is not None:
            self._by_parent.setdefault(record.parent_run_id, {})[run_id] = None

    def _rebuild(self, durable: bool) -> None:
        """Create the index from the run directories (first use, or after it was deleted)."""
        if self._path.exists():
            return
        lines = b''.join(_line(run_to_dict(record)) for record in self._scan_runs())
        if _make_dir(self._path.parent) and durable:
            fsync_dir(self._root)
        # Exclusive create: if another process rebuilt it first, its file (and every line
        # appended to it since) stands, and this one is discarded.
        _write_exclusive(self._path, lines, durable)
        self._tail.reset()

    def _repair(self, durable: bool) -> None:
        """After a damaged line: add any run the index lacks, then mark the damage as handled."""
        known = set(self._lines)
        missing = [record for record in self._scan_runs() if record.run_id not in known]
        payload = b''.join(_line(run_to_dict(record)) for record in missing)
        with _append_locked(self._path, lock=False, create=False) as appender:
            appender.write(payload, durable)
            marker = _line({'repaired_through': appender.size_after})
            appender.write(marker, durable)
        self._needs_repair = False
        logger.warning('repaired run index %s: %d run(s) re-added', self._path, len(missing))
        self._tail.sync_path(self._path, self._add_lines)

    def _scan_runs(self) -> list[RunRecord]:
        records: list[RunRecord] = []
        try:
            entries = list(os.scandir(self._root))
        except FileNotFoundError:
            return records
        for entry in entries:
            if not entry.is_dir() or entry.name == INDEX_DIR:
                continue
            try:
                raw = Path(entry.path, RUN_FILE).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                records.append(run_from_dict(_object(raw)))
            except ValueError:
                logger.warning('skipping unreadable run record in %s', entry.path, exc_info=True)
        return records


# === snapshot files and the message log =======================================================


@dataclass
class _FoundSnapshot:
    seq: int
    meta: SnapshotMeta
    texts: list[str]
    log_ref: tuple[int, int] | None
    """`(message_count, log_size)` still to resolve against the log; `None` for inline history."""
    path: Path

    def resolve(self, view: _LogView) -> bool:
        assert self.log_ref is not None
        count, size = self.log_ref
        texts = view.resolve(count, size)
        if texts is None:
            logger.warning(
                'skipping snapshot %s: its messages (%d, log size %d) are not all in the message log',
                self.path,
                count,
                size,
            )
            return False
        self.texts = texts
        return True


def _read_snapshot_file(run_dir: Path, seq: int, include_interrupted: bool) -> _FoundSnapshot | None:
    path = run_dir / SNAPSHOTS_DIR / f'{seq}.json'
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None  # pruned since the directory was listed
    except OSError:
        logger.warning('skipping unreadable snapshot file %s', path, exc_info=True)
        return None
    try:
        data = _object(raw)
        what = 'snapshot'
        meta = SnapshotMeta(
            step_index=required_int(data, 'step_index', what),
            conversation_id=optional_str(data, 'conversation_id', what),
            parent_run_id=optional_str(data, 'parent_run_id', what),
            agent_name=optional_str(data, 'agent_name', what),
            timestamp=timestamp(data, 'timestamp', what),
            state=snapshot_state(data.get('state')),
            idempotency_key=optional_str(data, 'idempotency_key', what),
        )
        if not include_interrupted and meta.state != 'complete':
            return None
        messages: object = data.get('messages')
        if isinstance(messages, list):  # written by the upstream package: the history inline
            texts = [_compact(item) for item in cast(list[object], messages)]
            return _FoundSnapshot(seq, meta, texts, None, path)
        if isinstance(messages, dict):
            ref = cast(dict[str, Any], messages)
            count = required_int(ref, 'message_count', 'snapshot messages')
            size = required_int(ref, 'log_size', 'snapshot messages')
            if count < 0 or size < 0:
                raise ValueError(f'snapshot messages reference must be non-negative, got {ref!r}')
            return _FoundSnapshot(seq, meta, [], (count, size), path)
        raise ValueError(f'snapshot field "messages" must be a list or a log reference, got {messages!r}')
    except ValueError:
        logger.warning('skipping unreadable snapshot file %s', path, exc_info=True)
        return None


@dataclass
class _LogView:
    """A run's message log as read now: entries by index, and which indices are missing."""

    entries: list[LogEntry]
    present: set[int]

    @classmethod
    def read(cls, path: Path) -> _LogView:
        entries: list[LogEntry] = []
        present: set[int] = set()
        for line in _read_lines(path):
            entry = _parse_log_line(line)
            if entry is None:
                if line.strip():
                    logger.warning('skipping damaged message log line in %s: %r', path, line[:200])
                continue
            entries.append(entry)
            present.add(entry.index)
        return cls(entries, present)

    def resolve(self, count: int, size: int) -> list[str] | None:
        """The snapshot's message texts, or `None` if the log cannot be trusted for it.

        A missing index (a damaged or lost line) could have held a newer version of any position,
        so each position's newest entry must lie above the highest missing index below `size`.
        A history rewritten in full after the damage therefore reads fine; one that depended on
        the lost line is skipped rather than silently rebuilt from an older version.
        """
        gap = size - 1
        while gap >= 0 and gap in self.present:
            gap -= 1
        entries = self.entries if gap < 0 else [entry for entry in self.entries if entry.index > gap]
        return resolve_history(entries, count, size)


def _parse_log_line(line: bytes) -> LogEntry | None:
    try:
        value: object = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    data = cast(dict[str, Any], value)
    index, position, message = data.get('i'), data.get('p'), data.get('m')
    if not isinstance(index, int) or not isinstance(position, int) or not isinstance(message, dict):
        return None
    if index < 0 or position < 0:
        return None
    match = _LOG_PREFIX.match(line)
    if match is not None and len(data) == 3 and line.endswith(b'}'):
        text = line[match.end() : -1].decode('utf-8', 'surrogatepass')  # the stored text, as written
    else:
        text = _compact(cast(dict[str, Any], message))
    return LogEntry(index, position, text)


def _log_line(index: int, position: int, text: str) -> bytes:
    return b'{"i":%d,"p":%d,"m":%s}\n' % (index, position, text.encode('utf-8', 'surrogatepass'))


def _snapshot_body(snapshot: ContinuableSnapshot, message_count: int, log_size: int) -> bytes:
    return _line(
        {
            'run_id': snapshot.run_id,
            'step_index': snapshot.step_index,
            'conversation_id': snapshot.conversation_id,
            'parent_run_id': snapshot.parent_run_id,
            'agent_name': snapshot.agent_name,
            'timestamp': snapshot.timestamp.isoformat(),
            'state': snapshot.state,
            'messages': {'message_count': message_count, 'log_size': log_size},
            'idempotency_key': snapshot.idempotency_key,
        }
    )


def _snapshot_seqs(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(name[:-5]) for name in names if name.endswith('.json') and _SEQ_STEM.fullmatch(name[:-5])]


def _peek_state(path: Path) -> SnapshotState | None:
    """The state of a snapshot file the ledger does not name; `None` if it cannot be read."""
    try:
        return snapshot_state(_object(path.read_bytes()).get('state'))
    except (OSError, ValueError):
        return None


# === low-level file helpers ===================================================================


@dataclass
class _Appender:
    """One append session on an open `O_APPEND` descriptor; remembers the file size around it."""

    path: Path
    fd: int
    inode: int
    size_before: int = -1
    size_after: int = -1

    def write(self, data: bytes, durable: bool) -> None:
        """Append whole lines in one `write`; close a torn last line first (see module docstring)."""
        if self.size_before < 0:
            size = os.fstat(self.fd).st_size
            self.size_before = self.size_after = size
            if size and _read_at(self.fd, 1, size - 1) != b'\n':
                data = b'\n' + data
        _write_all(self.fd, data)
        if durable:
            os.fsync(self.fd)
            if self.size_before == 0:  # maybe a new file: make its name durable too
                fsync_dir(self.path.parent)
        self.size_after += len(data)


@contextmanager
def _append_locked(
    path: Path, *, lock: bool = True, create: bool = True, durable: bool = False
) -> Generator[_Appender]:
    """An `O_APPEND` descriptor on `path`, under `flock` unless `lock=False` (closing releases it).

    With `create`, a missing parent directory (a run seen for the first time) is created too,
    and with `durable` its own parent is synced so the new directory survives power loss.
    """
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if not create:
            raise
        if _make_dir(path.parent) and durable:
            fsync_dir(path.parent.parent)
        fd = os.open(path, flags, 0o644)
    try:
        if lock:
            _lock_fd(fd)
        yield _Appender(path, fd, os.fstat(fd).st_ino)
    finally:
        os.close(fd)


def _write_exclusive(target: Path, data: bytes, durable: bool, *, sync_dir: bool = True) -> bool:
    """Write `target` atomically and only if it does not exist yet; `False` if it already did.

    The bytes go to a temporary file in the same directory, which is then hard-linked to the final
    name: readers see the whole file or none of it, and `link` refuses an existing name (unlike
    `rename`), which is what makes registration and seq allocation exclusive across processes.
    """
    temp = f'{target}.{uuid.uuid4().hex}.tmp'
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            return _create_exclusive(target, data, durable)  # a file system without hard links
        if durable and sync_dir:
            fsync_dir(target.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def _read_at(fd: int, size: int, offset: int) -> bytes:
    """`os.pread`, or seek-and-read where it does not exist (Windows)."""
    if hasattr(os, 'pread'):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - Windows
    return os.read(fd, size)  # pragma: no cover - Windows


def _write_all(fd: int, data: bytes) -> None:
    """`os.write` until done: one call for a regular file, unless interrupted or out of space."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _create_exclusive(target: Path, data: bytes, durable: bool) -> bool:
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _make_dir(path: Path) -> bool:
    """Create `path` (and parents); `True` if this call created it."""
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _make_dir(path)


def _read_lines(path: Path) -> list[bytes]:
    """Complete, non-blank lines of `path`; a partial last line is skipped with a warning."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b'\n') + 1
    if end < len(data):
        logger.warning('skipping incomplete last line of %s (%d bytes)', path, len(data) - end)
    return [line for line in data[:end].split(b'\n') if line.strip()]


def _object(raw: bytes | str) -> dict[str, Any]:
    """Parse a JSON object; `ValueError` (never another error) for anything else."""
    try:
        value: object = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f'not valid JSON: {error}') from None
    if not isinstance(value, dict):
        raise ValueError(f'expected a JSON object, got {type(value).__name__}')
    return cast(dict[str, Any], value)


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(',', ':')).encode() + b'\n'


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(',', ':'))


def _copy_run(record: RunRecord) -> RunRecord:
    fresh = copy.copy(record)
    fresh.metadata = dict(record.metadata)
    return fresh


def _resolved_snapshots(run_dir: Path, seqs: Iterable[int], include_interrupted: bool) -> Iterator[_FoundSnapshot]:
    """The readable snapshot files among `seqs`, in that order, with their messages resolved.

    The run's message log is read once, and only when a snapshot refers to it.
    """
    view: _LogView | None = None
    for seq in seqs:
        found = _read_snapshot_file(run_dir, seq, include_interrupted)
        if found is None:
            continue
        if found.log_ref is not None:
            if view is None:
                view = _LogView.read(run_dir / MESSAGES_FILE)
            if not found.resolve(view):
                continue
        yield found
