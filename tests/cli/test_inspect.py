"""Reading a store for the inspector, over the protocol (here an InMemoryStepStore)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pydantic_ai_steps.cli import _inspect
from pydantic_ai_steps.cli._errors import CliError
from pydantic_ai_steps.step_persistence import InMemoryStepStore, RunRecord, SqliteStepStore, StepEvent

from .populate import populate

pytestmark = pytest.mark.anyio


def _event(kind: str) -> StepEvent:
    return StepEvent(run_id='r', kind=kind, step_index=0)  # type: ignore[arg-type]


def test_status_comes_from_the_last_event() -> None:
    assert _inspect.run_status([]) == 'unfinished'
    assert _inspect.run_status([_event('run_started'), _event('run_completed')]) == 'completed'
    assert _inspect.run_status([_event('run_started'), _event('run_failed')]) == 'failed'
    assert _inspect.run_status([_event('run_started'), _event('tool_call_started')]) == 'unfinished'


async def test_summaries_filter_and_keep_store_order() -> None:
    store = InMemoryStepStore()
    population = await populate(store)
    everything = await _inspect.list_summaries(store)
    ids = [summary.record.run_id for summary in everything]
    assert ids[0] == population.crashed  # started_at T0: the oldest
    statuses = {summary.record.run_id: summary.status for summary in everything}
    assert statuses == {
        population.orchestrator: 'completed',
        population.librarian: 'completed',
        population.failed: 'failed',
        population.crashed: 'unfinished',
        population.media: 'completed',
    }
    (failed,) = [summary for summary in everything if summary.status == 'failed']
    assert failed.error is not None and 'disk full' in failed.error
    (crashed,) = [summary for summary in everything if summary.status == 'unfinished']
    assert (crashed.steps, crashed.unresolved_effects) == (1, 1)

    librarians = await _inspect.list_summaries(store, parent_run_id=population.orchestrator)
    assert [summary.record.run_id for summary in librarians] == [population.librarian]
    assert [s.record.run_id for s in await _inspect.list_summaries(store, agent_name='flaky')] == [population.failed]
    assert await _inspect.list_summaries(store, conversation_id='conv-libr', agent_name='orchestrator') == []


async def test_tree_nests_delegates_and_survives_a_parent_cycle() -> None:
    store = InMemoryStepStore()
    population = await populate(store)
    roots = await _inspect.run_tree(store)
    (orchestrator,) = [root for root in roots if root.record.run_id == population.orchestrator]
    assert [child.record.run_id for child in orchestrator.children] == [population.librarian]
    assert population.librarian not in [root.record.run_id for root in roots]
    assert [root.record.run_id for root in await _inspect.run_tree(store, root_run_id=population.orchestrator)] == [
        population.orchestrator
    ]

    looped = InMemoryStepStore()
    await looped.register_run(RunRecord(run_id='a', parent_run_id='b'))
    await looped.register_run(RunRecord(run_id='b', parent_run_id='a'))
    assert sorted(root.record.run_id for root in await _inspect.run_tree(looped)) == ['a', 'b']


async def test_tool_effects_lists_the_whole_ledger_in_call_order() -> None:
    store = InMemoryStepStore()
    population = await populate(store)
    (effect,) = await _inspect.tool_effects(store, population.crashed, unresolved_only=True)
    assert (effect.tool_name, effect.idempotency_key) == ('deploy', 'deploy::service-a::v2')
    orchestrator = await _inspect.tool_effects(store, population.orchestrator, unresolved_only=False)
    assert [(e.tool_name, e.status) for e in orchestrator] == [('delegate', 'completed')]
    failed = await _inspect.tool_effects(store, population.failed, unresolved_only=False)
    assert [(e.tool_name, e.status) for e in failed] == [('explode', 'failed')]


async def test_require_run_names_the_store_and_the_listing_command(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 's.db')
    with pytest.raises(CliError, match=r"no run 'nope' in memory://x \(`pydantic-ai-steps runs --store memory://x`"):
        await _inspect.require_run(store, 'nope', 'memory://x')
    await store.register_run(RunRecord(run_id='orphan'))
    await store.append_event(StepEvent(run_id='orphan', kind='run_started', step_index=0))
    with sqlite3.connect(tmp_path / 's.db') as connection:
        connection.execute("DELETE FROM runs WHERE run_id = 'orphan'")  # a record lost to damage
    assert await _inspect.require_run(store, 'orphan', 'memory://x') is None  # events but no record: inspectable
    await store.aclose()


async def test_store_stats_counts_everything_and_reports_progress() -> None:
    store = InMemoryStepStore()
    population = await populate(store)
    seen: list[tuple[int, int]] = []
    stats = await _inspect.store_stats(
        store, bytes_on_disk=10, media_blobs=None, progress=lambda done, total: seen.append((done, total))
    )
    assert stats.runs == 5
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert stats.unresolved_effects == 1
    # The crashed run's mid-tool snapshot, and the failed run's (saved at its error, call unanswered):
    assert stats.interrupted_snapshots == 2
    events = sum([len(await store.list_events(run_id=run_id)) for run_id in vars(population).values()])
    assert stats.events == events
