"""The File store's layout: file names, and the directory that holds each run."""

from __future__ import annotations

import hashlib
import re

from ...._errors import is_file_safe

INDEX_DIR = '_index'
INDEX_FILE = 'runs.jsonl'
TRASH_DIR = 'trash'
"""Under `_index`: where a deleted run's folder is moved (atomically) before it is removed."""
MEDIA_DIR = 'media'
RUN_FILE = 'run.json'
STATUS_FILE = 'status.json'
"""How the run ended: `{"status", "ended_at"}`, written by its closing event."""
EVENTS_FILE = 'events.jsonl'
EFFECTS_FILE = 'tool_effects.jsonl'
MESSAGES_FILE = 'messages.jsonl'
SNAPSHOT_LEDGER_FILE = 'snapshot-keys.jsonl'
SNAPSHOTS_DIR = 'snapshots'
HASHED_PREFIX = '~'
"""Names the folder of a run whose id is not a plain file name: `~` + the id's SHA-256."""
_HASHED = re.compile(r'~[0-9a-f]{64}')


def run_dir_name(run_id: str) -> str:
    """The folder of a run: the id itself when it is a plain file name, else `~<sha256 of the id>`.

    Ids such as `job:123` or `a/b` are valid for every store but not as file names everywhere;
    the real id is always in the folder's `run.json`.
    """
    if is_file_safe(run_id):
        return run_id
    return HASHED_PREFIX + hashlib.sha256(run_id.encode('utf-8', 'surrogatepass')).hexdigest()


def is_run_dir_name(name: str) -> bool:
    """Whether a folder in the store directory can hold a run (not the index, not media)."""
    return (is_file_safe(name) or bool(_HASHED.fullmatch(name))) and name not in (INDEX_DIR, MEDIA_DIR)
