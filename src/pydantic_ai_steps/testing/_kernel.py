"""Conformance: what the store kernel promises beyond the published protocol.

Writers that race on one run, log entries that went missing, histories pydantic-ai re-stamps,
keys that outlive pruning, damaged counts, and the store's lifecycle.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import ClassVar

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from .._records import RunRecord, StepEvent
from ..store.backend import WriteBatch
from ..store.base import StepStoreBase
from ..store.codec import Encoding
from ..store.protocol import ManagedStepStore, RecordBatchStore, StepStore
from ._support import T0, StoreFactory, all_snapshots, dump, new_run, snapshot, tool_cycle


def kernel_store(store: StepStore) -> StepStoreBase:
    if not isinstance(store, StepStoreBase):
        pytest.skip('this store is not built on StepStoreBase')
    return store


def managed(store: StepStore) -> ManagedStepStore:
    if not isinstance(store, ManagedStepStore):
        pytest.skip('this store offers only the published StepStore protocol')
    return store


class KernelConformance:
    persistent: ClassVar[bool] = False

    @pytest.mark.anyio
    async def test_two_writers_of_one_run_stay_exact(self, make_store: StoreFactory) -> None:
        """A writer whose picture of the run's log is stale rewrites, never mixes histories."""
        if not self.persistent:
            pytest.skip('needs two store objects over the same storage')
        first, second = make_store(), make_store()
        run_id = await new_run(first)
        one = tool_cycle('c1', 'one')
        two = [*one, *tool_cycle('c2', 'two')]
        three = [*two, ModelResponse(parts=[TextPart('done')], timestamp=T0)]
        await first.save_snapshot(snapshot(run_id, list(one), step_index=1))
        await second.save_snapshot(snapshot(run_id, list(two), step_index=2))
        await first.save_snapshot(snapshot(run_id, list(three), step_index=3))  # its log is stale
        reader = make_store()
        saved = await all_snapshots(reader, run_id)
        assert [dump(item.messages) for item in saved] == [dump(one), dump(two), dump(three)]

    @pytest.mark.anyio
    async def test_a_snapshot_whose_log_entries_are_missing_is_skipped(
        self, store: StepStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        kernel = kernel_store(store)
        run_id = await new_run(kernel)
        first = tool_cycle('c1', 'first')
        await kernel.save_snapshot(snapshot(run_id, list(first), step_index=1))
        second = [*first, *tool_cycle('c2', 'second')]
        await kernel.save_snapshot(snapshot(run_id, list(second), step_index=2))
        log = await kernel.backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
        newest = max(entry.index for entry in log.entries)
        await kernel.backend.delete_log_entries(run_id, [newest - 1])  # one of the second snapshot's own
        with caplog.at_level(logging.WARNING, logger='pydantic_ai_steps'):
            latest = await kernel.latest_snapshot(run_id=run_id)
        assert latest is not None and dump(latest.messages) == dump(first)
        assert 'skipping unreadable snapshot' in caplog.text

    @pytest.mark.anyio
    async def test_a_damaged_message_count_is_skipped_without_allocating(self, store: StepStore) -> None:
        """A count of 10**12 in a stored snapshot is damage, not a reason to run out of memory."""
        kernel = kernel_store(store)
        run_id = await new_run(kernel)
        await kernel.save_snapshot(snapshot(run_id, tool_cycle(), step_index=1))
        encoding: Encoding = kernel.backend.encoding
        damaged = snapshot(run_id, tool_cycle(), step_index=2)
        write = kernel._snapshot_write(await kernel._log.prepare(damaged))  # pyright: ignore[reportPrivateUsage]
        write.row = encoding.snapshot(damaged, 10**12, None)
        write.expected_log_size = None
        await kernel.backend.commit(WriteBatch(snapshot=write, run_ids=frozenset({run_id})))
        latest = await kernel.latest_snapshot(run_id=run_id)
        assert latest is not None and latest.step_index == 1
        assert [item.step_index for item in await kernel.list_snapshots(run_id=run_id)] == [1]

    @pytest.mark.anyio
    async def test_a_restamped_history_round_trips_after_reopening(self, make_store: StoreFactory) -> None:
        """pydantic-ai stamps a request after the boundary that saved it; the stamped version is a patch."""
        if not self.persistent:
            pytest.skip('needs two store objects over the same storage')
        writer = make_store()
        run_id = await new_run(writer)
        history = tool_cycle()
        before = dump(history)
        await writer.save_snapshot(snapshot(run_id, list(history), step_index=1))
        pending = history[-1]
        assert isinstance(pending, ModelRequest)
        pending.timestamp = T0 + timedelta(minutes=5)
        pending.instructions = 'answer in one line ' * 8
        pending.run_id = 'pydantic-ai-run'
        history.append(ModelResponse(parts=[TextPart('done')], timestamp=T0))
        await writer.save_snapshot(snapshot(run_id, list(history), step_index=2))
        reopened = make_store()
        saved = await all_snapshots(reopened, run_id)
        assert [dump(item.messages) for item in saved] == [before, dump(history)]

    @pytest.mark.anyio
    async def test_keyed_records_apply_once_after_pruning(self, make_store: StoreFactory) -> None:
        store = make_store(max_snapshots_per_run=1)
        if not isinstance(store, RecordBatchStore):
            pytest.skip('this store does not offer write_records')
        run_id = await new_run(store)

        def event(index: int) -> StepEvent:
            return StepEvent(run_id=run_id, kind='tool_call_completed', step_index=index, idempotency_key=f'e{index}')

        for step in range(1, 4):
            await store.write_records(
                snapshot=snapshot(run_id, tool_cycle(f'c{step}'), step_index=step, idempotency_key=f's{step}'),
                events=[event(step)],
            )
        # Replays of every batch, the pruned snapshots' included, change nothing.
        for step in range(1, 4):
            await store.write_records(
                snapshot=snapshot(run_id, tool_cycle(f'x{step}'), step_index=9, idempotency_key=f's{step}'),
                events=[event(step)],
            )
        assert [item.step_index for item in await store.list_events(run_id=run_id)] == [1, 2, 3]
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and latest.step_index == 3

    @pytest.mark.anyio
    async def test_a_store_is_an_async_context_manager_closed_twice_safely(self, make_store: StoreFactory) -> None:
        store = managed(make_store())
        async with store as entered:
            assert entered is store
            run_id = await new_run(store)
            await store.save_snapshot(snapshot(run_id, tool_cycle()))
        await store.aclose()
        await store.aclose()
        if self.persistent:
            again = managed(make_store())
            async with again:
                assert await again.get_run(run_id=run_id) is not None

    @pytest.mark.anyio
    async def test_a_message_log_text_comes_back_byte_for_byte(self, store: StepStore) -> None:
        """Texts are stored verbatim: a backend that re-encodes them breaks patched versions."""
        kernel = kernel_store(store)
        run_id = await new_run(kernel)
        request = ModelRequest(parts=[UserPromptPart('é "quoted" \\ back\u2028slash', timestamp=T0)], timestamp=T0)
        await kernel.save_snapshot(snapshot(run_id, [request]))
        log = await kernel.backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
        texts = [entry.text for entry in log.entries]
        from ..store.history import message_to_json

        assert texts == [message_to_json(request)]

    @pytest.mark.anyio
    async def test_run_record_fields_round_trip(self, store: StepStore) -> None:
        from .._records import SnapshotRef

        record = RunRecord(
            run_id='fields-' + str(id(store)),
            conversation_id='conv',
            agent_name='a',
            metadata={'k': 'v'},
            started_at=T0,
            registration_id='reg',
            pydantic_ai_run_id='01J-pydantic-ai',
            run_metadata={'attempt': 3, 'tags': ['x', 'y'], 'nested': {'ok': True}, 'none': None},
            parent_tool_call_id='call-7',
            continued_from=SnapshotRef(run_id='earlier', seq=4, step_index=2),
            forked_from=None,
        )
        await store.register_run(record)
        stored = await store.get_run(run_id=record.run_id)
        assert stored == record
        assert stored is not None and stored.status == 'unfinished' and stored.ended_at is None

    @pytest.mark.anyio
    async def test_a_store_without_damage_reports_no_unreadable_runs(self, store: StepStore) -> None:
        managed_store = managed(store)
        await new_run(managed_store)
        assert await managed_store.list_unreadable_runs() == []
