"""Every error this package raises on purpose, and the argument checks that raise them.

One base class (`StepsError`), each error also deriving from the built-in exception a caller
would naturally catch (`ValueError` for bad input, `LookupError` for a missing run, ...), so
`except ValueError` keeps working where upstream code relied on it.
"""

from __future__ import annotations

import math
import re
import sqlite3
import sys
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Any

RUN_ID_MAX_LENGTH = 200
RESERVED_RUN_IDS = frozenset({'.', '..', '_index', 'media'})
"""Names a store uses for itself (the File store's index and media folders); compared case-insensitively."""
_FILE_SAFE = re.compile(r'[A-Za-z0-9_.-]{1,200}')


class StepsError(Exception):
    """Base class of the errors pydantic-ai-steps raises."""


class RunAlreadyExistsError(StepsError, ValueError):
    """A run id was registered twice. Every backend raises this same error."""

    def __init__(self, run_id: str, *, folded_into: str | None = None) -> None:
        if folded_into is None:
            message = (
                f'run_id {run_id!r} is already in the store; a run_id names exactly one run. '
                'Pass conversation_id= to Agent.run to group turns instead of reusing a run_id.'
            )
        else:  # the File store on a file system that does not tell letter case apart
            message = (
                f'run_id {run_id!r} cannot be stored here: this file system does not tell letter case apart, '
                f'so its folder is the one of run {folded_into!r}; use a run_id that differs by more than case'
            )
        super().__init__(message)
        self.run_id = run_id


class RunNotFoundError(StepsError, LookupError):
    """A write for a run the store does not hold: never registered, or deleted since."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f'run_id {run_id!r} is not in the store: register_run() it before writing its records '
            '(or it was deleted while it was being written)'
        )
        self.run_id = run_id


class EffectAlreadyResolvedError(StepsError, ValueError):
    """`resolve_tool_effect` on a call that was resolved before: the first resolution stands.

    A resolution is the ledger's record of what someone checked, so a second one does not replace
    it silently; `replace=True` (the CLI's `--replace`) overwrites it on purpose.
    """

    def __init__(
        self,
        *,
        run_id: str,
        tool_call_id: str,
        resolution: str,
        resolved_by: str | None,
        resolved_at: datetime | None,
        resolution_note: str | None,
    ) -> None:
        when = resolved_at.isoformat() if resolved_at is not None else 'an unknown time'
        found = (
            f'tool call {tool_call_id!r} of run {run_id!r} is already resolved: {resolution} '
            f'by {resolved_by!r} at {when}'
        )
        if resolution_note:
            found += f' (note: {resolution_note!r})'
        self.found = found
        """Names the run, the call and the resolution that stands, for callers that word the remedy."""
        super().__init__(f'{found}; pass replace=True to overwrite it')
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.resolution = resolution
        self.resolved_by = resolved_by
        self.resolved_at = resolved_at
        self.resolution_note = resolution_note


class InvalidRunIdError(StepsError, ValueError):
    """A run id no store can hold."""

    def __init__(self, run_id: object, allowed: str) -> None:
        super().__init__(f'invalid run_id {shortened(run_id)}: {allowed}')
        self.run_id = run_id


class InvalidRecordError(StepsError, ValueError):
    """A record field of the wrong type or form; raised before anything is written."""


class RecordTooLargeError(StepsError, ValueError):
    """A record that exceeds what the backend can store in one piece, even after moving media out."""


class StoreUnavailableError(StepsError, ConnectionError):
    """The store's server could not be reached, or no connection became free in time."""


class StoreUrlError(StepsError, ValueError):
    """A store URL (a `--store` value, a `dsn=`) that names no store this package can open."""


class SchemaVersionError(StepsError, RuntimeError):
    """The store was written by a newer release with a layout this one does not know."""


class NotAStoreError(StepsError, ValueError):
    """Something exists where a store was expected, but it is not a step store."""


class DatabaseLockedError(StepsError, sqlite3.OperationalError):
    """A SQLite call waited the whole busy timeout for a write lock that another connection held, or
    wrote in a caller's transaction that began reading before another connection committed.

    A `sqlite3.OperationalError` too, so code that caught SQLite's own `database is locked` still
    catches it; the original error is its `__cause__`.
    """


class DatabaseReadOnlyError(StepsError, PermissionError, sqlite3.OperationalError):
    """A write to a SQLite database this process may only read (a read-only file or mount).

    A `PermissionError`, and a `sqlite3.OperationalError` as SQLite's own error was; that error is its
    `__cause__`. Reads of the database go on working.
    """


def shortened(value: object, limit: int = 200) -> str:
    """`repr(value)`, its middle cut out when long: a message quoting a huge value (a damaged stored
    field, a key) shows how it starts and ends and how long it is, not all of it."""
    if isinstance(value, str | bytes):
        if len(value) <= limit:
            return repr(value)
        unit = 'characters' if isinstance(value, str) else 'bytes'
        return f'{value[: limit // 2]!r}…{value[-limit // 4 :]!r} ({len(value)} {unit})'
    text = repr(value)
    if len(text) <= limit:
        return text
    return f'{text[: limit // 2]}…{text[-limit // 4 :]} ({type(value).__name__} of {len(text)} characters)'


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error (asyncpg's `sqlstate`, psycopg's `sqlstate`), if it has one."""
    code = getattr(error, 'sqlstate', None)
    return code if isinstance(code, str) else None


def check_run_id(run_id: object) -> str:
    """The rule every store applies to new run ids, so a run can move between stores.

    1-200 characters, no control characters (C0, DEL, C1) or lone surrogates, not `.` or `..`,
    and not a name a store uses itself (`_index`, `media`, in any case). Ids such as `job:123` or
    `tenant/42` are fine: the File store maps ids that are not plain file names to directory
    names of its own.
    """
    if not isinstance(run_id, str):
        raise InvalidRunIdError(run_id, 'expected a string')
    if _FILE_SAFE.fullmatch(run_id) and run_id not in ('.', '..') and run_id.casefold() not in RESERVED_RUN_IDS:
        return run_id  # the common case, checked at C speed
    if not run_id or len(run_id) > RUN_ID_MAX_LENGTH:
        raise InvalidRunIdError(run_id, f'expected 1-{RUN_ID_MAX_LENGTH} characters, got {len(run_id)}')
    bad = next((char for char in run_id if unicodedata.category(char) in ('Cc', 'Cs')), None)
    if bad is not None:
        raise InvalidRunIdError(run_id, f'control characters are not allowed (found {bad!r})')
    if run_id.casefold() in RESERVED_RUN_IDS:
        reserved = ', '.join(sorted(RESERVED_RUN_IDS))
        raise InvalidRunIdError(run_id, f'{reserved} are reserved for the stores themselves')
    return run_id


def is_file_safe(run_id: str) -> bool:
    """Whether `run_id` can name a directory as it is (`[A-Za-z0-9_.-]`, no `..`, not reserved)."""
    return bool(_FILE_SAFE.fullmatch(run_id)) and '..' not in run_id and run_id.casefold() not in RESERVED_RUN_IDS


def check_optional_str(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRecordError(f'{what} must be a string or None, got {type(value).__name__} {shortened(value)}')
    return value


def check_encodable(text: str, what: str) -> None:
    """Text every store can hold: no lone surrogate (what `surrogateescape` decoding of a file name
    leaves), which UTF-8 cannot encode, so SQLite, PostgreSQL and MongoDB refuse it and JSON files
    would hold bytes no UTF-8 reader takes. One rule for every store, the in-memory one included."""
    if not text.isascii():
        try:
            text.encode('utf-8')  # faster than any search for one, even for a long text
        except UnicodeEncodeError as error:
            raise InvalidRecordError(
                f'{what} is not valid Unicode text: a lone surrogate {text[error.start]!r} at position '
                f"{error.start}; decode such text with errors='replace' (or 'backslashreplace') first"
            ) from None


def check_optional_text(value: object, what: str) -> str | None:
    """`check_optional_str`, and text every store can hold (`check_encodable`)."""
    text = check_optional_str(value, what)
    if text is not None:
        check_encodable(text, what)
    return text


def check_str_map(value: object, what: str) -> dict[str, str]:
    """A mapping of strings to strings (event and run `metadata`)."""
    if not isinstance(value, Mapping):
        raise InvalidRecordError(f'{what} must be a dict of strings to strings, got {type(value).__name__}')
    for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidRecordError(
                f'{what} must map strings to strings, got {shortened(key)}: {shortened(item)} ({type(item).__name__}); '  # pyright: ignore[reportUnknownArgumentType]
                'convert values with str() first'
            )
        if not (key.isascii() and item.isascii()):
            check_encodable(key, f'{what} key {shortened(key)}')
            check_encodable(item, f'{what}[{shortened(key)}]')
    return dict(value)  # pyright: ignore[reportUnknownArgumentType]


def check_json_map(value: object, what: str) -> dict[str, Any]:
    """A mapping of strings to JSON values (`Agent.run(metadata=...)`)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRecordError(f'{what} must be a dict of JSON values, got {type(value).__name__}')
    checked: dict[str, Any] = {}
    for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(key, str):
            raise InvalidRecordError(f'{what} keys must be strings, got {shortened(key)}')  # pyright: ignore[reportUnknownArgumentType]
        if not key.isascii():
            check_encodable(key, f'{what} key {shortened(key)}')
        _check_json(item, f'{what}[{shortened(key)}]')  # pyright: ignore[reportUnknownArgumentType]
        checked[key] = item
    return checked


def _check_json(value: object, where: str, depth: int = 0) -> None:
    if depth > 32:
        raise InvalidRecordError(f'{where} is nested more than 32 levels deep')
    if isinstance(value, str):
        check_encodable(value, where)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        limit = sys.get_int_max_str_digits()  # 0: no limit
        if limit and value.bit_length() > 3 * limit:  # fewer bits than this are fewer digits than the limit
            try:
                str(value)
            except ValueError:
                raise InvalidRecordError(
                    f'{where} is an integer of more than {limit} digits, which Python does not turn into '
                    'text (nor read back from JSON); store it as a string'
                ) from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRecordError(f'{where} must be a finite number, got {shortened(value)}')
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
            _check_json(item, f'{where}[{index}]', depth + 1)  # pyright: ignore[reportUnknownArgumentType]
        return
    if isinstance(value, Mapping):
        for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
            if not isinstance(key, str):
                raise InvalidRecordError(f'{where} keys must be strings, got {shortened(key)}')  # pyright: ignore[reportUnknownArgumentType]
            if not key.isascii():
                check_encodable(key, f'{where} key {shortened(key)}')
            _check_json(item, f'{where}[{shortened(key)}]', depth + 1)  # pyright: ignore[reportUnknownArgumentType]
        return
    raise InvalidRecordError(
        f'{where} must be a JSON value (str, int, float, bool, None, list, dict), got {type(value).__name__}'
    )


def check_max_snapshots(value: object) -> int | None:
    """Validate `max_snapshots_per_run`: `None` (keep all) or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'max_snapshots_per_run must be an int >= 1 or None, got {shortened(value)}')
    if value < 1:
        raise ValueError(f'max_snapshots_per_run must be >= 1 or None, got {shortened(value)}')
    return value


def check_threshold(value: object) -> int:
    """Validate `media_threshold_bytes`: an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'media_threshold_bytes must be an int >= 1, got {shortened(value)}')
    return value


def check_bool(value: object, name: str) -> bool:
    """A flag given as a real `bool` (so `durable='no'` is not silently true)."""
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {shortened(value)}')
    return value
