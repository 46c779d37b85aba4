"""What one process knows about one run's files, kept in step with them by reading only their tails.

Idempotency keys, the tool-effect ledger, the snapshot ledger and the log's next index are kept in
memory and refreshed by reading only the bytes appended since the last look (the byte offset is
remembered), so no call re-reads a whole file on the hot path, yet writes by other processes are
seen.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ...._errors import shortened
from ...._json import loads
from ...._records import SNAPSHOT_STATES
from ...codec import Row
from ._io import Tail, json_object, logger
from ._paths import EFFECTS_FILE, EVENTS_FILE, MESSAGES_FILE, RUN_FILE, SNAPSHOT_LEDGER_FILE, SNAPSHOTS_DIR, STATUS_FILE

LOG_PREFIX = re.compile(rb'\{"i":([0-9]+),"p":([0-9]+),"m":')
REMOVED_PREFIX = b'{"removed":'
"""The first line of a compacted message log: the indices removed on purpose."""


class RunPaths:
    """The files of one run, joined once (path building showed up in profiles of the hot path)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run = run_dir / RUN_FILE
        self.status = run_dir / STATUS_FILE
        self.events = run_dir / EVENTS_FILE
        self.effects = run_dir / EFFECTS_FILE
        self.messages = run_dir / MESSAGES_FILE
        self.ledger = run_dir / SNAPSHOT_LEDGER_FILE
        self.snapshots = run_dir / SNAPSHOTS_DIR


@dataclass
class RunState:
    """Every field is guarded by `lock`."""

    paths: RunPaths
    lock: threading.Lock = field(default_factory=threading.Lock)
    registered: bool = False
    """`run.json` was seen: records of the run may be written."""
    events: Tail = field(default_factory=Tail)
    event_keys: set[str] = field(default_factory=set[str])
    effects_tail: Tail = field(default_factory=Tail)
    effects: dict[str, Row] = field(default_factory=dict[str, Row])
    log_tail: Tail = field(default_factory=Tail)
    next_log_index: int = 0
    ledger_tail: Tail = field(default_factory=Tail)
    ledger_loaded: bool = False
    snapshot_keys: set[str] = field(default_factory=set[str])
    live: dict[int, str] = field(default_factory=dict[int, str])
    max_seq: int = 0
    snapshots_dir_ready: bool = False

    def add_event_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.event_keys.clear()
        for text in lines:
            try:
                key = json_object(text).get('idempotency_key')
            except ValueError:
                continue  # reported by the readers of the event log
            if isinstance(key, str):
                self.event_keys.add(key)

    def add_effect_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.effects.clear()
        for text in lines:
            try:
                row = json_object(text)
            except ValueError:
                logger.warning('skipping unreadable tool effect line of %s: %s', self.paths.effects, shortened(text))
                continue
            call_id = row.get('tool_call_id')
            if isinstance(call_id, str):
                self.effects[call_id] = row
            else:
                logger.warning('skipping tool effect line without a tool_call_id in %s', self.paths.effects)

    def add_log_lines(self, lines: list[bytes], reset: bool) -> None:
        """Track the next free log index: past every entry and every garbled line seen."""
        if reset:
            self.next_log_index = 0
        for text in lines:
            match = LOG_PREFIX.match(text)
            if match is None:
                if text.strip() and not text.startswith(REMOVED_PREFIX):
                    self.next_log_index += 1  # a damaged entry used an index: never reuse it
                continue
            self.next_log_index = max(self.next_log_index, int(match.group(1)) + 1)

    def add_torn_log_line(self) -> None:
        self.next_log_index += 1

    def add_ledger_lines(self, lines: list[bytes], reset: bool) -> None:
        if reset:
            self.reset_snapshots()
        for text in lines:
            try:
                value = loads(text)
            except ValueError:
                logger.warning('skipping unreadable snapshot ledger line of %s: %s', self.paths.ledger, shortened(text))
                continue
            if isinstance(value, str):  # the upstream layout: one applied key per line
                self.snapshot_keys.add(value)
                continue
            if not isinstance(value, dict):
                logger.warning('skipping unreadable snapshot ledger line of %s: %s', self.paths.ledger, shortened(text))
                continue
            entry = cast(dict[str, Any], value)
            key, seq, state = entry.get('key'), entry.get('seq'), entry.get('state')
            if isinstance(key, str):
                self.snapshot_keys.add(key)
            if isinstance(seq, int) and seq > 0:
                self.max_seq = max(self.max_seq, seq)
                self.live[seq] = state if isinstance(state, str) and state in SNAPSHOT_STATES else 'complete'

    def reset_snapshots(self) -> None:
        self.snapshot_keys.clear()
        self.live.clear()
        self.max_seq = 0
