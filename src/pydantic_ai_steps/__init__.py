"""Durable step records for pydantic-ai agents.

`StepPersistence` is a pydantic-ai capability that records an append-only event log, continuable
message-history snapshots and a tool side-effect ledger for every run, into a pluggable store.
"""

from __future__ import annotations

from .step_persistence import StepPersistence

__all__ = ['StepPersistence']
