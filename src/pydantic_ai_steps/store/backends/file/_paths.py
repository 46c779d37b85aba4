"""The File store's layout: file names, and the directory that holds each run."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ...._errors import is_file_safe
from ._io import json_object, read_bytes

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
_WINDOWS_DEVICE = re.compile(r'(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?', re.IGNORECASE)
"""Names Windows gives to devices, with any extension (`nul.txt` is the device too)."""


def run_dir_name(run_id: str) -> str:
    """The folder of a run: the id itself when it is a plain file name everywhere, else `~<sha256 of the id>`.

    Ids such as `job:123`, `a/b`, `CON` or `a.` are valid for every store but not file names on
    every system (Windows opens a device for `CON` and drops a trailing dot, so `a.` would be
    `a`'s folder); the real id is always in the folder's `run.json`.
    """
    if _is_plain_everywhere(run_id):
        return run_id
    return HASHED_PREFIX + hashlib.sha256(run_id.encode('utf-8', 'surrogatepass')).hexdigest()


def run_dir(root: Path, run_id: str) -> Path:
    """The folder of a run under `root`, including one an earlier release named after a device
    name or an id with a trailing dot (it used the id itself): kept there, and found, so such a
    run stays where it was written."""
    name, *earlier = folder_names(run_id)
    if earlier and not os.path.lexists(root / name) and registered_id(root / earlier[0]) == run_id:
        return root / earlier[0]
    return root / name


def folder_names(run_id: str) -> tuple[str, ...]:
    """The names a run's folder may have: `run_dir_name`, and the id itself where an earlier
    release used it (see `run_dir`)."""
    name = run_dir_name(run_id)
    return (name, run_id) if name != run_id and is_file_safe(run_id) else (name,)


def registered_id(folder: Path) -> str | None:
    """The run id a folder's `run.json` names; `None` when it cannot tell (no such folder, or a
    registration cut short)."""
    try:
        found = json_object(read_bytes(folder / RUN_FILE)).get('run_id')
    except (OSError, ValueError):
        return None
    return found if isinstance(found, str) else None


def _is_plain_everywhere(run_id: str) -> bool:
    return is_file_safe(run_id) and not run_id.endswith('.') and _WINDOWS_DEVICE.fullmatch(run_id) is None


def is_run_dir_name(name: str) -> bool:
    """Whether a folder in the store directory can hold a run (not the index, not media)."""
    return (is_file_safe(name) or bool(_HASHED.fullmatch(name))) and name not in (INDEX_DIR, MEDIA_DIR)
