"""`annotate_tool_effect`: a tool's own note on its ledger entry, written before its side effect."""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext

from .._records import ToolEffectRecord
from ..store.protocol import StepStore
from . import _context


async def annotate_tool_effect(
    store: StepStore,
    ctx: RunContext[Any],
    *,
    idempotency_key: str | None = None,
    effect_summary: str | None = None,
) -> None:
    """Attach an idempotency key and a summary to the current tool call's ledger entry.

    Call it from a tool before its side effect, so a recovery can tell what may have happened.
    Outside a tool call of a persisted run it does nothing: tools stay usable without persistence.
    """
    run_id = _context.current_run_id.get()
    if run_id is None or ctx.tool_call_id is None or ctx.tool_name is None:
        return
    prior = await store.get_tool_effect(run_id=run_id, tool_call_id=ctx.tool_call_id)
    if prior is None:
        return
    record = ToolEffectRecord(
        tool_call_id=prior.tool_call_id,
        tool_name=ctx.tool_name,
        run_id=run_id,
        status=prior.status,
        started_at=prior.started_at,
        ended_at=prior.ended_at,
        idempotency_key=idempotency_key if idempotency_key is not None else prior.idempotency_key,
        effect_summary=effect_summary if effect_summary is not None else prior.effect_summary,
    )
    await store.record_tool_effect(record)
    ledger = _context.active_ledger.get()
    if ledger is not None:
        ledger.annotated(record)  # the entry the capability will close
