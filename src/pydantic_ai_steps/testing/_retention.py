"""Conformance: deleting runs and conversations, pruning by age, and collecting unreferenced media."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel
import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, ToolCallPart, UserPromptPart

from .._errors import RunNotFoundError
from .._records import StepEvent, ToolEffectRecord, utc_now
from ..store.backend import LogSlice
from ..store.maintenance import EARLIEST, CollectableMediaStore
from ..store.protocol import ManagedStepStore, StepStore
from ..store.record_checks import MAX_COUNT
from ._kernel import kernel_store, managed
from ._support import T0, StoreFactory, dump, new_run, new_run_id, snapshot, tool_cycle


async def _full_run(store: StepStore, **fields: object) -> str:
    run_id = await new_run(store, **fields)  # pyright: ignore[reportArgumentType]
    await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0))
    await store.save_snapshot(snapshot(run_id, tool_cycle()))
    await store.record_tool_effect(
        ToolEffectRecord(tool_call_id='c1', tool_name='t', run_id=run_id, status='started', started_at=T0)
    )
    return run_id


async def _gone(store: ManagedStepStore, run_id: str) -> bool:
    return (
        await store.get_run(run_id=run_id) is None
        and await store.list_events(run_id=run_id) == []
        and await store.latest_snapshot(run_id=run_id, include_interrupted=True) is None
        and await store.list_tool_effects(run_id=run_id) == []
    )


def _image(seed: int) -> BinaryContent:
    return BinaryContent(bytes([seed]) * (70 * 1024), media_type='image/png')


def _rewritten(summary: str, call_id: str) -> list[ModelMessage]:
    """A history whose earlier turns were replaced by a summary, ending on an unanswered call."""
    return [
        ModelRequest(parts=[UserPromptPart(summary, timestamp=T0)], timestamp=T0),
        ModelResponse(parts=[ToolCallPart('lookup', {'q': summary}, tool_call_id=call_id)], timestamp=T0),
    ]


class RetentionConformance:
    @pytest.mark.anyio
    async def test_delete_run_removes_everything_of_that_run_only(self, store: StepStore) -> None:
        runs = managed(store)
        parent = await _full_run(runs)
        child = await _full_run(runs, parent_run_id=parent)
        other = await _full_run(runs)
        assert await runs.delete_run(parent) == [parent]
        assert await _gone(runs, parent)
        assert await runs.get_run(run_id=child) is not None and await runs.get_run(run_id=other) is not None
        assert await runs.delete_run(parent) == []
        grandchild = await _full_run(runs, parent_run_id=child)
        assert set(await runs.delete_run(child, include_delegates=True)) == {child, grandchild}
        assert await _gone(runs, grandchild)
        latest = await runs.latest_snapshot(run_id=other)
        assert latest is not None and len(latest.messages) == 3

    @pytest.mark.anyio
    async def test_delete_conversation(self, store: StepStore) -> None:
        runs = managed(store)
        conversation = new_run_id('conv')
        turns = [await _full_run(runs, conversation_id=conversation) for _ in range(3)]
        delegate = await _full_run(runs, parent_run_id=turns[1], conversation_id=new_run_id('conv'))
        assert set(await runs.delete_conversation(conversation)) == set(turns)
        assert await runs.list_runs(conversation_id=conversation) == []
        assert await runs.get_run(run_id=delegate) is not None
        again = [await _full_run(runs, conversation_id=conversation) for _ in range(2)]
        child = await _full_run(runs, parent_run_id=again[0])
        assert set(await runs.delete_conversation(conversation, include_delegates=True)) == {*again, child}

    @pytest.mark.anyio
    async def test_prune_by_age_status_and_keep_last(self, make_store: StoreFactory) -> None:
        runs = managed(make_store())
        agent = new_run_id('agent')
        old = utc_now() - timedelta(days=40)
        done = await new_run(runs, agent_name=agent, started_at=old)
        await runs.append_event(StepEvent(run_id=done, kind='run_completed', step_index=1, timestamp=old))
        failed = await new_run(runs, agent_name=agent, started_at=old)
        await runs.append_event(StepEvent(run_id=failed, kind='run_failed', step_index=1, timestamp=old))
        stale = await new_run(runs, agent_name=agent, started_at=old)  # crashed: no closing event
        await runs.append_event(StepEvent(run_id=stale, kind='run_started', step_index=0, timestamp=old))
        alive = await new_run(runs, agent_name=agent, started_at=old)  # started long ago, still writing
        await runs.append_event(StepEvent(run_id=alive, kind='model_request_started', step_index=9))
        recent = await new_run(runs, agent_name=agent)
        await runs.append_event(StepEvent(run_id=recent, kind='run_completed', step_index=1))
        planned = await runs.prune(older_than=timedelta(days=30), dry_run=True)
        assert planned.dry_run and set(planned.run_ids) >= {done, failed, stale}
        assert not {alive, recent} & set(planned.run_ids)
        assert await runs.get_run(run_id=done) is not None  # a dry run removes nothing
        only_failed = await runs.prune(older_than=timedelta(days=30), status='failed')
        assert failed in only_failed.run_ids and done not in only_failed.run_ids
        pruned = await runs.prune(older_than=timedelta(days=30))
        assert {done, stale} <= set(pruned.run_ids)
        for run_id in (done, failed, stale):
            assert await _gone(runs, run_id)
        assert await runs.get_run(run_id=alive) is not None and await runs.get_run(run_id=recent) is not None
        with pytest.raises(ValueError, match='older_than'):
            await runs.prune()

    @pytest.mark.anyio
    async def test_prune_keep_last_keeps_the_newest_runs(self, make_store: StoreFactory) -> None:
        runs = managed(make_store(max_run_age=timedelta(days=1)))
        old = utc_now() - timedelta(days=10)
        ids: list[str] = []
        for hour in range(3):
            run_id = await new_run(runs, started_at=old + timedelta(hours=hour))
            stamp = old + timedelta(hours=hour)
            await runs.append_event(StepEvent(run_id=run_id, kind='run_completed', step_index=1, timestamp=stamp))
            ids.append(run_id)
        newest_everywhere = [run.run_id for run in await runs.list_runs(newest_first=True, limit=1)]
        pruned = await runs.prune(keep_last=1)  # max_run_age applies
        kept = set(ids) - set(pruned.run_ids)
        assert kept == (set(ids) & set(newest_everywhere)) or kept == set()
        if newest_everywhere[0] in ids:
            assert kept == {ids[-1]}

    @pytest.mark.anyio
    async def test_an_age_before_year_one_or_a_keep_last_beyond_counting_removes_nothing(
        self, make_store: StoreFactory
    ) -> None:
        """`older_than` (or `grace`) reaching back before the earliest datetime: nothing is that old, so
        nothing goes (the cutoff reads `EARLIEST`). `keep_last` above `MAX_COUNT` keeps every run."""
        runs = managed(make_store())
        old = utc_now() - timedelta(days=40)
        ids: list[str] = []
        for kind in ('run_completed', 'run_failed', 'run_started'):
            run_id = await new_run(runs, started_at=old)
            await runs.append_event(StepEvent(run_id=run_id, kind=kind, step_index=1, timestamp=old))  # pyright: ignore[reportArgumentType]
            ids.append(run_id)
        assert set((await runs.prune(older_than=timedelta(days=30), dry_run=True)).run_ids) == set(ids)
        for age in (timedelta(days=999_999_999), timedelta.max, utc_now() - EARLIEST + timedelta(seconds=1)):
            for dry_run in (True, False):
                result = await runs.prune(older_than=age, dry_run=dry_run)
                assert result.run_ids == [] and result.cutoff == EARLIEST, age
        for keep_last in (MAX_COUNT + 1, 2**64, 10**30):
            for dry_run in (True, False):
                kept = await runs.prune(older_than=timedelta(days=30), keep_last=keep_last, dry_run=dry_run)
                assert kept.run_ids == [], keep_last
        reaching_year_two = utc_now() - datetime(2, 1, 1, tzinfo=UTC)  # a cutoff every store can still compare
        assert (await runs.prune(older_than=reaching_year_two)).run_ids == []
        assert {run.run_id for run in await runs.list_runs()} == set(ids)  # nothing stored was harmed
        if runs.media_store is not None:
            assert (await runs.collect_garbage(grace=timedelta.max)).blobs == []
        edge = await runs.prune(older_than=timedelta(days=30), keep_last=MAX_COUNT)  # still a count: keeps all
        assert edge.run_ids == []
        assert set((await runs.prune(older_than=timedelta(days=30))).run_ids) == set(ids)

    @pytest.mark.anyio
    async def test_a_delete_racing_a_write_leaves_the_whole_run_or_none_of_it(self, store: StepStore) -> None:
        runs = managed(store)
        for _ in range(5):
            run_id = await _full_run(runs)
            failures: list[BaseException] = []

            async def writer(run_id: str = run_id, failures: list[BaseException] = failures) -> None:
                history = tool_cycle()
                try:
                    for step in range(2, 40):
                        history = [*history, *tool_cycle(f'c{step}')]
                        await runs.write_records(
                            snapshot=snapshot(run_id, list(history), step_index=step),
                            events=[StepEvent(run_id=run_id, kind='tool_call_completed', step_index=step)],
                        )
                except RunNotFoundError as error:
                    failures.append(error)

            async with anyio.create_task_group() as group:
                group.start_soon(writer)
                await anyio.lowlevel.checkpoint()
                await runs.delete_run(run_id)
            assert await _gone(runs, run_id), 'a deleted run must read as nothing at all'

    @pytest.mark.anyio
    async def test_a_snapshot_removed_while_its_history_is_read_never_reads_as_older_versions(
        self, make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The run closes between a reader's read of a snapshot and of the message log: retention
        removes that snapshot and compaction the entries only it needed, while older versions of
        its positions stay for the snapshots kept. Those must not come back as its history."""
        kernel = kernel_store(make_store(max_snapshots_per_run=1))
        backend = kernel.backend
        fetch_log = backend.fetch_log
        final = _rewritten('a shorter summary', 'c3')
        for read in ('latest', 'list'):
            run_id = await new_run(kernel)
            written = {1: tool_cycle('c1', 'the question'), 2: _rewritten('a summary', 'c2'), 3: final}
            await kernel.save_snapshot(snapshot(run_id, list(written[1]), step_index=1))
            await kernel.save_snapshot(snapshot(run_id, list(written[2]), step_index=2, state='interrupted'))

            async def closing_first(
                run: str, *, below_index: int, positions_below: int, run_id: str = run_id
            ) -> LogSlice:
                monkeypatch.setattr(backend, 'fetch_log', fetch_log)
                await kernel.write_records(
                    snapshot=snapshot(run_id, list(final), step_index=3, state='interrupted'),
                    events=[StepEvent(run_id=run_id, kind='run_failed', step_index=3)],
                )
                return await fetch_log(run, below_index=below_index, positions_below=positions_below)

            monkeypatch.setattr(backend, 'fetch_log', closing_first)
            if read == 'latest':
                latest = await kernel.latest_snapshot(run_id=run_id, include_interrupted=True)
                found = [latest] if latest is not None else []
            else:
                found = await kernel.list_snapshots(run_id=run_id, include_interrupted=True)
            assert found, read
            for item in found:
                assert dump(item.messages) == dump(written[item.step_index]), (read, item.step_index)

    @pytest.mark.anyio
    async def test_garbage_collection_removes_only_unreferenced_old_blobs(self, make_store: StoreFactory) -> None:
        runs = managed(make_store())
        media = runs.media_store
        if media is None:
            pytest.skip('this store keeps payloads inline')
        if not isinstance(media, CollectableMediaStore):
            pytest.fail(f'{media!r} cannot list and delete blobs: every shipped media store must')

        def history(*seeds: int) -> list[ModelRequest]:
            return [ModelRequest(parts=[UserPromptPart(['look', *map(_image, seeds)], timestamp=T0)], timestamp=T0)]

        first = await new_run(runs)
        await runs.save_snapshot(snapshot(first, list(history(1, 2))))
        second = await new_run(runs)
        await runs.save_snapshot(snapshot(second, list(history(2, 3))))
        uris = {blob.uri async for blob in media.list_blobs()}
        assert len(uris) >= 3
        assert (await runs.collect_garbage(grace=timedelta(0), writers_stopped=True)).blobs == []  # all referenced
        await runs.delete_run(first)
        recent = await runs.collect_garbage()  # the grace period protects what was just put
        for short in (timedelta(0), timedelta(minutes=5)):  # shorter than a writer trusts its puts
            with pytest.raises(ValueError, match=f'grace={short} is shorter than .*writers_stopped=True'):
                await runs.collect_garbage(grace=short)
        assert {blob.uri async for blob in media.list_blobs()} == uris  # refused before anything was removed
        assert recent.blobs == [] and recent.kept_recent >= 1
        planned = await runs.collect_garbage(grace=timedelta(0), dry_run=True, writers_stopped=True)
        assert len(planned.blobs) == 1 and planned.dry_run
        collected = await runs.collect_garbage(grace=timedelta(0), writers_stopped=True)
        assert collected.blobs == planned.blobs and collected.bytes == 70 * 1024
        left = {blob.uri async for blob in media.list_blobs()}
        assert left == uris - set(collected.blobs)
        latest = await runs.latest_snapshot(run_id=second)
        assert latest is not None and dump(latest.messages) == dump(list(history(2, 3)))
        await runs.delete_run(second)
        assert len((await runs.collect_garbage(grace=timedelta(0), writers_stopped=True)).blobs) == 2

    @pytest.mark.anyio
    async def test_a_blob_collected_here_is_put_again_by_the_next_write_that_needs_it(
        self, make_store: StoreFactory
    ) -> None:
        """The writer that put a blob a minute ago would reference it without putting it again; after a
        collection in this process deleted it, it must put it again, or the new snapshot would not read."""
        runs = managed(make_store())
        if runs.media_store is None:
            pytest.skip('this store keeps payloads inline')
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(['look', _image(7)], timestamp=T0)], timestamp=T0)
        ]
        old = await new_run(runs)
        await runs.save_snapshot(snapshot(old, list(history)))
        await runs.delete_run(old)
        assert len((await runs.collect_garbage(grace=timedelta(0), writers_stopped=True)).blobs) == 1
        again = await new_run(runs)
        await runs.save_snapshot(snapshot(again, list(history)))
        latest = await runs.latest_snapshot(run_id=again)
        assert latest is not None and dump(latest.messages) == dump(history)
