"""The `StepPersistence` capability: hooks (`_persistence`), how records are written (`_writers`), the
durable operations an engine journals (`_operations`), and the pydantic-ai internals relied on
(`_internals`)."""

from __future__ import annotations

from ._events import SnapshotSaved
from ._ledger import annotate_tool_effect
from ._persistence import StepPersistence
from ._validity import is_provider_valid

__all__ = ['SnapshotSaved', 'StepPersistence', 'annotate_tool_effect', 'is_provider_valid']
