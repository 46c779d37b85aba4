"""Conformance: finding runs (`list_runs` filters and order), the whole ledger and its resolutions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from .._errors import EffectAlreadyResolvedError, InvalidRecordError
from .._records import RunQuery, StepEvent, ToolEffectRecord
from ..store.protocol import StepStore
from ..store.record_checks import MAX_COUNT
from ._kernel import managed
from ._support import T0, StoreFactory, new_run, new_run_id


def _effect(run_id: str, call: str, status: Any) -> ToolEffectRecord:
    ended = T0 + timedelta(seconds=1) if status != 'started' else None
    return ToolEffectRecord(
        tool_call_id=call, tool_name='post', run_id=run_id, status=status, started_at=T0, ended_at=ended
    )


async def _closed(store: StepStore, run_id: str, kind: str, at: int) -> None:
    await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=1, timestamp=T0 + timedelta(hours=at)))  # pyright: ignore[reportArgumentType]


class QueryConformance:
    @pytest.mark.anyio
    async def test_list_runs_filters_orders_and_limits(self, store: StepStore) -> None:
        runs = managed(store)
        agent = new_run_id('agent')
        ids = [
            await new_run(runs, agent_name=agent, started_at=T0 + timedelta(minutes=minute), metadata={'tier': tier})
            for minute, tier in ((0, 'free'), (1, 'paid'), (2, 'paid'), (3, 'free'))
        ]
        await _closed(runs, ids[0], 'run_completed', 1)
        await _closed(runs, ids[1], 'run_failed', 2)
        assert [r.run_id for r in await runs.list_runs(agent_name=agent)] == ids
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, newest_first=True, limit=2)] == ids[:1:-1]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, limit=0)] == []
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, status='completed')] == [ids[0]]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, status='failed')] == [ids[1]]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, status='unfinished')] == ids[2:]
        after = T0 + timedelta(minutes=1)
        before = T0 + timedelta(minutes=3)
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, started_after=after)] == ids[1:]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, started_before=before)] == ids[:3]
        paid = await runs.list_runs(agent_name=agent, metadata={'tier': 'paid'}, newest_first=True, limit=1)
        assert [r.run_id for r in paid] == [ids[2]]
        completed = await runs.get_run(run_id=ids[0])
        assert completed is not None and completed.status == 'completed'
        assert completed.ended_at == T0 + timedelta(hours=1)

    @pytest.mark.anyio
    async def test_runs_that_started_at_the_same_time_come_in_registration_order(self, store: StepStore) -> None:
        """Newest first is exactly the reverse of oldest first, so a limit keeps the same runs in every
        store, whatever the ids spell (the first registered sorts last by name here)."""
        runs = managed(store)
        agent = new_run_id('tie')
        ids = [
            await new_run(runs, prefix, agent_name=agent, started_at=T0 + timedelta(minutes=1))
            for prefix in ('zz-first', 'mm-second', 'aa-third')
        ]
        earlier = await new_run(runs, 'yy-earlier', agent_name=agent, started_at=T0)
        assert [r.run_id for r in await runs.list_runs(agent_name=agent)] == [earlier, *ids]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, newest_first=True)] == [*ids[::-1], earlier]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, limit=2)] == [earlier, ids[0]]
        assert [r.run_id for r in await runs.list_runs(agent_name=agent, newest_first=True, limit=2)] == ids[:0:-1]
        assert [r.run_id for r in await runs.list_runs(newest_first=True, limit=1)] == [ids[2]]

    @pytest.mark.anyio
    async def test_a_limit_above_what_a_store_can_count_means_every_run(self, store: StepStore) -> None:
        """A `limit` above `MAX_COUNT` (2**63 - 1, the 64-bit stores' most) returns every matching run,
        as no limit does, in every store; one up to it is an ordinary limit."""
        runs = managed(store)
        agent = new_run_id('huge-limit')
        ids = [await new_run(runs, agent_name=agent, started_at=T0 + timedelta(minutes=minute)) for minute in range(3)]
        for limit in (MAX_COUNT, MAX_COUNT + 1, 2**64, 10**30):
            assert [r.run_id for r in await runs.list_runs(agent_name=agent, limit=limit)] == ids, limit
            newest = await runs.list_runs(agent_name=agent, newest_first=True, limit=limit)
            assert [r.run_id for r in newest] == ids[::-1], limit
            queried = await runs.query_runs(RunQuery(agent_name=agent, newest_first=True, limit=limit))
            assert [r.run_id for r in queried] == ids[::-1], limit
        with pytest.raises(ValueError, match='limit must be an int >= 0'):
            await runs.list_runs(limit=-(2**64))

    @pytest.mark.anyio
    async def test_list_runs_by_run_metadata_and_pydantic_ai_run_id(self, store: StepStore) -> None:
        runs = managed(store)
        tenant = new_run_id('tenant')
        first = await new_run(runs, pydantic_ai_run_id=tenant + '-pai-1', run_metadata={'tenant': tenant, 'n': 1})
        second = await new_run(runs, run_metadata={'tenant': tenant, 'n': 2, 'vip': True})
        await new_run(runs, run_metadata={'tenant': 'other', 'n': 1})
        assert [r.run_id for r in await runs.list_runs(run_metadata={'tenant': tenant})] == [first, second]
        assert [r.run_id for r in await runs.list_runs(run_metadata={'tenant': tenant, 'n': 2})] == [second]
        assert [r.run_id for r in await runs.list_runs(run_metadata={'tenant': tenant, 'vip': True})] == [second]
        assert [r.run_id for r in await runs.list_runs(run_metadata={'tenant': tenant, 'n': 1.0})] == [first]
        assert [r.run_id for r in await runs.list_runs(pydantic_ai_run_id=tenant + '-pai-1')] == [first]
        with pytest.raises(ValueError, match='run_metadata'):
            await runs.list_runs(run_metadata={'tenant': ['a', 'list']})  # pyright: ignore[reportArgumentType]
        with pytest.raises(ValueError, match='status'):
            await runs.list_runs(status='running')  # pyright: ignore[reportArgumentType]

    @pytest.mark.anyio
    async def test_the_whole_ledger_and_resolutions(self, make_store: StoreFactory) -> None:
        store = managed(make_store())
        run_id = await new_run(store)
        for call in ('c1', 'c2', 'c3'):
            await store.record_tool_effect(
                ToolEffectRecord(tool_call_id=call, tool_name='post', run_id=run_id, status='started', started_at=T0)
            )
        await store.record_tool_effect(
            ToolEffectRecord(tool_call_id='c2', tool_name='post', run_id=run_id, status='completed', started_at=T0)
        )
        assert [(r.tool_call_id, r.status) for r in await store.list_tool_effects(run_id=run_id)] == [
            ('c1', 'started'),
            ('c2', 'completed'),
            ('c3', 'started'),
        ]
        resolved = await store.resolve_tool_effect(
            run_id=run_id, tool_call_id='c1', outcome='done', by='ops@example.com', note='comment found'
        )
        assert (resolved.status, resolved.resolution, resolved.resolved_by) == ('started', 'done', 'ops@example.com')
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c3']
        with pytest.raises(ValueError, match='completed'):
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='c2', outcome='done')
        with pytest.raises(LookupError, match='nope'):
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='nope', outcome='not_done')
        with pytest.raises(ValueError, match='outcome'):
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='c3', outcome='maybe')  # pyright: ignore[reportArgumentType]
        with pytest.raises(ValueError, match=r'\(100000 characters\)$'):  # quoted by its start, end and length
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='c3', outcome='x' * 100_000)  # pyright: ignore[reportArgumentType]
        for by, note in (('ops\ud800', None), (None, 'seen \udcff')):  # what `surrogateescape` decoding leaves
            with pytest.raises(InvalidRecordError, match=r'(by|note) is not valid Unicode text: a lone surrogate'):
                await store.resolve_tool_effect(run_id=run_id, tool_call_id='c3', outcome='done', by=by, note=note)
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c3']
        again = managed(make_store()) if getattr(self, 'persistent', False) else store
        kept = await again.get_tool_effect(run_id=run_id, tool_call_id='c1')
        assert kept is not None and (kept.resolution, kept.resolution_note) == ('done', 'comment found')
        assert kept.resolved_at is not None

    @pytest.mark.anyio
    async def test_a_resolution_stands_until_replaced_on_purpose(self, make_store: StoreFactory) -> None:
        store = managed(make_store())
        run_id = await new_run(store)
        await store.record_tool_effect(_effect(run_id, 'c1', 'started'))
        await store.resolve_tool_effect(
            run_id=run_id, tool_call_id='c1', outcome='not_done', by='orchestrator', note='no comment found'
        )
        with pytest.raises(EffectAlreadyResolvedError) as refused:
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='c1', outcome='done', by='root')
        message = str(refused.value)
        assert all(part in message for part in (repr(run_id), "'c1'", 'not_done', "'orchestrator'", 'replace=True'))
        assert (refused.value.resolution, refused.value.resolved_by) == ('not_done', 'orchestrator')
        kept = await store.get_tool_effect(run_id=run_id, tool_call_id='c1')
        assert kept is not None
        assert (kept.resolution, kept.resolved_by, kept.resolution_note) == (
            'not_done',
            'orchestrator',
            'no comment found',
        )
        replaced = await store.resolve_tool_effect(
            run_id=run_id, tool_call_id='c1', outcome='done', by='root', replace=True
        )
        assert (replaced.status, replaced.resolution, replaced.resolved_by) == ('started', 'done', 'root')
        again = managed(make_store()) if getattr(self, 'persistent', False) else store
        stored = await again.get_tool_effect(run_id=run_id, tool_call_id='c1')
        assert stored is not None
        assert (stored.resolution, stored.resolved_by, stored.resolution_note) == ('done', 'root', None)
        # The call's own end, written late (the run was not dead after all): its status, and the check kept.
        await store.record_tool_effect(_effect(run_id, 'c1', 'completed'))
        late = await again.get_tool_effect(run_id=run_id, tool_call_id='c1')
        assert late is not None and (late.status, late.resolution, late.resolved_by) == ('completed', 'done', 'root')
        with pytest.raises(ValueError, match='completed'):
            await store.resolve_tool_effect(run_id=run_id, tool_call_id='c1', outcome='done', replace=True)

    @pytest.mark.anyio
    async def test_a_write_landing_between_the_read_and_the_resolve_is_kept(
        self, store: StepStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The resolution is written only while the entry is as it was read, never as a whole entry:
        a late end keeps its status, and of two resolutions the second is refused."""
        runs = managed(store)
        run_id = await new_run(runs)
        for call in ('late', 'twice'):
            await runs.record_tool_effect(_effect(run_id, call, 'started'))
        read = runs.get_tool_effect
        racing: list[Callable[[], Awaitable[object]]] = []

        async def read_then_race(*, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
            found = await read(run_id=run_id, tool_call_id=tool_call_id)
            while racing:
                await racing.pop()()
            return found

        monkeypatch.setattr(runs, 'get_tool_effect', read_then_race)
        racing.append(lambda: runs.record_tool_effect(_effect(run_id, 'late', 'completed')))
        with pytest.raises(ValueError, match="ended 'completed'"):
            await runs.resolve_tool_effect(run_id=run_id, tool_call_id='late', outcome='not_done', by='ops')
        late = await read(run_id=run_id, tool_call_id='late')
        assert late is not None and (late.status, late.resolution) == ('completed', None)
        racing.append(
            lambda: runs.resolve_tool_effect(run_id=run_id, tool_call_id='twice', outcome='not_done', by='first')
        )
        with pytest.raises(EffectAlreadyResolvedError, match="'first'"):
            await runs.resolve_tool_effect(run_id=run_id, tool_call_id='twice', outcome='done', by='second')
        twice = await read(run_id=run_id, tool_call_id='twice')
        assert twice is not None and (twice.status, twice.resolution, twice.resolved_by) == (
            'started',
            'not_done',
            'first',
        )
