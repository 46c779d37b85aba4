"""Which id a run is stored under: explicit, derived from the agent's name, or pydantic-ai's own."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace

from .._errors import RunAlreadyExistsError
from .._records import RunRecord
from ..store.protocol import StepStore

DERIVED_ID_ATTEMPTS = 8


def derive_run_id(agent_name: str | None, source: str | None, *, attempt: int) -> str:
    """`'{agent_name}-{8 hex}'`, fresh per run yet stable under durable replay.

    The hex comes from pydantic-ai's own run id (new for every `.run()`), so a durable engine
    replaying the run derives the same id; a clash with an earlier run draws again (`attempt`).
    Without an agent name, pydantic-ai's run id itself.
    """
    seed = source if source is not None else str(uuid.uuid4())
    if agent_name is None:
        return seed if attempt == 0 else f'{seed}-{attempt}'
    digest = hashlib.sha256(f'{agent_name}\0{seed}\0{attempt}'.encode()).hexdigest()
    return f'{agent_name}-{digest[:8]}'


async def claim_run_id(
    store: StepStore,
    record: RunRecord,
    register: Callable[[RunRecord], Awaitable[None]],
    derived_from: tuple[str | None, str | None] | None,
) -> str:
    """`register(record)`, drawing a derived id again while it clashes with an earlier run.

    A clash with a run of the same `registration_id` is a durable retry of this very
    registration and passes. An explicit id that clashes raises `RunAlreadyExistsError`.
    """
    candidate = record.run_id
    for attempt in range(1, DERIVED_ID_ATTEMPTS + 1):
        try:
            await register(replace(record, run_id=candidate, metadata=dict(record.metadata)))
            return candidate
        except RunAlreadyExistsError:
            existing = await store.get_run(run_id=candidate)
            if existing is not None and existing.registration_id == record.registration_id:
                return candidate
            if derived_from is None:
                raise RunAlreadyExistsError(candidate) from None
            name, source = derived_from
            candidate = derive_run_id(name, source, attempt=attempt)
    raise RunAlreadyExistsError(candidate)
