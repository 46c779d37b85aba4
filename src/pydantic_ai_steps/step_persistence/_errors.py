"""Errors raised by step stores, in one place so every backend raises the same types."""

from __future__ import annotations

import re

FILE_SAFE_RUN_ID = re.compile(r'[A-Za-z0-9_.-]{1,200}')


class RunAlreadyExistsError(ValueError):
    """A run id was registered twice. Every backend raises this same error."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f'run_id {run_id!r} is already in the store; a run_id names exactly one run. '
            'Pass conversation_id= to Agent.run to group turns instead of reusing a run_id.'
        )
        self.run_id = run_id


class InvalidRunIdError(ValueError):
    """A run id that a store cannot use as a key (for example a path component)."""

    def __init__(self, run_id: object, allowed: str) -> None:
        super().__init__(f'invalid run_id {run_id!r}: {allowed}')
        self.run_id = run_id


def check_file_safe_run_id(run_id: str) -> str:
    """Reject run ids that could escape a store directory: `[A-Za-z0-9_.-]{1,200}`, no `..`."""
    if not isinstance(run_id, str) or not FILE_SAFE_RUN_ID.fullmatch(run_id) or '..' in run_id:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRunIdError(run_id, 'expected 1-200 characters from [A-Za-z0-9_.-], without ".."')
    return run_id


def check_max_snapshots(value: object) -> int | None:
    """Validate `max_snapshots_per_run`: `None` (keep all) or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'max_snapshots_per_run must be an int >= 1 or None, got {value!r}')
    if value < 1:
        raise ValueError(f'max_snapshots_per_run must be >= 1 or None, got {value!r}')
    return value


def check_threshold(value: object) -> int:
    """Validate `media_threshold_bytes`: an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'media_threshold_bytes must be an int >= 1, got {value!r}')
    return value
