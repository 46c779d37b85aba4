"""INSERT statements that spell `NULL` in place of a row's `None` values instead of binding them.

CPython's `sqlite3` binds a `None` parameter through its adapter lookup, which on Python 3.11
formats an `AttributeError` and throws it away: an event row with half its columns empty cost
about twice as much to insert as the same row with its blanks bound as values. A table's rows
leave few patterns of columns empty (one per kind of record), so each pattern gets a statement of
its own, built once, and only the values are bound.
"""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Collection, Iterable, Sequence

_KEPT_STATEMENTS = 64
"""Statements an `Insert` keeps; rows of rarer patterns have theirs built each time. A table's
records leave a handful of patterns (about one per kind of record), and a caller's connection
caches 128 compiled statements unless told otherwise."""


class Insert:
    """`INSERT INTO table (columns) VALUES (...) suffix`, run for rows of values in `columns` order
    (a row is read twice: a tuple, or the values of a row dict)."""

    def __init__(self, table: str, columns: Sequence[str], suffix: str = '') -> None:
        self._table = table
        self._head = f'INSERT INTO {table} ({", ".join(columns)}) VALUES ('
        self._tail = f') {suffix}' if suffix else ')'
        self._nones = (None,) * len(columns)
        self._statements: dict[tuple[bool, ...], str] = {}

    def statement(self, bound: tuple[bool, ...]) -> str:
        """The statement binding the columns marked in `bound` and writing `NULL` for the others."""
        statement = self._statements.get(bound)
        if statement is None:
            statement = self._head + ', '.join('?' if value else 'NULL' for value in bound) + self._tail
            if len(self._statements) < _KEPT_STATEMENTS:
                self._statements[bound] = statement
        return statement

    def execute(self, conn: sqlite3.Connection, row: Collection[object]) -> sqlite3.Cursor:
        bound = self._bound(row)
        return conn.execute(self.statement(bound), tuple(itertools.compress(row, bound)))

    def executemany(self, conn: sqlite3.Connection, rows: Iterable[Collection[object]]) -> None:
        """Insert `rows` in their order (a rowid follows it): one `executemany` per stretch of rows
        whose `None`s sit in the same columns."""
        stretch: list[tuple[object, ...]] = []
        stretch_bound: tuple[bool, ...] = ()
        for row in rows:
            bound = self._bound(row)
            if bound != stretch_bound and stretch:
                conn.executemany(self.statement(stretch_bound), stretch)
                stretch = []
            stretch_bound = bound
            stretch.append(tuple(itertools.compress(row, bound)))
        if stretch:
            conn.executemany(self.statement(stretch_bound), stretch)

    def _bound(self, row: Collection[object]) -> tuple[bool, ...]:
        """Which of the row's values are bound (not `None`); a row of another width is refused, as
        SQLite refuses a statement given too few or too many parameters."""
        if len(row) != len(self._nones):
            raise sqlite3.ProgrammingError(
                f'{len(row)} values given for the {len(self._nones)} columns of an insert into {self._table}'
            )
        return tuple(map(operator.is_not, row, self._nones))
