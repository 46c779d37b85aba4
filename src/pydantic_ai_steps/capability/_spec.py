"""Building the capability: its arguments checked, and a store from an agent spec's keyword arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import InvalidRecordError, check_optional_text, check_run_id, check_str_map
from ..store.protocol import StepStore

if TYPE_CHECKING:
    from ._persistence import StepPersistence

BACKENDS = ('memory', 'file', 'sqlite', 'postgres', 'mongodb')


def check_arguments(persistence: StepPersistence[Any]) -> dict[str, str]:
    """Fail at construction, not mid-run, on an argument of the wrong kind; return `metadata` as kept (a copy)."""
    p = persistence
    if not isinstance(p.store, StepStore):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f'store must be a StepStore (for example SqliteStepStore), got {p.store!r}')
    check_optional_text(p.agent_name, 'agent_name')
    check_optional_text(p.parent_run_id, 'parent_run_id')
    if p.run_id is not None:
        check_run_id(p.run_id)
    metadata = check_str_map(p.metadata, 'metadata')
    if not isinstance(p.capture_frontier, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidRecordError(f'capture_frontier must be True or False, got {p.capture_frontier!r}')
    return metadata


def store_from_spec(kwargs: dict[str, Any]) -> StepStore:
    """Pop the store settings out of `kwargs` and build the store they name."""
    backend = kwargs.pop('backend', 'memory')
    options: dict[str, Any] = {'max_snapshots_per_run': kwargs.pop('max_snapshots_per_run', None)}
    if backend == 'memory':
        from ..store.backends.memory import InMemoryStepStore

        return InMemoryStepStore(**options)
    if backend == 'file':
        from ..store.backends.file import FileStepStore

        return FileStepStore(kwargs.pop('directory', '.step-persistence'), **options)
    if backend == 'sqlite':
        from ..store.backends.sqlite import SqliteStepStore

        return SqliteStepStore(database=kwargs.pop('database', '.step-persistence.db'), **options)
    if backend == 'postgres':
        from ..store.backends.postgres import PostgresStepStore

        if 'dsn' not in kwargs:
            raise ValueError("backend='postgres' needs dsn= (a postgresql:// URL)")
        return PostgresStepStore(dsn=kwargs.pop('dsn'), table=kwargs.pop('table', 'step_persistence'), **options)
    if backend == 'mongodb':
        from ..store.backends.mongo import MongoStepStore

        db_url, database = kwargs.pop('db_url', None), kwargs.pop('database', None)
        if db_url is None or database is None:
            raise ValueError(
                "backend='mongodb' needs db_url= (a mongodb:// URL) and database= (the database name), "
                f'got db_url={"<given>" if db_url is not None else None}, database={database!r}'
            )
        return MongoStepStore(db_url=db_url, database=database, **options)
    raise ValueError(f'unknown backend {backend!r}; expected one of {", ".join(map(repr, BACKENDS))}')
