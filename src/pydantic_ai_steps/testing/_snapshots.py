"""Conformance: snapshots are stored exactly as saved, kept apart per run, and retained as configured."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from ..store.protocol import StepStore
from ._strategies import message_strategy
from ._support import T0, StoreFactory, all_snapshots, dump, new_run, snapshot, tool_cycle

HISTORIES = st.lists(st.lists(st.deferred(lambda: message_strategy()), min_size=1, max_size=6), min_size=1, max_size=3)
"""The round-trip property's input: a history grown over one to three snapshots."""
ROUND_TRIP_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    # One test shared by every subclass (a store each): that is the point of the suite.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


class SnapshotConformance:
    """What `latest_snapshot` and `list_snapshots` give back after `save_snapshot`."""

    @pytest.mark.anyio
    async def test_latest_snapshot_prefers_complete(self, store: StepStore) -> None:
        run_id = await new_run(store)
        assert await store.latest_snapshot(run_id=run_id) is None
        settled = tool_cycle()
        await store.save_snapshot(snapshot(run_id, settled, conversation_id='conv', agent_name='a', timestamp=T0))
        frontier = [*settled, ModelResponse(parts=[ToolCallPart('lookup', {}, tool_call_id='c2')], timestamp=T0)]
        await store.save_snapshot(snapshot(run_id, frontier, step_index=2, state='interrupted'))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert (latest.run_id, latest.step_index, latest.state, latest.conversation_id) == (
            run_id,
            1,
            'complete',
            'conv',
        )
        assert (latest.agent_name, latest.timestamp) == ('a', T0)
        assert dump(latest.messages) == dump(settled)
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None and newest.state == 'interrupted'
        assert dump(newest.messages) == dump(frontier)

    @pytest.mark.anyio
    async def test_snapshots_are_immune_to_later_mutation(self, store: StepStore) -> None:
        """pydantic-ai stamps fields onto a request after the boundary that saved it."""
        run_id = await new_run(store)
        history = tool_cycle()
        await store.save_snapshot(snapshot(run_id, list(history)))
        before = dump(history)
        pending = history[-1]
        assert isinstance(pending, ModelRequest)
        pending.timestamp = T0 + timedelta(minutes=5)
        pending.instructions = 'be brief'
        pending.parts = [*pending.parts, UserPromptPart('and more', timestamp=T0)]
        history.append(ModelResponse(parts=[TextPart('done')], timestamp=T0))
        await store.save_snapshot(snapshot(run_id, list(history), step_index=2))
        first, second = await all_snapshots(store, run_id)
        assert dump(first.messages) == before
        assert dump(second.messages) == dump(history)

    @pytest.mark.anyio
    async def test_returned_messages_are_private_copies(self, store: StepStore) -> None:
        run_id = await new_run(store)
        history = tool_cycle()
        await store.save_snapshot(snapshot(run_id, history))
        loaded = await store.latest_snapshot(run_id=run_id)
        assert loaded is not None
        loaded.messages.clear()
        again = await store.latest_snapshot(run_id=run_id)
        assert again is not None and dump(again.messages) == dump(history)

    @pytest.mark.anyio
    async def test_rewritten_history_is_stored_as_rewritten(self, store: StepStore) -> None:
        """A history processor may replace or drop earlier messages (compaction)."""
        run_id = await new_run(store)
        history = tool_cycle() + tool_cycle('c2', 'again')
        await store.save_snapshot(snapshot(run_id, history))
        compacted = [ModelRequest(parts=[UserPromptPart('summary', timestamp=T0)], timestamp=T0), *history[4:]]
        await store.save_snapshot(snapshot(run_id, compacted, step_index=2))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(compacted)
        shorter = history[:3]
        await store.save_snapshot(snapshot(run_id, shorter, step_index=3))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(shorter)

    @pytest.mark.anyio
    async def test_snapshot_idempotency_key_applies_once_even_after_pruning(self, make_store: StoreFactory) -> None:
        store = make_store(max_snapshots_per_run=1)
        run_id = await new_run(store)
        await store.save_snapshot(snapshot(run_id, tool_cycle(), idempotency_key='0:1:complete'))
        await store.save_snapshot(snapshot(run_id, tool_cycle('c2'), step_index=2, idempotency_key='1:2:complete'))
        await store.save_snapshot(snapshot(run_id, tool_cycle('c3'), step_index=3, idempotency_key='0:1:complete'))
        await store.save_snapshot(snapshot(run_id, tool_cycle('c4'), step_index=4, idempotency_key='1:2:complete'))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and latest.step_index == 2

    @pytest.mark.anyio
    async def test_retention_keeps_newest_and_newest_complete(self, make_store: StoreFactory) -> None:
        store = make_store(max_snapshots_per_run=2)
        run_id = await new_run(store)
        states = ['complete', 'interrupted', 'interrupted', 'interrupted']
        for step, state in enumerate(states, start=1):
            await store.save_snapshot(snapshot(run_id, tool_cycle(f'c{step}'), step_index=step, state=state))
        kept = await all_snapshots(store, run_id, include_interrupted=True)
        assert [s.step_index for s in kept] == [1, 3, 4]
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and latest.step_index == 1

    def test_rejects_bad_retention_limit(self, make_store: StoreFactory) -> None:
        for bad in (0, -1, 'two', 1.5):
            with pytest.raises(ValueError, match='max_snapshots_per_run'):
                make_store(max_snapshots_per_run=bad)

    @pytest.mark.anyio
    async def test_runs_do_not_share_snapshots(self, store: StepStore) -> None:
        a, b = await new_run(store), await new_run(store)
        await store.save_snapshot(snapshot(a, tool_cycle('c1', 'for a')))
        await store.save_snapshot(snapshot(b, tool_cycle('c1', 'for b')))
        latest_a = await store.latest_snapshot(run_id=a)
        assert latest_a is not None and dump(latest_a.messages) == dump(tool_cycle('c1', 'for a'))

    @pytest.mark.anyio
    async def test_payloads_that_look_like_media_markers_round_trip(self, store: StepStore) -> None:
        """A user payload shaped like an externalized-media marker must come back unchanged."""
        run_id = await new_run(store)
        uri = 'media+sha256://' + '0' * 64
        lookalikes: list[object] = [
            {'__harness_external_media__': True, '__harness_external_uri__': uri, 'uri': uri, 'kind': 'binary'},
            {'__harness_external_literal__': {'x': 1}, '__harness_external_marker_format__': 'literal-v1'},
            {'__harness_external_escaped_keys__': {}, 'content': 'x' * 70_000, 'part_kind': 'text'},
        ]
        history = [
            ModelRequest(parts=[UserPromptPart('look', timestamp=T0)], timestamp=T0),
            ModelResponse(parts=[ToolCallPart('echo', {'payload': lookalikes}, tool_call_id='c1')], timestamp=T0),
            ModelRequest(parts=[ToolReturnPart('echo', lookalikes, tool_call_id='c1', timestamp=T0)], timestamp=T0),
        ]
        await store.save_snapshot(snapshot(run_id, history))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert dump(latest.messages) == dump(history)

    # --- property: any history round-trips exactly -------------------------------------------

    @ROUND_TRIP_SETTINGS
    @given(histories=HISTORIES)
    def test_arbitrary_histories_round_trip_exactly(
        self, make_store: StoreFactory, histories: list[list[ModelMessage]]
    ) -> None:
        store = make_store()

        async def check() -> None:
            run_id = await new_run(store, 'prop')
            grown: list[ModelMessage] = []
            expected: list[bytes] = []
            for step, batch in enumerate(histories, start=1):
                grown = [*grown, *batch]
                expected.append(dump(grown))
                await store.save_snapshot(snapshot(run_id, list(grown), step_index=step))
            saved = await all_snapshots(store, run_id)
            assert [dump(s.messages) for s in saved] == expected

        anyio.run(check)
