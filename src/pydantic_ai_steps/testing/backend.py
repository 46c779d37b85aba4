"""The `Backend` contract as reusable tests, for authors who implement only the storage primitives.

Subclass `BackendConformance` and provide a `make_backend` fixture returning a factory of backends
over the same storage (set `persistent = True` when two calls share it). Then also run the whole
store contract over your backend through the kernel::

    import pytest
    from pydantic_ai_steps.store import StepStoreBase
    from pydantic_ai_steps.testing.backend import BackendConformance
    from pydantic_ai_steps.testing.step_store import StepStoreConformance


    class TestMyBackend(BackendConformance):
        persistent = True

        @pytest.fixture
        def make_backend(self, tmp_path):
            return lambda: MyBackend(tmp_path / 'data')


    class TestMyStore(StepStoreConformance):
        persistent = True

        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda **options: StepStoreBase(MyBackend(tmp_path / 'data'), **options)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from .._errors import RunAlreadyExistsError, RunNotFoundError
from .._records import ContinuableSnapshot, RunQuery, RunRecord, StepEvent, ToolEffectRecord
from ..store.backend import STALE, SUPPRESSED, Backend, Closing, Damaged, SnapshotRow, SnapshotWrite, WriteBatch
from ._support import T0, new_run_id

__all__ = ['BackendConformance', 'BackendFactory']

BackendFactory = Callable[[], Backend]

VERBATIM = (
    '{"z":1,"a":[2,1]}',
    '{ "spaced" : true ,"dup":1,"dup":2}',
    '{"text":"é \\u00e9 \\"quoted\\" \\\\ back","n":1.50}',
    '{"$patch":[0,0]}',
)
"""Texts a backend must give back byte for byte: key order, spacing, escapes, number spelling."""


class BackendConformance:
    persistent: ClassVar[bool] = False

    @pytest.fixture
    def anyio_backend(self) -> str:
        return 'asyncio'

    @pytest.fixture
    def make_backend(self) -> BackendFactory:  # pragma: no cover - subclasses provide it
        raise NotImplementedError('provide a make_backend fixture returning a Backend factory')

    @pytest.fixture
    def backend(self, make_backend: BackendFactory) -> Backend:
        return make_backend()

    # --- helpers ------------------------------------------------------------------------------

    @staticmethod
    async def registered(backend: Backend, **fields: Any) -> str:
        run_id = new_run_id('backend')
        record = RunRecord(run_id=run_id, started_at=T0, **fields)
        outcome = await backend.commit(WriteBatch(run=backend.encoding.run(record), run_ids=frozenset({run_id})))
        assert outcome is None
        return run_id

    @staticmethod
    def snapshot_write(
        backend: Backend,
        run_id: str,
        appends: list[tuple[int, str]],
        count: int,
        *,
        expected: int | None,
        **fields: Any,
    ) -> SnapshotWrite:
        snapshot = ContinuableSnapshot(
            run_id=run_id, step_index=fields.pop('step', 1), messages=[], timestamp=T0, **fields
        )
        return SnapshotWrite(
            run_id=run_id,
            row=backend.encoding.snapshot(snapshot, count, None),
            appends=appends,
            expected_log_size=expected,
            key=snapshot.idempotency_key,
        )

    @staticmethod
    def rows(found: Any) -> list[Any]:
        return [row for row in found if not isinstance(row, Damaged)]

    # --- tests --------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_is_a_backend(self, backend: Backend) -> None:
        assert isinstance(backend, Backend)
        assert (await backend.probe()).step_store in (True, False)

    @pytest.mark.anyio
    async def test_registration_and_closing(self, backend: Backend) -> None:
        run_id = await self.registered(backend, conversation_id='c', agent_name='a')
        row = await backend.fetch_run(run_id)
        assert row is not None and not isinstance(row, Damaged)
        assert (row['run_id'], row['conversation_id'], row.get('status')) == (run_id, 'c', None)
        event = StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0, idempotency_key='k0')
        with pytest.raises(RunAlreadyExistsError):
            await backend.commit(
                WriteBatch(
                    run=backend.encoding.run(RunRecord(run_id=run_id)),
                    events=[backend.encoding.event(event)],
                    run_ids=frozenset({run_id}),
                )
            )
        assert await backend.fetch_events(run_id) == []  # a refused registration writes nothing
        ended = backend.encoding.time(T0 + timedelta(seconds=5))
        await backend.commit(
            WriteBatch(
                events=[backend.encoding.event(event)],
                closings=[Closing(run_id, 'completed', ended)],
                run_ids=frozenset({run_id}),
            )
        )
        row = await backend.fetch_run(run_id)
        assert row is not None and not isinstance(row, Damaged) and row['status'] == 'completed'
        listed = self.rows(await backend.fetch_runs(RunQuery(conversation_id='c')))
        assert run_id in [row['run_id'] for row in listed]  # a backend may return more: the kernel filters

    @pytest.mark.anyio
    async def test_records_of_an_unregistered_run_are_refused(self, backend: Backend) -> None:
        run_id = new_run_id('nobody')
        event = backend.encoding.event(StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0))
        with pytest.raises(RunNotFoundError):
            await backend.commit(WriteBatch(events=[event], run_ids=frozenset({run_id})))
        write = self.snapshot_write(backend, run_id, [(0, VERBATIM[0])], 1, expected=None)
        with pytest.raises(RunNotFoundError):
            await backend.commit(WriteBatch(snapshot=write, run_ids=frozenset({run_id})))
        assert await backend.fetch_run(run_id) is None and await backend.fetch_events(run_id) == []

    @pytest.mark.anyio
    async def test_log_texts_are_stored_verbatim_and_appended_contiguously(self, backend: Backend) -> None:
        run_id = await self.registered(backend)
        first = self.snapshot_write(backend, run_id, [(0, VERBATIM[0]), (1, VERBATIM[1])], 2, expected=0)
        assert await backend.commit(WriteBatch(snapshot=first, run_ids=frozenset({run_id}))) == 2
        second = self.snapshot_write(backend, run_id, [(1, VERBATIM[2]), (2, VERBATIM[3])], 3, expected=2, step=2)
        assert await backend.commit(WriteBatch(snapshot=second, run_ids=frozenset({run_id}))) == 4
        log = await backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)
        assert sorted((e.index, e.position, e.text) for e in log.entries) == [
            (0, 0, VERBATIM[0]),
            (1, 1, VERBATIM[1]),
            (2, 1, VERBATIM[2]),
            (3, 2, VERBATIM[3]),
        ]
        sliced = await backend.fetch_log(run_id, below_index=3, positions_below=2)
        assert sorted(e.index for e in sliced.entries) == [0, 1, 2]
        newest: list[SnapshotRow] = list(await backend.fetch_snapshots(run_id, include_interrupted=True))
        assert [row.row['log_size'] for row in newest if not isinstance(row.row, Damaged)] == [4, 2]
        assert [row.seq for row in newest] == sorted((row.seq for row in newest), reverse=True)
        oldest = await backend.fetch_snapshots(run_id, include_interrupted=True, oldest_first=True)
        assert [row.seq for row in oldest] == [row.seq for row in reversed(newest)]
        below = await backend.fetch_snapshots(run_id, include_interrupted=True, below_seq=newest[0].seq, limit=1)
        assert [row.seq for row in below] == [newest[1].seq]

    @pytest.mark.anyio
    async def test_stale_writes_nothing_and_claimed_keys_suppress_only_the_snapshot(self, backend: Backend) -> None:
        run_id = await self.registered(backend)
        encode = backend.encoding
        first = self.snapshot_write(backend, run_id, [(0, VERBATIM[0])], 1, expected=None, idempotency_key='s1')
        assert await backend.commit(WriteBatch(snapshot=first, run_ids=frozenset({run_id}))) == 1
        event = encode.event(StepEvent(run_id=run_id, kind='tool_call_completed', step_index=1, timestamp=T0))
        stale = self.snapshot_write(backend, run_id, [(1, VERBATIM[1])], 2, expected=0, step=2)
        outcome = await backend.commit(WriteBatch(snapshot=stale, events=[event], run_ids=frozenset({run_id})))
        assert outcome == STALE
        assert await backend.fetch_events(run_id) == []  # nothing of a stale batch is written
        assert len((await backend.fetch_log(run_id, below_index=1 << 62, positions_below=1 << 62)).entries) == 1
        replay = self.snapshot_write(backend, run_id, [(1, VERBATIM[1])], 2, expected=1, idempotency_key='s1')
        outcome = await backend.commit(WriteBatch(snapshot=replay, events=[event], run_ids=frozenset({run_id})))
        assert outcome == SUPPRESSED
        assert len(await backend.fetch_events(run_id)) == 1  # the rest of a suppressed batch is written
        states = await backend.fetch_snapshot_states(run_id)
        await backend.delete_snapshots(run_id, [seq for seq, _ in states])
        assert await backend.fetch_snapshots(run_id, include_interrupted=True) == []
        again = self.snapshot_write(backend, run_id, [], 1, expected=None, idempotency_key='s1')
        assert await backend.commit(WriteBatch(snapshot=again, run_ids=frozenset({run_id}))) == SUPPRESSED

    @pytest.mark.anyio
    async def test_effects_upsert_and_events_apply_keys_once(self, backend: Backend) -> None:
        run_id = await self.registered(backend)
        encode = backend.encoding

        def effect(call: str, status: Any) -> Any:
            return encode.effect(
                ToolEffectRecord(tool_call_id=call, tool_name='t', run_id=run_id, status=status, started_at=T0)
            )

        await backend.commit(
            WriteBatch(tool_effects=[effect('a', 'started'), effect('b', 'started')], run_ids=frozenset({run_id}))
        )
        await backend.commit(WriteBatch(tool_effects=[effect('a', 'completed')], run_ids=frozenset({run_id})))
        assert [row['tool_call_id'] for row in self.rows(await backend.fetch_effects(run_id))] == ['a', 'b']
        assert [
            row['tool_call_id'] for row in self.rows(await backend.fetch_effects(run_id, unresolved_only=True))
        ] == ['b']
        (found,) = self.rows(await backend.fetch_effects(run_id, tool_call_id='a'))
        assert found['status'] == 'completed'
        keyed = encode.event(
            StepEvent(run_id=run_id, kind='run_started', step_index=0, timestamp=T0, idempotency_key='k')
        )
        for _ in range(2):
            await backend.commit(WriteBatch(events=[keyed, keyed], run_ids=frozenset({run_id})))
        assert len(await backend.fetch_events(run_id)) == 1

    @pytest.mark.anyio
    async def test_entries_of_one_call_in_one_batch_apply_in_turn(self, backend: Backend) -> None:
        run_id = await self.registered(backend)

        def effect(call: str, status: Any) -> Any:
            return backend.encoding.effect(
                ToolEffectRecord(tool_call_id=call, tool_name='t', run_id=run_id, status=status, started_at=T0)
            )

        batch = [effect('a', 'started'), effect('b', 'started'), effect('a', 'completed'), effect('c', 'started')]
        await backend.commit(WriteBatch(tool_effects=batch, run_ids=frozenset({run_id})))
        rows = self.rows(await backend.fetch_effects(run_id))
        assert [(row['tool_call_id'], row['status']) for row in rows] == [
            ('a', 'completed'),
            ('b', 'started'),
            ('c', 'started'),
        ]

    @pytest.mark.anyio
    async def test_resolve_effect_writes_only_the_resolution_and_only_while_the_entry_allows(
        self, backend: Backend
    ) -> None:
        run_id = await self.registered(backend)
        encode = backend.encoding

        def effect(call: str, status: Any, **resolution: Any) -> ToolEffectRecord:
            return ToolEffectRecord(
                tool_call_id=call, tool_name='t', run_id=run_id, status=status, started_at=T0, **resolution
            )

        def resolution(outcome: Any, by: str, note: str | None = None) -> Any:
            return encode.resolution(
                effect('', 'started', resolution=outcome, resolved_by=by, resolved_at=T0, resolution_note=note)
            )

        async def found(call: str) -> Any:
            (row,) = self.rows(await backend.fetch_effects(run_id, tool_call_id=call))
            return (row['status'], row.get('resolution'), row.get('resolved_by'), row.get('resolution_note'))

        rows = [encode.effect(effect(call, status)) for call, status in (('a', 'started'), ('b', 'started'))]
        rows.append(encode.effect(effect('c', 'completed')))
        await backend.commit(WriteBatch(tool_effects=rows, run_ids=frozenset({run_id})))
        assert await backend.resolve_effect(run_id, 'a', resolution('not_done', 'x', 'n'), overwrite=False)
        assert await found('a') == ('started', 'not_done', 'x', 'n')
        assert not await backend.resolve_effect(run_id, 'a', resolution('done', 'y'), overwrite=False)
        assert await found('a') == ('started', 'not_done', 'x', 'n')  # an earlier resolution stays
        assert not await backend.resolve_effect(run_id, 'c', resolution('done', 'y'), overwrite=True)
        assert await found('c') == ('completed', None, None, None)  # only a `started` entry
        assert not await backend.resolve_effect(run_id, 'nope', resolution('done', 'y'), overwrite=True)
        assert await backend.resolve_effect(run_id, 'b', resolution('done', 'y', 'first'), overwrite=True)
        assert await backend.resolve_effect(run_id, 'b', resolution('not_done', 'z'), overwrite=True)
        assert await found('b') == ('started', 'not_done', 'z', None)  # a field left out is cleared
        unresolved = self.rows(await backend.fetch_effects(run_id, unresolved_only=True))
        assert unresolved == []
        # An upsert of an entry already stored keeps its resolution, whatever the row says.
        late = [encode.effect(effect('a', 'completed')), encode.effect(effect('b', 'failed', resolution='done'))]
        await backend.commit(WriteBatch(tool_effects=late, run_ids=frozenset({run_id})))
        assert await found('a') == ('completed', 'not_done', 'x', 'n')
        assert await found('b') == ('failed', 'not_done', 'z', None)
        assert [row['tool_call_id'] for row in self.rows(await backend.fetch_effects(run_id))] == ['a', 'b', 'c']

    @pytest.mark.anyio
    async def test_deletion_and_text_search(self, backend: Backend) -> None:
        kept, gone = await self.registered(backend), await self.registered(backend)
        for run_id in (kept, gone):
            write = self.snapshot_write(
                backend, run_id, [(0, f'{{"id":"{run_id}","m":"media+sha256://x"}}')], 1, expected=0
            )
            await backend.commit(WriteBatch(snapshot=write, run_ids=frozenset({run_id})))
        found = [text async for text in backend.texts_mentioning('media+sha256://')]
        assert all(any(run_id in text for text in found) for run_id in (kept, gone))
        assert await backend.delete_runs([gone, new_run_id('absent')]) == [gone]
        assert (
            await backend.fetch_run(gone) is None
            and await backend.fetch_snapshots(gone, include_interrupted=True) == []
        )
        assert not (await backend.fetch_log(gone, below_index=1 << 62, positions_below=1 << 62)).entries
        await backend.delete_log_entries(kept, [0])
        assert not (await backend.fetch_log(kept, below_index=1 << 62, positions_below=1 << 62)).entries
        await backend.reclaim_space()

    @pytest.mark.anyio
    async def test_a_second_aclose_is_fine(self, make_backend: BackendFactory) -> None:
        backend = make_backend()
        await self.registered(backend)
        await backend.aclose()
        await backend.aclose()
