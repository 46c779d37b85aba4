"""The File backend: one directory per run, append-only JSON lines, snapshots as small files.

Crash safety: `run.json` and snapshot files are written to a temporary file in the same directory
and moved into place (`os.link`, which also refuses to overwrite). Every append is one `write` of
whole lines to a file opened with `O_APPEND`, under an advisory `flock` so appenders in several
processes never interleave or race a check-then-append. A file that ends in a torn line (a
process died inside a `write`) gets a newline before the next append, so the damage stays
confined to that line, and readers are handed it as `Damaged`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ...._errors import RunAlreadyExistsError, RunNotFoundError
from ...._files import UnsafeEntryError, check_directory, ensure_directory, fsync_dir
from ...._records import RunQuery
from ...backend import (
    STALE,
    SUPPRESSED,
    Closing,
    CommitOutcome,
    Damaged,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    SnapshotWrite,
    WriteBatch,
    resolved_effect,
    upserted_effect,
)
from ...codec import Encoding
from .._offload import held, run_blocking, run_soon
from ._formats import log_line, peek_state, snapshot_body, snapshot_seqs
from ._index import RunIndex
from ._io import (
    append_locked,
    line,
    logger,
    make_dir,
    replace_file,
    write_exclusive,
)
from ._paths import registered_id, run_dir
from ._reads import FileReads, texts_in_folder
from ._removal import remove_run_folders, remove_snapshot_files, rewrite_log_without, tidy_leftovers
from ._state import RunPaths, RunState

_R = TypeVar('_R')
_MAX_CACHED_RUNS = 256
_SEQ_STEM = re.compile(r'[0-9]{1,18}')
_CLOSING = {'run_completed': 'completed', 'run_failed': 'failed'}


class FileBackend:
    encoding = Encoding(native_maps=True, omit_empty=True)

    def __init__(self, root: Path, *, durable: bool) -> None:
        self._root = root
        self.durable = durable
        self._runs: OrderedDict[str, RunState] = OrderedDict()
        self._runs_lock = threading.Lock()
        self._index = RunIndex(root, lambda: self.durable)
        self._reads = FileReads(root, self._index)

    # --- writes -----------------------------------------------------------------------------

    async def commit(self, batch: WriteBatch) -> CommitOutcome:
        """The run, the snapshot, the tool effects, then the events, each file with one append.

        A crash in between leaves a snapshot whose ledger entries still say `started` (the call is
        then reported as possibly done, which it is), never a closed entry whose result no
        snapshot holds.
        """
        inline = not self.durable
        registered = None
        if batch.run is not None:
            registered = batch.run['run_id']
            await run_soon(self._register, batch.run, inline=inline)
        for run_id in batch.run_ids:
            if run_id != registered:
                await run_soon(self._require_registered, run_id, inline=inline)
        outcome: CommitOutcome = None
        if batch.snapshot is not None:
            outcome = await self._guarded(batch.snapshot.run_id, self._write_snapshot, batch.snapshot)
            if outcome == STALE:
                return STALE
        for run_id, rows in _by_run(batch.tool_effects):
            await self._guarded(run_id, self._append_effects, rows)
        for run_id, rows in _by_run(batch.events):
            await self._guarded(run_id, self._append_events, rows)
        for closing in batch.closings:
            await self._guarded(closing.run_id, self._write_status, closing)
        return outcome

    def _write_status(self, state: RunState, closing: Closing) -> None:
        """`status.json`: how the run ended, replaced atomically (a run closes once; a retry rewrites it)."""
        replace_file(state.paths.status, line({'status': closing.status, 'ended_at': closing.ended_at}), self.durable)

    async def _guarded(self, run_id: str, body: Callable[[RunState, Any], _R], argument: Any) -> _R:
        """Run a write of one run's files; a run folder gone meanwhile (deleted) is `RunNotFoundError`."""
        try:
            return await run_soon(self._with_state, run_id, body, argument, inline=not self.durable)
        except FileNotFoundError:
            self._drop_state(run_id)
            raise RunNotFoundError(run_id) from None

    def _with_state(self, run_id: str, body: Callable[[RunState, Any], _R], argument: Any) -> _R:
        state = self._state(run_id)
        with held(state.lock):
            return body(state, argument)

    def _register(self, row: Row) -> None:
        run_id = row['run_id']
        paths = RunPaths(run_dir(self._root, run_id))
        if paths.run.exists():
            holder = registered_id(paths.run_dir)
            raise RunAlreadyExistsError(run_id, folded_into=holder if holder not in (None, run_id) else None)
        if not self._root.exists():
            make_dir(self._root)
        created = ensure_directory(paths.run_dir, 'run folder')
        if created and self.durable:
            fsync_dir(self._root)
        text = line(row)
        # The index line goes first: a crash between the two leaves a line for a run that does
        # not exist (readers ignore it), never a run that the index cannot find.
        self._index.append(text)
        if not write_exclusive(paths.run, text, self.durable):
            raise RunAlreadyExistsError(run_id)
        self._index.registered(run_id)

    def _require_registered(self, run_id: str) -> None:
        state = self._state(run_id)
        if not state.registered:
            if not state.paths.run.exists():
                self._drop_state(run_id)
                raise RunNotFoundError(run_id)
            state.registered = True

    def _append_events(self, state: RunState, rows: list[Row]) -> None:
        """Append events as one write, skipping those whose idempotency key the run already has."""
        path = state.paths.events
        durable = self.durable
        with append_locked(path) as appender:
            if any(row.get('idempotency_key') is not None for row in rows):
                state.events.sync_fd(appender.fd, path, state.add_event_lines)
            fresh: list[bytes] = []
            new_keys: set[str] = set()
            for row in rows:
                key = row.get('idempotency_key')
                if key is not None:
                    if key in state.event_keys or key in new_keys:
                        continue
                    new_keys.add(key)
                fresh.append(line(row))
            if not fresh:
                return
            appender.write(b''.join(fresh), durable)
            if state.events.follows(appender):
                state.event_keys.update(new_keys)

    def _append_effects(self, state: RunState, rows: list[Row]) -> None:
        """Append ledger lines; an entry already resolved keeps its resolution (read under the lock)."""
        path = state.paths.effects
        with append_locked(path) as appender:
            state.effects_tail.sync_fd(appender.fd, path, state.add_effect_lines)
            latest: dict[str, Row] = {}
            written: list[Row] = []
            for row in rows:
                call = row['tool_call_id']
                latest[call] = upserted_effect(row, latest.get(call, state.effects.get(call)))
                written.append(latest[call])
            appender.write(b''.join(line(row) for row in written), self.durable)
            if state.effects_tail.follows(appender):
                state.effects.update(latest)

    async def resolve_effect(self, run_id: str, tool_call_id: str, resolution: Row, *, overwrite: bool) -> bool:
        def resolve(state: RunState, _: None) -> bool:
            path = state.paths.effects
            with append_locked(path) as appender:
                state.effects_tail.sync_fd(appender.fd, path, state.add_effect_lines)
                entry = state.effects.get(tool_call_id)
                if entry is None or entry.get('status') != 'started':
                    return False
                if entry.get('resolution') is not None and not overwrite:
                    return False
                row = resolved_effect(entry, resolution)
                appender.write(line(row), self.durable)  # the last line of a call wins
                if state.effects_tail.follows(appender):
                    state.effects[tool_call_id] = row
                return True

        return await self._guarded(run_id, resolve, None)

    def _write_snapshot(self, state: RunState, write: SnapshotWrite) -> CommitOutcome:
        """Append the new message versions, write the snapshot file, ledger it.

        Runs under the run's `flock` (taken on `messages.jsonl`), so writers of one run in any
        process take turns and the log index, the snapshot seq and the key check stay consistent.
        """
        paths = state.paths
        durable = self.durable
        with append_locked(paths.messages) as log:
            if not state.snapshots_dir_ready:
                if ensure_directory(paths.snapshots, 'snapshot folder') and durable:
                    fsync_dir(paths.run_dir)
                state.snapshots_dir_ready = True
            self._sync_ledger(state)
            key = write.key
            if key is not None and key in state.snapshot_keys:
                return SUPPRESSED
            state.log_tail.sync_fd(log.fd, paths.messages, state.add_log_lines, torn=state.add_torn_log_line)
            if write.expected_log_size is not None and write.expected_log_size != state.next_log_index:
                return STALE
            if write.appends:
                base = state.next_log_index
                payload = b''.join(
                    log_line(base + offset, position, text) for offset, (position, text) in enumerate(write.appends)
                )
                log.write(payload, durable)
                if state.log_tail.follows(log):
                    state.next_log_index = base + len(write.appends)
                else:  # pragma: no cover - only without flock (Windows) could another writer slip in
                    return STALE
            log_size = state.next_log_index
            seq = state.max_seq + 1
            body = snapshot_body(write.row, log_size)
            while not write_exclusive(paths.snapshots / f'{seq}.json', body, durable, sync_dir=False):
                seq += 1  # a file no ledger line names (a crash between the two writes): step over it
            if durable:
                fsync_dir(paths.snapshots)
            state_name = write.row['state']
            with append_locked(paths.ledger, lock=False) as ledger:
                ledger.write(line({'seq': seq, 'state': state_name, 'key': key}), durable)
                # Out of step only without flock (Windows): the next sync re-reads this line, harmlessly.
                state.ledger_tail.follows(ledger)
            state.max_seq = seq
            state.live[seq] = state_name
            if key is not None:
                state.snapshot_keys.add(key)
            return log_size

    def _sync_ledger(self, state: RunState) -> None:
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
        present = snapshot_seqs(snapshots_dir)
        for seq in present:
            state.max_seq = max(state.max_seq, seq)
            if seq not in state.live:
                file_state = peek_state(snapshots_dir / f'{seq}.json')
                if file_state is not None:
                    state.live[seq] = file_state
        for seq in [seq for seq in state.live if seq not in present]:
            del state.live[seq]
        state.ledger_loaded = True

    async def delete_snapshots(self, run_id: str, seqs: Sequence[int]) -> None:
        await self._guarded(run_id, remove_snapshot_files, seqs)

    async def delete_runs(self, run_ids: Sequence[str]) -> list[str]:
        def delete(doomed: list[str]) -> list[str]:
            removed = remove_run_folders(self._root, doomed, durable=self.durable, forget=self._drop_state)
            self._index.deleted(removed)
            return removed

        return await run_blocking(delete, list(run_ids))

    async def delete_log_entries(self, run_id: str, indices: Sequence[int]) -> None:
        def rewrite(state: RunState, doomed: set[int]) -> None:
            rewrite_log_without(state, doomed, durable=self.durable)

        await self._guarded(run_id, rewrite, set(indices))

    async def reclaim_space(self) -> None:
        return None  # deleted folders and files give their space back at once

    async def tidy_leftovers(self) -> None:
        """Remove the temporary files and trash that writes and deletions killed midway left (`_removal`)."""
        await run_blocking(tidy_leftovers, self._root)

    # --- reads ------------------------------------------------------------------------------

    async def fetch_run(self, run_id: str) -> Row | Damaged | None:
        return await run_soon(self._reads.run, run_id)

    async def fetch_runs(self, query: RunQuery) -> list[Row | Damaged]:
        return await run_blocking(self._reads.runs, query)

    async def fetch_events(self, run_id: str) -> list[Row | Damaged]:
        return await run_blocking(self._reads.events, run_id)

    async def fetch_effects(
        self, run_id: str, *, tool_call_id: str | None = None, unresolved_only: bool = False
    ) -> list[Row]:
        def read(state: RunState, _: None) -> list[Row]:
            state.effects_tail.sync_path(state.paths.effects, state.add_effect_lines)
            if tool_call_id is not None:
                found = state.effects.get(tool_call_id)
                return [dict(found)] if found is not None else []
            rows = [dict(row) for row in state.effects.values()]
            if unresolved_only:
                rows = [row for row in rows if row.get('status') == 'started' and row.get('resolution') is None]
            return rows

        try:
            return await run_soon(self._with_state, run_id, read, None)
        except UnsafeEntryError as error:
            logger.warning('%s', error)
            return []

    async def fetch_snapshots(
        self,
        run_id: str,
        *,
        include_interrupted: bool,
        below_seq: int | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[SnapshotRow]:
        return await run_blocking(self._reads.snapshots, run_id, include_interrupted, below_seq, limit, oldest_first)

    async def fetch_snapshot_states(self, run_id: str) -> list[tuple[int, str]]:
        def read(state: RunState, _: None) -> list[tuple[int, str]]:
            self._sync_ledger(state)
            return list(state.live.items())

        return await self._guarded(run_id, read, None)

    async def fetch_log(self, run_id: str, *, below_index: int, positions_below: int) -> LogSlice:
        return await run_blocking(self._reads.log, run_id, below_index, positions_below)

    async def texts_mentioning(self, needle: str) -> AsyncIterator[str]:
        marker = needle.encode()
        for folder in await run_blocking(self._reads.run_folders):
            texts = await run_blocking(texts_in_folder, Path(folder), marker)
            for text in texts:
                yield text

    async def probe(self) -> Probe:
        return await run_blocking(self._reads.probe)

    # --- lifecycle and caches ---------------------------------------------------------------

    async def aclose(self) -> None:
        with self._runs_lock:
            self._runs.clear()

    def _state(self, run_id: str) -> RunState:
        """This process's cache for a run (bounded LRU; a forgotten run is simply re-read)."""
        with self._runs_lock:
            state = self._runs.get(run_id)
            if state is None:
                folder = run_dir(self._root, run_id)
                check_directory(folder, 'run folder')
                state = self._runs[run_id] = RunState(RunPaths(folder))
                while len(self._runs) > _MAX_CACHED_RUNS:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(run_id)
            return state

    def _drop_state(self, run_id: str) -> None:
        with self._runs_lock:
            self._runs.pop(run_id, None)


def _by_run(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row['run_id'], []).append(row)
    return list(groups.items())
