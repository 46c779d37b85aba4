"""Recovery: find a run's record, decide how to resume it, and get the history to resume from.

- `run_record_for(store, result)`: the `RunRecord` of a finished `AgentRunResult` (or of
  pydantic-ai's run id).
- `inspect_recovery(store=, run_id=)`: everything needed to decide how to resume a run, in one call.
- `continue_run` / `fork_run`: the history of a run's newest settled snapshot. The run given that
  history records where it came from (`RunRecord.continued_from` / `forked_from`), recognised by
  the returned message objects: not after a trip through JSON, nor in a later turn built on them.
- `continue_conversation`: the newest continuable history across a conversation's runs.

`include_interrupted=True` gives back the newest snapshot whatever its state. An interrupted
snapshot ends with the model's tool calls that have no return yet; pydantic-ai does not re-run
them when the history is continued: it answers each with a return saying "The tool call was
interrupted before a result was produced" and asks the model again, which may call the tool anew.
Check `unresolved` first (and `resolve_tool_effect` once you know) when a call has side effects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.run import AgentRunResult

from .._errors import check_bool, shortened
from .._records import ContinuableSnapshot, RunRecord, SnapshotRef, ToolEffectRecord
from ..capability._histories import remember_origin
from ..store.protocol import StepStore


@dataclass(frozen=True, kw_only=True)
class RecoveryInspection:
    """What a crashed or failed run left behind. Reading it executes nothing."""

    latest: ContinuableSnapshot | None
    """The newest snapshot of any state (the interrupted frontier, if the run died mid-cycle)."""
    settled: ContinuableSnapshot | None
    """The newest `complete` snapshot: the safe point to continue from."""
    unresolved: tuple[ToolEffectRecord, ...]
    """Tool calls that started, never finished and were not checked since: their side effects may or
    may not have happened."""
    completed_tools: tuple[str, ...]
    failed_tools: tuple[str, ...]


async def inspect_recovery(*, store: StepStore, run_id: str) -> RecoveryInspection:
    _check_id(run_id, 'run_id')
    events = await store.list_events(run_id=run_id)
    latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    settled = await store.latest_snapshot(run_id=run_id)
    unresolved = await store.list_unresolved_tool_effects(run_id=run_id)

    def tools(kind: str) -> tuple[str, ...]:
        names = [event.tool_name for event in events if event.kind == kind and event.tool_name]
        return tuple(dict.fromkeys(names))

    return RecoveryInspection(
        latest=latest,
        settled=settled,
        unresolved=tuple(record for record in unresolved if record.resolution is None),
        completed_tools=tools('tool_call_completed'),
        failed_tools=tools('tool_call_failed'),
    )


async def run_record_for(store: StepStore, result: AgentRunResult[Any] | str) -> RunRecord | None:
    """The stored record of a finished run: give its `AgentRunResult`, or pydantic-ai's run id.

    `result.run_id` is pydantic-ai's id; the record (`RunRecord.run_id`) may have another one
    (`'{agent_name}-{8 hex}'`). Works on every store built on `StepStoreBase`, which index it.
    """
    pydantic_ai_run_id = result if isinstance(result, str) else result.run_id
    list_runs: Any = store.list_runs
    found: list[RunRecord] = await list_runs(pydantic_ai_run_id=pydantic_ai_run_id, limit=1)
    return found[0] if found else None


async def continue_run(store: StepStore, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """The history of the newest settled snapshot of `run_id`, ready for `message_history=`.

    Only `complete` snapshots unless `include_interrupted=True` (see the module docs for what an
    interrupted one gives back). Raises `LookupError` when the run has no such snapshot.
    """
    _check_id(run_id, 'run_id')
    snapshot = await _latest(store, run_id, check_bool(include_interrupted, 'include_interrupted'))
    return _history(snapshot, 'continued')


async def fork_run(
    store: StepStore, *, run_id: str, include_interrupted: bool = False, new_conversation: bool = False
) -> list[ModelMessage]:
    """The same history as `continue_run`, for a new branch; the run given it records `forked_from`.

    With `new_conversation=True` the messages no longer carry the old `conversation_id`, so the
    run given them starts a conversation of its own (pydantic-ai assigns one, or takes yours).
    """
    _check_id(run_id, 'run_id')
    check_bool(new_conversation, 'new_conversation')
    snapshot = await _latest(store, run_id, check_bool(include_interrupted, 'include_interrupted'))
    if new_conversation:
        snapshot.messages = [_without_conversation(message) for message in snapshot.messages]
    return _history(snapshot, 'forked')


async def continue_conversation(
    store: StepStore, *, conversation_id: str, include_interrupted: bool = False
) -> list[ModelMessage]:
    """The newest continuable history across the turns of a conversation (newest run first).

    A turn is a run of the conversation that no other run of it started: a delegate given the
    same `conversation_id` is part of the turn that called it, not a turn of its own, so its
    history is never the one returned. A run that failed before its first boundary, or died while
    its model was first asked, still left its input (the history it was given and its prompt) as
    a snapshot, so the newest turn is found even then (a store without `write_records` saves the
    input only with the first tool call or at a failure). Raises `LookupError` when no turn of
    the conversation has a continuable snapshot.
    """
    _check_id(conversation_id, 'conversation_id')  # `None` would mean every conversation
    check_bool(include_interrupted, 'include_interrupted')
    list_runs: Any = store.list_runs
    try:
        runs: list[RunRecord] = await list_runs(conversation_id=conversation_id, newest_first=True)
    except TypeError:  # a store with only the published protocol's list_runs
        runs = list(reversed(await store.list_runs(conversation_id=conversation_id)))
    members = {record.run_id for record in runs}
    for record in runs:
        if record.parent_run_id in members:
            continue  # a delegate of a turn of this conversation
        snapshot = await store.latest_snapshot(run_id=record.run_id, include_interrupted=include_interrupted)
        if snapshot is not None:
            return _history(snapshot, 'continued')
    kind = 'snapshot' if include_interrupted else 'complete snapshot'
    raise LookupError(f'no run of conversation {conversation_id!r} has a continuable {kind}')


def _check_id(value: object, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f'{name} must be a non-empty string, got {shortened(value)}')


async def _latest(store: StepStore, run_id: str, include_interrupted: bool) -> ContinuableSnapshot:
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
    if snapshot is None:
        kind = 'snapshot' if include_interrupted else 'complete snapshot'
        raise LookupError(f'no continuable {kind} for run_id {run_id!r}')
    return snapshot


def _history(snapshot: ContinuableSnapshot, kind: str) -> list[ModelMessage]:
    history = list(snapshot.messages)
    if snapshot.seq is not None:
        remember_origin(
            history, kind, SnapshotRef(run_id=snapshot.run_id, seq=snapshot.seq, step_index=snapshot.step_index)
        )
    return history


def _without_conversation(message: ModelMessage) -> ModelMessage:
    if getattr(message, 'conversation_id', None) is None:
        return message
    return dataclasses.replace(message, conversation_id=None)  # pyright: ignore[reportCallIssue]
