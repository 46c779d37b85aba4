"""The default media store of a `SqliteStepStore`, in the step store's own database file."""

from __future__ import annotations

import sqlite3

from ....media.stores.sqlite import SqliteMediaStore
from ._schema import Columns, check_step_tables


class OwnMediaStore(SqliteMediaStore):
    """A `SqliteMediaStore` that refuses another application's database as the step store does.

    A snapshot puts its payloads before the step store's first statement reaches the database, so
    this store's first put must not be what changes such a database (its journal mode, a table).
    """

    def _check_database(self, conn: sqlite3.Connection) -> None:
        check_step_tables(Columns.read(conn), str(self._database))
        super()._check_database(conn)

    def __repr__(self) -> str:
        return f'SqliteMediaStore(database={self._database!r}, table={self._table!r})'
