"""The `StepStore` contract as reusable tests.

Subclass `StepStoreConformance` in your test suite and provide a `make_store` fixture: a
callable that takes store options (`max_snapshots_per_run=`) and returns a store. Two calls in
one test must return stores over the *same* storage when your store persists (set
`persistent = True`), so the suite can check that a reopened store sees what was written::

    import pytest
    from pydantic_ai_steps.testing.step_store import StepStoreConformance


    class TestMyStore(StepStoreConformance):
        persistent = True

        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda **options: MyStore(tmp_path / 'db', **options)

Tests are async (`@pytest.mark.anyio`); the suite declares the `anyio_backend` it runs on. The
published protocol's behaviours are checked for every store; what a store built on
`StepStoreBase` offers beyond it (queries, the whole ledger, deletion, pruning, garbage
collection, the stale path) is checked for stores that offer it (`ManagedStepStore`), and
skipped with the reason for the others. What the recovery helpers read back (a run's record from
its result, the lineage of continues and forks, the continuable point a failed run leaves) is
checked through agent runs on a scripted model.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from .._errors import RunAlreadyExistsError, RunNotFoundError
from .._records import RunRecord, StepEvent, ToolEffectRecord
from ..store.protocol import RecordBatchStore, StepStore
from ._deltas import DeltaConformance
from ._input import InputConformance
from ._kernel import KernelConformance
from ._queries import QueryConformance
from ._recovery import RecoveryConformance
from ._retention import RetentionConformance
from ._snapshots import SnapshotConformance
from ._support import T0, StoreFactory, all_snapshots, dump, new_run, new_run_id, snapshot, tool_cycle

__all__ = ['StepStoreConformance', 'StoreFactory']


class StepStoreConformance(
    SnapshotConformance,
    KernelConformance,
    QueryConformance,
    InputConformance,
    RecoveryConformance,
    RetentionConformance,
    DeltaConformance,
):
    """Every behaviour the capability and the helpers rely on, for any `StepStore`."""

    persistent: ClassVar[bool] = False
    """Set in a subclass whose `make_store` returns stores over shared, durable storage."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return 'asyncio'

    @pytest.fixture
    def make_store(self) -> StoreFactory:  # pragma: no cover - subclasses provide it
        raise NotImplementedError('provide a make_store fixture returning a StepStore factory')

    @pytest.fixture
    def store(self, make_store: StoreFactory) -> StepStore:
        return make_store()

    # --- runs -------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_is_a_step_store(self, store: StepStore) -> None:
        assert isinstance(store, StepStore)

    @pytest.mark.anyio
    async def test_register_and_get_run(self, store: StepStore) -> None:
        record = RunRecord(
            run_id=new_run_id(),
            conversation_id='conv',
            parent_run_id='parent',
            agent_name='librarian',
            metadata={'team': 'docs', 'ünï': 'çødé'},
            started_at=T0,
            registration_id='reg-1',
        )
        await store.register_run(record)
        assert await store.get_run(run_id=record.run_id) == record
        assert await store.get_run(run_id=new_run_id('unknown')) is None

    @pytest.mark.anyio
    async def test_duplicate_registration_raises_and_keeps_original(self, store: StepStore) -> None:
        run_id = new_run_id()
        original = RunRecord(run_id=run_id, agent_name='first', started_at=T0, registration_id='a')
        await store.register_run(original)
        with pytest.raises(RunAlreadyExistsError, match=run_id):
            await store.register_run(RunRecord(run_id=run_id, agent_name='second', registration_id='b'))
        with pytest.raises(ValueError, match='already in the store'):
            await store.register_run(RunRecord(run_id=run_id))
        assert await store.get_run(run_id=run_id) == original

    @pytest.mark.anyio
    async def test_list_runs_filters_and_sorts_by_start(self, store: StepStore) -> None:
        conv, parent = new_run_id('conv'), new_run_id('parent')
        late = RunRecord(run_id=new_run_id(), conversation_id=conv, started_at=T0 + timedelta(seconds=2))
        early = RunRecord(run_id=new_run_id(), conversation_id=conv, parent_run_id=parent, started_at=T0)
        other = RunRecord(run_id=new_run_id(), parent_run_id=parent, started_at=T0 + timedelta(seconds=1))
        for record in (late, early, other):
            await store.register_run(record)
        assert [r.run_id for r in await store.list_runs(conversation_id=conv)] == [early.run_id, late.run_id]
        assert [r.run_id for r in await store.list_runs(parent_run_id=parent)] == [early.run_id, other.run_id]
        both = await store.list_runs(conversation_id=conv, parent_run_id=parent)
        assert [r.run_id for r in both] == [early.run_id]
        everything = [r.run_id for r in await store.list_runs()]
        assert everything.index(early.run_id) < everything.index(other.run_id) < everything.index(late.run_id)
        assert await store.list_runs(conversation_id=new_run_id('nobody')) == []

    # --- events -----------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_events_keep_append_order_and_fields(self, store: StepStore) -> None:
        run_id = await new_run(store)
        events = [
            StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0, metadata={'k': 'v'}),
            StepEvent(
                run_id=run_id,
                kind='tool_call_failed',
                step_index=1,
                timestamp=T0,
                conversation_id='conv',
                parent_run_id='p',
                agent_name='a',
                tool_call_id='c1',
                tool_name='t',
                error="RuntimeError('boom')",
                idempotency_key='1:1:tool_call_failed:c1',
            ),
            StepEvent(run_id=run_id, kind='run_failed', step_index=1, timestamp=T0 + timedelta(seconds=1)),
        ]
        for event in events:
            await store.append_event(event)
        assert await store.list_events(run_id=run_id) == events
        assert await store.list_events(run_id=new_run_id('unknown')) == []

    @pytest.mark.anyio
    async def test_event_idempotency_key_applies_once_per_run(self, store: StepStore) -> None:
        run_id, other = await new_run(store), await new_run(store)
        first = StepEvent(run_id=run_id, kind='run_started', step_index=0, idempotency_key='0:0:run_started:')
        await store.append_event(first)
        await store.append_event(copy.copy(first))
        await store.append_event(
            StepEvent(run_id=other, kind='run_started', step_index=0, idempotency_key='0:0:run_started:')
        )
        await store.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=0))
        await store.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=0))
        assert [e.kind for e in await store.list_events(run_id=run_id)] == [
            'run_started',
            'run_completed',
            'run_completed',
        ]
        assert len(await store.list_events(run_id=other)) == 1

    # --- tool effects -----------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_tool_effects_upsert_and_unresolved(self, store: StepStore) -> None:
        run_id = await new_run(store)
        started = ToolEffectRecord(tool_call_id='c1', tool_name='write', run_id=run_id, status='started', started_at=T0)
        other = ToolEffectRecord(tool_call_id='c2', tool_name='read', run_id=run_id, status='started', started_at=T0)
        await store.record_tool_effect(started)
        await store.record_tool_effect(other)
        assert {r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)} == {'c1', 'c2'}
        done = ToolEffectRecord(
            tool_call_id='c1',
            tool_name='write',
            run_id=run_id,
            status='completed',
            started_at=T0,
            ended_at=T0 + timedelta(seconds=1),
            idempotency_key='issue-1::label',
            effect_summary='set label',
        )
        await store.record_tool_effect(done)
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='c1') == done
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c2']
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='missing') is None
        assert await store.list_unresolved_tool_effects(run_id=new_run_id('unknown')) == []

    @pytest.mark.anyio
    async def test_records_of_an_unregistered_run_are_refused(self, store: StepStore) -> None:
        """Records exist only with their run's record, so a deleted run never reads half."""
        run_id = new_run_id('unregistered')
        with pytest.raises(RunNotFoundError, match=run_id):
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0))
        with pytest.raises(RunNotFoundError):
            await store.save_snapshot(snapshot(run_id, tool_cycle()))
        with pytest.raises(RunNotFoundError):
            await store.record_tool_effect(
                ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id=run_id, status='started')
            )
        assert await store.get_run(run_id=run_id) is None
        assert await store.list_events(run_id=run_id) == []
        assert await store.latest_snapshot(run_id=run_id) is None

    # --- several records at once (optional) ----------------------------------------------------

    @pytest.mark.anyio
    async def test_write_records_equals_the_single_calls(self, store: StepStore) -> None:
        """`write_records` (if the store offers it) stores what the single calls would, keys included."""
        if not isinstance(store, RecordBatchStore):
            pytest.skip('this store does not offer write_records')
        run_id = new_run_id()

        def event(index: int, kind: Any) -> StepEvent:
            key = f'{index}:{kind}'
            return StepEvent(run_id=run_id, kind=kind, step_index=index, timestamp=T0, idempotency_key=key)

        await store.write_records(run=RunRecord(run_id=run_id, started_at=T0), events=[event(0, 'run_started')])
        # A clashing registration writes nothing at all.
        with pytest.raises(RunAlreadyExistsError):
            await store.write_records(
                run=RunRecord(run_id=run_id, started_at=T0 + timedelta(days=1)), events=[event(9, 'run_started')]
            )
        record = await store.get_run(run_id=run_id)
        assert record is not None and record.started_at == T0
        started = ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id=run_id, status='started', started_at=T0)
        await store.write_records(
            tool_effects=[started], events=[event(0, 'model_request_started'), event(1, 'tool_call_started')]
        )
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c1']
        done = ToolEffectRecord(
            tool_call_id='c1', tool_name='t', run_id=run_id, status='completed', started_at=T0, ended_at=T0
        )
        await store.write_records(
            snapshot=snapshot(run_id, tool_cycle(), idempotency_key='s1'),
            tool_effects=[done],
            events=[event(1, 'tool_call_started'), event(2, 'tool_call_completed'), event(2, 'tool_call_completed')],
        )
        # A replayed batch: every key is applied once, the upsert is idempotent.
        await store.write_records(
            snapshot=snapshot(run_id, tool_cycle(), idempotency_key='s1'),
            tool_effects=[done],
            events=[event(2, 'tool_call_completed')],
        )
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='c1') == done
        assert [(e.step_index, e.kind) for e in await store.list_events(run_id=run_id)] == [
            (0, 'run_started'),
            (0, 'model_request_started'),
            (1, 'tool_call_started'),
            (2, 'tool_call_completed'),
        ]
        snapshots = await all_snapshots(store, run_id)
        assert len(snapshots) == 1 and dump(snapshots[0].messages) == dump(tool_cycle())
        await store.write_records()  # nothing to write is fine

    # --- durability -------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_reopened_store_sees_everything(self, make_store: StoreFactory) -> None:
        if not self.persistent:
            await self._separate_stores_share_nothing(make_store)
            return
        first = make_store()
        run_id = new_run_id()
        await first.register_run(RunRecord(run_id=run_id, conversation_id='conv', started_at=T0))
        await first.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0))
        await first.save_snapshot(snapshot(run_id, tool_cycle()))
        await first.record_tool_effect(
            ToolEffectRecord(tool_call_id='c9', tool_name='t', run_id=run_id, status='started', started_at=T0)
        )
        second = make_store()
        assert (await second.get_run(run_id=run_id)) == (await first.get_run(run_id=run_id))
        assert len(await second.list_events(run_id=run_id)) == 1
        latest = await second.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(tool_cycle())
        assert [r.tool_call_id for r in await second.list_unresolved_tool_effects(run_id=run_id)] == ['c9']
        with pytest.raises(RunAlreadyExistsError):
            await second.register_run(RunRecord(run_id=run_id))
        # The second store continues the run's snapshots without knowing what the first wrote.
        await second.save_snapshot(snapshot(run_id, [*tool_cycle(), *tool_cycle('c2')], step_index=2))
        latest = await first.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump([*tool_cycle(), *tool_cycle('c2')])

    @pytest.mark.anyio
    async def test_a_store_that_read_empty_storage_sees_what_another_writes_later(
        self, make_store: StoreFactory
    ) -> None:
        """A maintenance process may start before any worker has written: what it read of an empty
        storage (no tables yet) must not stay its view, or it would see no runs, and collect their
        media as unreferenced, for good."""
        if not self.persistent:
            pytest.skip('needs two stores over the same storage (persistent = True)')
        reader = make_store()
        run_id = new_run_id()
        assert await reader.get_run(run_id=run_id) is None
        assert await reader.list_runs(conversation_id=run_id) == []
        writer = make_store()
        await writer.register_run(RunRecord(run_id=run_id, conversation_id=run_id, started_at=T0))
        await writer.save_snapshot(snapshot(run_id, tool_cycle()))
        assert [run.run_id for run in await reader.list_runs(conversation_id=run_id)] == [run_id]
        latest = await reader.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(tool_cycle())

    async def _separate_stores_share_nothing(self, make_store: StoreFactory) -> None:
        """A store that does not persist keeps its records to itself."""
        first, second = make_store(), make_store()
        run_id = new_run_id()
        await first.register_run(RunRecord(run_id=run_id, started_at=T0))
        await first.save_snapshot(snapshot(run_id, tool_cycle()))
        assert await second.get_run(run_id=run_id) is None
        assert await second.latest_snapshot(run_id=run_id) is None
        await second.register_run(RunRecord(run_id=run_id, started_at=T0))
