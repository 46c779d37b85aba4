"""Plain-text tables, trees and progress for the terminal, without third-party dependencies.

Colour is ANSI and only on when the stream is a terminal and `NO_COLOR` is unset (see
https://no-color.org), so piping the output into a file or `grep` gives plain text. Progress is
drawn on stderr, only on a terminal, so it never mixes with output a script parses.
"""

from __future__ import annotations

import os
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
    return ' '.join(text.split()) if '\n' in text else text


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
    """A UTC timestamp to the second: sortable, and the same on every machine."""
    if moment is None:
        return '-'
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime('%Y-%m-%d %H:%M:%S')


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
        self._label = label
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
