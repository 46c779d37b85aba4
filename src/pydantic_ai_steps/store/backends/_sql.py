"""`RunQuery` as a SQL `WHERE ... ORDER BY ... LIMIT`, for the SQL backends.

A filter the dialect cannot express exactly (a metadata key that is not a plain identifier, say)
is left to the kernel, which filters again; the `LIMIT` is then left out too, since cutting
before every filter applied would drop matching rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..._json import compact_json
from ..._records import RUN_EQUALITY_FIELDS, RunQuery
from ..codec import Encoding

_PLAIN_KEY = re.compile(r'[A-Za-z0-9_]{1,64}')


@dataclass
class SqlQuery:
    where: list[str] = field(default_factory=list[str])
    params: list[Any] = field(default_factory=list[Any])
    exact: bool = True

    def clause(self) -> str:
        return f' WHERE {" AND ".join(self.where)}' if self.where else ''


@dataclass(frozen=True)
class Dialect:
    """How one SQL database spells parameters and reads a JSON text column."""

    placeholder: Callable[[int], str]
    """The n-th parameter (1-based): `?` or `$n`."""
    json_equals: Callable[[str, str, object], str | None]
    """`json_equals(column, key, value)`: a condition, with `{}` where `value` is bound, true when the
    JSON object in `column` has `key` equal to the scalar `value`; `None` when it cannot be exact."""
    json_param: Callable[[object], object] = lambda value: value
    """What is bound where `json_equals` put `{}`: the value itself, or (PostgreSQL) its JSON text."""
    time: Callable[[str], str] = lambda column: column
    """A timestamp column as the filters compare it (PostgreSQL reads a text column of an older layout
    as `timestamptz`)."""


def run_filters(query: RunQuery, dialect: Dialect, encoding: Encoding, columns: set[str] | None = None) -> SqlQuery:
    """The WHERE clauses for `query`. `columns`: the runs table's columns, when some may be missing."""
    sql = SqlQuery()

    def add(condition: str, *values: Any) -> None:
        placeholders = [dialect.placeholder(len(sql.params) + offset + 1) for offset in range(len(values))]
        sql.where.append(condition.format(*placeholders))
        sql.params.extend(values)

    def has(column: str) -> bool:
        return columns is None or column in columns

    for name in RUN_EQUALITY_FIELDS:
        value = getattr(query, name)
        if value is None:
            continue
        if has(name):
            add(f'{name} = {{}}', value)
        else:
            add('1 = 0')  # a database without the column holds no such run
    if query.status is not None:
        if not has('status'):
            if query.status != 'unfinished':
                add('1 = 0')
        elif query.status == 'unfinished':
            add('status IS NULL')
        else:
            add('status = {}', query.status)
    if query.started_after is not None:
        add(f'{dialect.time("started_at")} >= {{}}', encoding.time(query.started_after))
    if query.started_before is not None:
        add(f'{dialect.time("started_at")} < {{}}', encoding.time(query.started_before))
    if query.ended_before is not None:
        if has('ended_at'):
            add(f'{dialect.time("ended_at")} < {{}}', encoding.time(query.ended_before))
        else:
            add('1 = 0')
    for column, wanted in (('metadata', query.metadata), ('run_metadata', query.run_metadata)):
        for key, value in (wanted or {}).items():
            if not has(column) or not _PLAIN_KEY.fullmatch(key):
                sql.exact = False
                continue
            condition = dialect.json_equals(column, key, value)
            if condition is None:
                sql.exact = False
            elif '{}' in condition:
                add(condition, dialect.json_param(value))
            else:
                add(condition)
    return sql


def order_and_limit(query: RunQuery, sql: SqlQuery, dialect: Dialect, tiebreak: str) -> str:
    direction = 'DESC' if query.newest_first else 'ASC'
    text = f' ORDER BY {dialect.time("started_at")} {direction}, {tiebreak} {direction}'
    if query.limit is not None and sql.exact:
        sql.params.append(query.limit)
        text += f' LIMIT {dialect.placeholder(len(sql.params))}'
    return text


def _sqlite_json_equals(column: str, key: str, value: object) -> str | None:
    kind = f"json_type({column}, '$.{key}')"
    if value is None:
        return f"{kind} = 'null'"
    if isinstance(value, bool):
        return f"{kind} = '{'true' if value else 'false'}'"
    if isinstance(value, str):
        return f"{kind} = 'text' AND json_extract({column}, '$.{key}') = {{}}"
    return None  # numbers: 1 and 1.0 are spelled differently; the kernel compares them


SQLITE = Dialect(placeholder=lambda _: '?', json_equals=_sqlite_json_equals)


def _postgres_json_equals(column: str, key: str, value: object) -> str | None:
    # `jsonb` equality is exact for every JSON scalar (numbers by value: 1 = 1.0, as in Python), and a
    # text column of an older layout reads the same through the cast (a no-op on a `jsonb` column).
    del value
    return f"(({column})::jsonb -> '{key}') = ({{}})::jsonb"


def _postgres_json_param(value: object) -> object:
    return compact_json(value)


POSTGRES = Dialect(
    placeholder=lambda index: f'${index}',
    json_equals=_postgres_json_equals,
    json_param=_postgres_json_param,
    time=lambda column: f'({column})::timestamptz',
)
"""`$n` parameters; JSON filters through `jsonb`; timestamps compared as `timestamptz` (text columns of
the upstream layout included)."""
