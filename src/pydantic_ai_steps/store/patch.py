"""The patch format of message-log entries: a message version spelled as references into an
earlier full text of the same position (see `store/history.py` for why versions are patched).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any, cast

# A patch is a JSON object with the single key "$patch" (a message's keys are field names, so a
# message JSON never has it; an object, not an array, so a store that insists a log entry be a
# JSON object keeps it as is) holding an array: the log index of its base entry, then one op per
# top-level member of the new message, in order:
#
#   i             member i of the base, verbatim ("key":value)
#   {"k":v}       a new member, verbatim: the text between the braces
#   [i, e, ...]   member i of the base (an array, e.g. "parts") rebuilt from e: an integer j is
#                 element j of the base's array, verbatim; any other value is a new element
#
# Everything is copied as raw text, never re-encoded, so the result is byte-identical to the text
# the patch was made from (key order, number spelling and escapes included). Only compact JSON
# (no whitespace between tokens, as every writer here produces) is patched. A base is always a
# full text, never a patch, so resolving a version costs one patch at most.

PATCH_PREFIX = '{"$patch":['
"""How every patch text starts; a full message text never does."""

_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))  # (stub is off)
"""The C scanner behind `json.loads`: `(value, end)` of the JSON value at an index, `StopIteration` if none."""
_INT = re.compile(r'-?[0-9]+')
_STRING = r'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
_SCALAR = rf'(?:{_STRING}|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)'
_FLAT_MEMBER = re.compile(rf',({_STRING}:{_SCALAR})')
"""One member of a request's tail whose value is a string, number or literal: found in one C pass."""


def is_patch(text: str) -> bool:
    return text.startswith(PATCH_PREFIX)


def make_patch(base_index: int, base: str, text: str) -> str | None:
    """`text` as a patch against the full text `base` stored at `base_index`.

    `None` if either is not compact JSON. The caller decides whether the patch is worth storing.
    """
    if is_patch(base):
        return None
    try:
        old = _members(base)
        new = _members(text)
    except (ValueError, RecursionError):
        return None
    by_key: dict[str, int] = {}
    for index, (key, _, _) in enumerate(old):
        by_key.setdefault(key, index)
    ops = [str(base_index)]
    for key, raw, at in new:
        index = by_key.get(key)
        if index is None:
            ops.append('{' + raw + '}')
            continue
        _, old_raw, old_at = old[index]
        if old_raw == raw:
            ops.append(str(index))
            continue
        op = '{' + raw + '}'
        if raw[:at] == old_raw[:old_at] and raw.startswith('[', at) and old_raw.startswith('[', old_at):
            spliced = _array_op(index, old_raw[old_at:], raw[at:])
            if spliced is not None and len(spliced) < len(op):
                op = spliced
        ops.append(op)
    return PATCH_PREFIX + ','.join(ops) + ']}'


def restamp(
    base_index: int, base: str, tail: str, split: int | None = None, *, serialized: bool = False
) -> tuple[str, str] | None:
    """`base` with every member after its first replaced by `tail`, and that text as a patch of `base`.

    `tail` is `,"key":value,...}`: what a message re-stamped in its later fields serializes to
    after its unchanged first member (a request's `parts`), which is then not serialized again.
    `split` is where that first member ends in `base`, when the writer of `base` knows it;
    otherwise the first member's value is scanned to find it (parsed, never split: the cost of a
    large tool result). `None` unless both are compact JSON; `serialized` says the caller knows
    they are (pydantic wrote both), so their members are split without being checked.
    """
    if is_patch(base) or not base.startswith('{"') or not tail.startswith(','):
        return None
    try:
        if split is None:
            colon = _scan(base, 1)[1]
            if not base.startswith(':', colon):
                return None
            split = _scan(base, colon + 1)[1]
        if not base.startswith((',', '}'), split):
            return None
        old = _tail_members(base[split:], serialized) if base.startswith(',', split) else []
        new = _tail_members(tail, serialized)
    except (ValueError, RecursionError, StopIteration):
        return None
    # Member i of the new tail is copied when the base spells the same member at the same place (the
    # usual case: the same keys, some values stamped anew), else written out.
    ops = [
        str(index) if index <= len(old) and raw == old[index - 1] else '{' + raw + '}'
        for index, raw in enumerate(new, 1)
    ]
    return base[:split] + tail, PATCH_PREFIX + ','.join([str(base_index), '0', *ops]) + ']}'


def scalar_members(tail: str) -> list[str] | None:
    """The raw members (`"key":value`) of `,"key":value,...}` when every value is a string, a number
    or a literal (a request's fields after its parts, as a rule), found in one pass; else `None`."""
    found: list[str] = _FLAT_MEMBER.findall(tail, 0, len(tail) - 1)
    if tail.endswith('}') and sum(map(len, found)) + len(found) == len(tail) - 1:
        return found  # the matches tile the text: they are its members
    return None


def serialized_scalar_members(tail: str) -> list[str] | None:
    """`scalar_members` of a tail pydantic serialized (compact, valid JSON), by splitting, unchecked.

    Without a brace or bracket anywhere, every value is a scalar, and an unescaped `,"` starts a
    member unless it closes a string ending in a comma: then a `,"` is followed by `,` or `:`, or
    ends the tail, and the tail is left to `scalar_members`. A raw NUL cannot occur in JSON text.
    """
    if (
        not tail.startswith(',"')
        or not tail.endswith('}')
        or tail.endswith(',"}')
        or '{' in tail
        or '[' in tail
        or ',",' in tail
        or ',":' in tail
        or '\x00' in tail
    ):
        return None
    return tail[1:-1].replace(',"', '\x00"').split('\x00')


def _tail_members(tail: str, serialized: bool = False) -> list[str]:
    """The raw members of `,"key":value,...}`; a tail holding an object (`metadata`) is scanned."""
    found = serialized_scalar_members(tail) if serialized else None
    found = found if found is not None else scalar_members(tail)
    return found if found is not None else [raw for _, raw, _ in _members('{' + tail[1:])]


def apply_patch(patch: str, base: str) -> str:
    """The text `patch` was made from, given its base text. Raises `ValueError` if it does not apply."""
    if is_patch(base):
        raise ValueError('a patch base must be a full text')
    return apply_ops(patch_ops(patch)[1], base)


def patch_base_index(patch: str) -> int:
    """The log index of the entry `patch` applies to. Raises `ValueError` if `patch` is not one."""
    return patch_ops(patch)[0]


def _array_op(index: int, old_value: str, new_value: str) -> str | None:
    try:
        old = _elements(old_value)
        new = _elements(new_value)
    except (ValueError, RecursionError):
        return None
    positions: dict[str, int] = {}
    for position, raw in enumerate(old):
        positions.setdefault(raw, position)
    items = [str(index)]
    for raw in new:
        position = positions.get(raw)
        if position is not None:
            items.append(str(position))
        elif _INT.fullmatch(raw):
            return None  # a new integer element would read as a reference
        else:
            items.append(raw)
    return '[' + ','.join(items) + ']'


def patch_ops(patch: str) -> tuple[int, list[str]]:
    """The base index and the ops of a patch. Raises `ValueError` if `patch` is not one."""
    members = _members(patch)
    if len(members) != 1 or members[0][0] != '$patch':
        raise ValueError('not a patch')
    _, raw, at = members[0]
    items = _elements(raw[at:])
    if not items:
        raise ValueError('a patch names its base')
    return _index(items[0], None), items[1:]


def apply_ops(ops: list[str], base: str) -> str:
    """The text the ops rebuild from the full text `base`. Raises `ValueError` if they do not apply."""
    old = _members(base)
    pieces: list[str] = []
    for op in ops:
        if op.startswith('{'):
            members = _members(op)
            if len(members) != 1:
                raise ValueError(f'a patch member must be one key and value, got {op[:80]!r}')
            pieces.append(members[0][1])
        elif op.startswith('['):
            items = _elements(op)
            if not items:
                raise ValueError('an array op names its base member')
            _, raw, at = old[_index(items[0], len(old))]
            elements = _elements(raw[at:])
            rebuilt = [elements[_index(item, len(elements))] if _INT.fullmatch(item) else item for item in items[1:]]
            pieces.append(raw[:at] + '[' + ','.join(rebuilt) + ']')
        else:
            pieces.append(old[_index(op, len(old))][1])
    return '{' + ','.join(pieces) + '}'


def _index(raw: str, size: int | None) -> int:
    if not _INT.fullmatch(raw):
        raise ValueError(f'expected an index, got {raw[:80]!r}')
    value = int(raw)
    if value < 0 or (size is not None and value >= size):
        raise ValueError(f'index {value} out of range')
    return value


def _members(text: str) -> list[tuple[str, str, int]]:
    """The top-level members of a compact JSON object: `(key, raw "key":value, offset of value in raw)`."""
    if not text.startswith('{'):
        raise ValueError('not a JSON object')
    members: list[tuple[str, str, int]] = []
    if text == '{}':
        return members
    end = len(text) - 1
    start = 1
    try:
        while True:
            if not text.startswith('"', start):
                raise ValueError('not a compact JSON object')
            key, colon = _scan(text, start)
            if not text.startswith(':', colon):
                raise ValueError('not a compact JSON object')
            stop = _scan(text, colon + 1)[1]
            members.append((key, text[start:stop], colon + 1 - start))
            if stop == end and text[stop] == '}':
                return members
            if not text.startswith(',', stop):
                raise ValueError('not a compact JSON object')
            start = stop + 1
    except StopIteration as error:
        raise ValueError(f'not JSON at {error.value}') from None


def _elements(text: str) -> list[str]:
    """The raw elements of a compact JSON array."""
    if not text.startswith('['):
        raise ValueError('not a JSON array')
    if text == '[]':
        return []
    elements: list[str] = []
    end = len(text) - 1
    start = 1
    try:
        while True:
            stop = _scan(text, start)[1]
            elements.append(text[start:stop])
            if stop == end and text[stop] == ']':
                return elements
            if not text.startswith(',', stop):
                raise ValueError('not a compact JSON array')
            start = stop + 1
    except StopIteration as error:
        raise ValueError(f'not JSON at {error.value}') from None
