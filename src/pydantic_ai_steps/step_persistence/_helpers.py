"""Helpers around a store: continue or fork a run, annotate a tool effect, check a history."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import RunContext

from . import _context
from ._history import TAIL
from ._protocol import StepStore
from ._records import ToolEffectRecord


def is_provider_valid(messages: Sequence[ModelMessage]) -> bool:
    """Whether every tool call in `messages` is answered, in order, exactly once.

    A provider rejects a history with an unanswered call or an orphan return; this is the test
    that decides a snapshot's state (`complete` when valid, `interrupted` otherwise). A legacy
    `RetryPromptPart` naming a tool answers that tool's call, as it did in older histories.
    """
    open_calls = _open_calls_after(messages, set())
    return open_calls is not None and not open_calls


def _open_calls_after(messages: Iterable[ModelMessage], open_calls: set[str]) -> set[str] | None:
    """The calls still open after `messages`, starting from `open_calls`; `None` on an orphan return."""
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    open_calls.add(part.tool_call_id)
            continue
        for part in message.parts:
            answered = _answered_call(part)
            if answered is None:
                continue
            if answered not in open_calls:
                return None
            open_calls.discard(answered)
    return open_calls


class ProviderValidity:
    """`is_provider_valid` for one run's growing history, paying only for what is new.

    It remembers the open calls after a settled prefix (all but the newest `TAIL` messages) and
    resumes from there when the next history starts with the same message objects.
    """

    def __init__(self) -> None:
        self._prefix: list[ModelMessage] = []
        self._open_after_prefix: set[str] = set()

    def check(self, messages: Sequence[ModelMessage]) -> bool:
        known = len(self._prefix)
        if known and len(messages) >= known and all(map(operator.is_, self._prefix, messages[:known])):
            start, open_calls = known, set(self._open_after_prefix)
        else:
            start, open_calls = 0, set[str]()
        checkpoint = max(start, len(messages) - TAIL)
        settled = _open_calls_after(messages[start:checkpoint], open_calls)
        if settled is None:
            return False
        self._prefix = list(messages[:checkpoint])
        self._open_after_prefix = set(settled)
        remaining = _open_calls_after(messages[checkpoint:], settled)
        return remaining is not None and not remaining


def _answered_call(part: object) -> str | None:
    """The tool call id a request part answers, if it answers one."""
    if isinstance(part, ToolReturnPart):
        return part.tool_call_id
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:  # pyright: ignore[reportDeprecated]
        return part.tool_call_id
    return None


async def continue_run(store: StepStore, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """The history of the newest settled snapshot of `run_id`, ready for `message_history=`.

    Only `complete` snapshots unless `include_interrupted=True`: an interrupted one may hold
    tool calls whose effects are unknown (check `list_unresolved_tool_effects` first).
    Raises `LookupError` when the run has no such snapshot.
    """
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
    if snapshot is None:
        kind = 'snapshot' if include_interrupted else 'complete snapshot'
        raise LookupError(f'no continuable {kind} for run_id {run_id!r}')
    return list(snapshot.messages)


async def fork_run(store: StepStore, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """Same history as `continue_run`, for starting a new branch (new run id, new conversation)."""
    return await continue_run(store, run_id=run_id, include_interrupted=include_interrupted)


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
    open_effects = _context.open_tool_effects.get()
    if open_effects is not None and record.tool_call_id in open_effects:
        open_effects[record.tool_call_id] = record  # the entry the capability will close
