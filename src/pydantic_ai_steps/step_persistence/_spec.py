"""Building a store from an agent spec's keyword arguments."""

from __future__ import annotations

from typing import Any

from ._protocol import StepStore

BACKENDS = ('memory', 'file', 'sqlite')


def store_from_spec(kwargs: dict[str, Any]) -> StepStore:
    """Pop the store settings out of `kwargs` and build the store they name."""
    backend = kwargs.pop('backend', 'memory')
    limit = kwargs.pop('max_snapshots_per_run', None)
    if backend == 'memory':
        from .stores.memory import InMemoryStepStore

        return InMemoryStepStore(max_snapshots_per_run=limit)
    if backend == 'file':
        from .stores.file import FileStepStore

        return FileStepStore(kwargs.pop('directory', '.step-persistence'), max_snapshots_per_run=limit)
    if backend == 'sqlite':
        from .stores.sqlite import SqliteStepStore

        return SqliteStepStore(database=kwargs.pop('database', '.step-persistence.db'), max_snapshots_per_run=limit)
    raise ValueError(f'unknown backend {backend!r}; expected one of {", ".join(map(repr, BACKENDS))}')
