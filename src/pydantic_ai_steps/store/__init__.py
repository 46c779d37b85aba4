"""The store kernel, for those who write a backend of their own (see `docs/backends.md`).

- `Backend` (in `store.backend`): the storage primitives a backend implements, with its data types;
  `TidiesLeftovers`, for one whose killed writes can leave something behind.
- `StepStoreBase`: every public store method on top of a `Backend`.
- `Encoding`: how a backend wants values represented in its rows.
- `open_step_store` / `register_scheme`: stores from URLs.
"""

from __future__ import annotations

from .._records import RunQuery
from .backend import (
    RESOLUTION_FIELDS,
    STALE,
    SUPPRESSED,
    Backend,
    Closing,
    CommitOutcome,
    Damaged,
    LogEntry,
    LogSlice,
    Probe,
    Row,
    SnapshotRow,
    SnapshotWrite,
    TidiesLeftovers,
    WriteBatch,
    resolved_effect,
    upserted_effect,
)
from .base import StepStoreBase
from .codec import Encoding
from .maintenance import BlobInfo, CollectableMediaStore, GarbageResult, PruneResult
from .protocol import ManagedStepStore, RecordBatchStore, StepStore
from .registry import StoreLocation, StoreScheme, StoreUrlError, open_step_store, register_scheme

__all__ = [
    'RESOLUTION_FIELDS',
    'STALE',
    'SUPPRESSED',
    'Backend',
    'BlobInfo',
    'Closing',
    'CollectableMediaStore',
    'CommitOutcome',
    'Damaged',
    'Encoding',
    'GarbageResult',
    'LogEntry',
    'LogSlice',
    'ManagedStepStore',
    'Probe',
    'PruneResult',
    'RecordBatchStore',
    'Row',
    'RunQuery',
    'SnapshotRow',
    'SnapshotWrite',
    'StepStore',
    'StepStoreBase',
    'StoreLocation',
    'StoreScheme',
    'StoreUrlError',
    'TidiesLeftovers',
    'WriteBatch',
    'open_step_store',
    'register_scheme',
    'resolved_effect',
    'upserted_effect',
]
