"""Step persistence: the capability, the records, the store protocol, stores and helpers.

Stores that need an optional driver (`MongoStepStore`: the `mongodb` extra; `PostgresStepStore`:
the `postgres` extra) are imported on first use, so this package and
`from pydantic_ai_steps.step_persistence import *` work without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import (
    DatabaseLockedError,
    DatabaseReadOnlyError,
    EffectAlreadyResolvedError,
    InvalidRecordError,
    InvalidRunIdError,
    NotAStoreError,
    RecordTooLargeError,
    RunAlreadyExistsError,
    RunNotFoundError,
    SchemaVersionError,
    StepsError,
    StoreUnavailableError,
    StoreUrlError,
)
from .._lazy import lazy_loader, star_exports
from .._records import (
    ContinuableSnapshot,
    EffectResolution,
    EventKind,
    RunQuery,
    RunRecord,
    RunStatus,
    SnapshotRef,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from ..capability import SnapshotSaved, StepPersistence, annotate_tool_effect, is_provider_valid
from ..store.backends.memory import InMemoryStepStore
from ..store.protocol import ManagedStepStore, RecordBatchStore, StepStore
from ..store.registry import open_step_store
from .recovery import continue_conversation, continue_run, fork_run, run_record_for

if TYPE_CHECKING:
    from ..store.backends.file import FileStepStore as FileStepStore
    from ..store.backends.mongo import MongoStepStore as MongoStepStore
    from ..store.backends.postgres import PostgresStepStore as PostgresStepStore
    from ..store.backends.sqlite import SqliteStepStore as SqliteStepStore

_LAZY = {
    'FileStepStore': ('..store.backends.file', None),
    'SqliteStepStore': ('..store.backends.sqlite', None),
    'MongoStepStore': ('..store.backends.mongo', 'pymongo'),
    'PostgresStepStore': ('..store.backends.postgres', None),
}
__getattr__ = lazy_loader(__name__, _LAZY)

__all__ = [
    'ContinuableSnapshot',
    'DatabaseLockedError',
    'DatabaseReadOnlyError',
    'EffectAlreadyResolvedError',
    'EffectResolution',
    'EventKind',
    'InMemoryStepStore',
    'InvalidRecordError',
    'InvalidRunIdError',
    'ManagedStepStore',
    'NotAStoreError',
    'RecordBatchStore',
    'RecordTooLargeError',
    'RunAlreadyExistsError',
    'RunNotFoundError',
    'RunQuery',
    'RunRecord',
    'RunStatus',
    'SchemaVersionError',
    'SnapshotRef',
    'SnapshotSaved',
    'SnapshotState',
    'StepEvent',
    'StepPersistence',
    'StepStore',
    'StepsError',
    'StoreUnavailableError',
    'StoreUrlError',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'annotate_tool_effect',
    'continue_conversation',
    'continue_run',
    'fork_run',
    'is_provider_valid',
    'open_step_store',
    'run_record_for',
]
__all__ += star_exports(__name__, _LAZY)  # pyright: ignore[reportUnsupportedDunderAll]
