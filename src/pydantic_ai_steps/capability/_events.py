"""The capability event announcing each saved snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_ai import CapabilityEvent

from .._records import SnapshotState


@dataclass(kw_only=True)
class SnapshotSaved(CapabilityEvent, namespace='pydantic_ai_steps', name='snapshot_saved'):
    """Emitted after a snapshot is durably stored, so a UI or supervisor can react to it.

    The namespace is this package's own: pydantic-ai rejects two event classes registered under
    one kind, and this package must be importable beside other step-persistence libraries.
    """

    persistence_run_id: str
    conversation_id: str | None
    step_index: int
    state: SnapshotState
