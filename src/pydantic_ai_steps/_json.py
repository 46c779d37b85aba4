"""The compact JSON spelling every store writes, and the string-map decoder every reader uses."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from ._errors import shortened


def compact_json(value: object) -> str:
    """No spaces, non-ASCII kept as is: the one spelling of stored JSON text."""
    return json.dumps(value, ensure_ascii=False, separators=(',', ':'))


def loads(raw: str | bytes) -> object:
    """`json.loads` of stored text, every way it can fail to parse (deep nesting included) one
    `ValueError` saying why ("not valid JSON: ..."), so a reader skips the record instead of failing."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError('nested too deeply to read') from None
    except ValueError as error:  # UnicodeDecodeError is one
        raise ValueError(f'not valid JSON: {error}') from None


def json_object(value: object, what: str) -> dict[Any, Any] | None:
    """A stored object: `None`, a mapping, or JSON text of an object; `ValueError` naming `what` otherwise."""
    if value is None:
        return None
    if value == '{}':  # what every empty map is stored as: most metadata
        return {}
    if isinstance(value, str | bytes):
        try:
            value = loads(value)
        except ValueError as error:
            raise ValueError(f'{what} is {error}') from None
    if not isinstance(value, Mapping):
        raise ValueError(f'{what} must be an object, got {shortened(value)}')
    return dict(cast(Mapping[Any, Any], value))


def str_map(value: object, what: str) -> dict[str, str]:
    """A stored map of strings to strings (metadata): missing reads as empty."""
    mapping = json_object(value, what)
    if mapping is None:
        return {}
    for name, item in mapping.items():
        if not isinstance(name, str) or not isinstance(item, str):
            raise ValueError(f'{what} must map strings to strings, got {shortened(name)}: {shortened(item)}')
    return cast(dict[str, str], mapping)
