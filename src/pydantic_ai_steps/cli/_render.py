r"""Plain-text tables, trees and progress for the terminal, without third-party dependencies.

Colour is ANSI and only on when the stream is a terminal and `NO_COLOR` is unset (see
https://no-color.org), so piping the output into a file or `grep` gives plain text. Progress is
drawn on stderr, only on a terminal, so it never mixes with output a script parses.

Text read from a store is shown, never obeyed: a store may hold anything anyone wrote (a model's
answer, a tool's error, a run id), and printed raw, `ESC ] 0 ; ... BEL` would retitle the window
and `ESC [ 2 J` clear the screen. `printable` shows every C0 control (newline and tab kept in
multi-line text), DEL, every C1 control, the bidi marks, embeddings, overrides and isolates
(U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), which reorder what is shown, and the line
and paragraph separators (U+2028, U+2029), which split it, as the escape Python would write for
it: ESC is the four characters `\x1b`, U+202E is `\u202e`, a carriage return `\r` (and, where a
value must stay on one line, a newline `\n` and a tab `\t`); lone surrogates too, so printing
cannot fail on them.
Backslashes are left as they are, so a stored text spelling `\x1b` looks the same: `--json`
gives the exact values. Tables, trees and the message renderer pass every stored value through
it, and `Output` (in `_commands`) passes every line through `terminal_safe`, which escapes
anything left except the colour codes `Style` writes. JSON output goes through
`json_printable`, which writes those characters as `\u` escapes: the same JSON value, plain
ASCII where it matters.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

_CODES = {
    'bold': '1',
    'dim': '2',
    'red': '31',
    'green': '32',
    'yellow': '33',
    'blue': '34',
    'magenta': '35',
    'cyan': '36',
}


_UNSAFE_PAST_C0 = '\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff'
"""DEL, C1 controls, bidi marks, embeddings, overrides and isolates, line and paragraph separators, lone surrogates."""
_UNSAFE = f'\x00-\x08\x0b-\x1f{_UNSAFE_PAST_C0}'
_UNSAFE_IN_A_LINE = re.compile(f'[\t\n{_UNSAFE}]')
_UNSAFE_IN_A_BLOCK = re.compile(f'[{_UNSAFE}]')
_UNSAFE_IN_JSON = re.compile(f'[{_UNSAFE_PAST_C0}]')
_OWN_SGR = re.compile(r'\x1b\[(?:[0-2]|3[1-6])(?:;(?:[0-2]|3[1-6]))*m')
"""The SGR sequences `Style` writes: reset, bold, dim and the colours, nothing that moves or hides text."""


_NAMED_ESCAPES = {'\t': '\\t', '\n': '\\n', '\r': '\\r'}


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    named = _NAMED_ESCAPES.get(character)
    if named is not None:
        return named
    code = ord(character)
    return f'\\x{code:02x}' if code < 0x100 else f'\\u{code:04x}'


def printable(text: str, *, multiline: bool = False) -> str:
    """`text` with every character that could act on a terminal written as its escape (`\\x1b`).

    `multiline=True` keeps newlines and tabs, for blocks printed over several lines; otherwise
    they are escaped too, so a value stays on its line.
    """
    return (_UNSAFE_IN_A_BLOCK if multiline else _UNSAFE_IN_A_LINE).sub(_escape, text)


def terminal_safe(text: str) -> str:
    """`printable(text, multiline=True)`, except for the SGR colour codes `Style` writes.

    The last guard before a line is written: whatever a command forgot to pass through
    `printable` is escaped here, and only colour codes (`ESC [ ... m`, which cannot move the
    cursor, retitle the window or clear anything) survive.
    """
    if '\x1b' not in text:
        return printable(text, multiline=True)
    pieces: list[str] = []
    position = 0
    for match in _OWN_SGR.finditer(text):
        pieces.append(printable(text[position : match.start()], multiline=True))
        pieces.append(match.group())
        position = match.end()
    pieces.append(printable(text[position:], multiline=True))
    return ''.join(pieces)


def json_printable(text: str) -> str:
    """JSON text with DEL, C1 controls, bidi controls, line separators and lone surrogates as `\\u` escapes.

    `json.dumps(..., ensure_ascii=False)` already escapes C0 controls; these it leaves raw.
    Inside JSON they can only occur in strings, so the result is the same JSON value.
    """
    return _UNSAFE_IN_JSON.sub(lambda match: f'\\u{ord(match.group()):04x}', text)


def colour_enabled(stream: TextIO) -> bool:
    """ANSI colour on a terminal unless `NO_COLOR` is set to anything non-empty."""
    if os.environ.get('NO_COLOR'):
        return False
    isatty = getattr(stream, 'isatty', None)
    return bool(isatty and isatty())


@dataclass(frozen=True)
class Style:
    """Applies colours when enabled, and is the identity otherwise."""

    enabled: bool

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        return cls(colour_enabled(stream))

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles or not text:
            return text
        codes = ';'.join(_CODES[name] for name in styles)
        return f'\x1b[{codes}m{text}\x1b[0m'


STATUS_COLOURS = {
    'completed': 'green',
    'failed': 'red',
    'unfinished': 'yellow',
    'started': 'yellow',
    'complete': 'green',
    'interrupted': 'yellow',
}
"""Colours for the status words of runs, tool effects and snapshots."""


Cell = str | tuple[str, str]
"""A table cell: plain text, or `(text, colour)`."""


def table(
    headers: Sequence[str] | None, rows: Sequence[Sequence[Cell]], style: Style, *, width: int | None = None
) -> str:
    """Left-aligned columns separated by two spaces; the header (if any) in bold.

    With `width` (a terminal's), the widest columns are shortened with an ellipsis until the table
    fits, so a long id or error does not wrap every line; without it nothing is cut.
    """
    texts = [[_text(cell) for cell in row] for row in rows]
    columns = len(headers) if headers is not None else max((len(row) for row in rows), default=0)
    titles = list(headers) if headers is not None else [''] * columns
    widths = [max([len(title), *(len(row[i]) for row in texts)]) for i, title in enumerate(titles)]
    if width is not None:
        widths = _fit(widths, width)
    lines: list[str] = []
    if headers is not None:
        lines.append(
            '  '.join(style(_cut(title, widths[i]).ljust(widths[i]), 'bold') for i, title in enumerate(titles))
        )
    for row, row_texts in zip(rows, texts, strict=True):
        cells: list[str] = []
        for i, (cell, text) in enumerate(zip(row, row_texts, strict=True)):
            shown = _cut(text, widths[i])
            padded = shown.ljust(widths[i]) if i < columns - 1 else shown
            cells.append(style(padded, cell[1]) if isinstance(cell, tuple) and cell[1] else padded)
        lines.append('  '.join(cells))
    return '\n'.join(line.rstrip() for line in lines)


def _text(cell: Cell) -> str:
    text = cell[0] if isinstance(cell, tuple) else cell
    return printable(' '.join(text.split()) if '\n' in text else text)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + '…'


def _fit(widths: list[int], width: int) -> list[int]:
    """Shrink the widest column one character at a time until the row fits (or all are at 6)."""
    widths = list(widths)
    floor = [min(column, 6) for column in widths]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=lambda i: widths[i] - floor[i])
        if widths[widest] <= floor[widest]:
            break
        widths[widest] -= 1
    return widths


@dataclass
class TreeNode:
    label: str
    children: list[TreeNode]


def tree(roots: Sequence[TreeNode], stream: TextIO) -> str:
    """Box-drawing branches, or ASCII ones when the stream's encoding cannot show them."""
    unicode = _can_encode(stream, '├─└│')
    branch, last, pipe = ('├─ ', '└─ ', '│  ') if unicode else ('|- ', '`- ', '|  ')
    lines: list[str] = []

    def walk(node: TreeNode, prefix: str, connector: str, child_prefix: str) -> None:
        lines.append(prefix + connector + node.label)
        for index, child in enumerate(node.children):
            final = index == len(node.children) - 1
            walk(child, prefix + child_prefix, last if final else branch, '   ' if final else pipe)

    for root in roots:
        walk(root, '', '', '')
    return '\n'.join(lines)


def _can_encode(stream: TextIO, text: str) -> bool:
    encoding = getattr(stream, 'encoding', None) or 'utf-8'
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def terminal_width(stream: TextIO) -> int | None:
    """The terminal's width when `stream` is one; `None` in a pipe (never cut piped output)."""
    isatty = getattr(stream, 'isatty', None)
    if not (isatty and isatty()):
        return None
    return shutil.get_terminal_size().columns


def when(moment: datetime | None) -> str:
    """A UTC timestamp to the millisecond: sortable, and the same on every machine."""
    if moment is None:
        return '-'
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]


def size(count: int) -> str:
    """`394,127 B (385 KiB)`: exact bytes for scripts and eyes, a rounded unit for eyes."""
    if count < 1024:
        return f'{count:,} B'
    value = float(count)
    for unit in ('KiB', 'MiB', 'GiB', 'TiB'):
        value /= 1024
        if value < 1024 or unit == 'TiB':
            return f'{count:,} B ({value:.1f} {unit})'
    raise AssertionError('unreachable')


class ProgressLine:
    """`reading runs 12/340` redrawn in place on stderr, only when stderr is a terminal.

    Throttled to ten redraws a second and erased when done, so fast commands show nothing and a
    slow one shows it is alive. Usable as the `progress` callback of `_inspect` readers.
    """

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self._label = printable(label)
        self._stream = stream if stream is not None else sys.stderr
        isatty = getattr(self._stream, 'isatty', None)
        self._enabled = bool(isatty and isatty())
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        self._stream.write(f'\r{self._label} {done}/{total}')
        self._stream.flush()
        self._drawn = True

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._drawn:
            self._stream.write('\r\x1b[2K')
            self._stream.flush()
