"""Step persistence: the capability, the records, the store protocol, stores and helpers.

Stores that need an optional driver (`MongoStepStore`: the `mongodb` extra) are imported on first
use, so this package and `from pydantic_ai_steps.step_persistence import *` work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_loader, star_exports
from ._capability import StepPersistence
from ._errors import InvalidRunIdError, RunAlreadyExistsError
from ._events import SnapshotSaved
from ._helpers import annotate_tool_effect, continue_run, fork_run, is_provider_valid
from ._protocol import RecordBatchStore, StepStore
from ._records import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from .stores.memory import InMemoryStepStore

if TYPE_CHECKING:
    from .stores.file import FileStepStore as FileStepStore
    from .stores.sqlite import SqliteStepStore as SqliteStepStore

_LAZY = {
    'FileStepStore': ('.stores.file', None),
    'SqliteStepStore': ('.stores.sqlite', None),
    'MongoStepStore': ('.stores.mongo', 'pymongo'),
    'PostgresStepStore': ('.stores.postgres', None),
}
__getattr__ = lazy_loader(__name__, _LAZY)

__all__ = [
    'ContinuableSnapshot',
    'EventKind',
    'InMemoryStepStore',
    'InvalidRunIdError',
    'RecordBatchStore',
    'RunAlreadyExistsError',
    'RunRecord',
    'SnapshotSaved',
    'SnapshotState',
    'StepEvent',
    'StepPersistence',
    'StepStore',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'annotate_tool_effect',
    'continue_run',
    'fork_run',
    'is_provider_valid',
]
__all__ += star_exports(__name__, _LAZY)  # pyright: ignore[reportUnsupportedDunderAll]
