"""`annotate_tool_effect`: a tool's own note on its ledger entry, written before its side effect."""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext

from .._errors import check_optional_text
from .._records import ToolEffectRecord
from ..store.protocol import ManagedStepStore, StepStore
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
    A tool that runs in another process than its run (a Temporal activity) finds its run in the
    store by pydantic-ai's run id, with a store that can filter by it (every shipped one).
    """
    check_optional_text(idempotency_key, 'annotate_tool_effect(idempotency_key=...)')
    check_optional_text(effect_summary, 'annotate_tool_effect(effect_summary=...)')
    if ctx.tool_call_id is None or ctx.tool_name is None:
        return
    run_id = _context.current_run_id()
    prior = None
    if run_id is not None:
        prior = await store.get_tool_effect(run_id=run_id, tool_call_id=ctx.tool_call_id)
    elif isinstance(store, ManagedStepStore) and ctx.run_id is not None:
        for run in reversed(await store.list_runs(pydantic_ai_run_id=ctx.run_id)):
            prior = await store.get_tool_effect(run_id=run.run_id, tool_call_id=ctx.tool_call_id)
            if prior is not None:
                run_id = run.run_id
                break
    if prior is None or run_id is None:
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
