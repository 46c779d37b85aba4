"""Conformance: the checks every record, message and run id passes before anything is written, the
same in every store, so a run recorded in one can move to any other."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolReturnPart

from .._errors import InvalidRecordError, InvalidRunIdError
from .._records import RunRecord, StepEvent, ToolEffectRecord
from ..store.protocol import ManagedStepStore, RecordBatchStore, StepStore
from ._support import T0, new_run, new_run_id, snapshot, tool_cycle


class InputConformance:
    @pytest.mark.anyio
    async def test_bad_records_are_refused_before_anything_is_written(self, store: StepStore) -> None:
        for bad in (
            RunRecord(run_id=new_run_id(), metadata={'attempt': 3}),  # pyright: ignore[reportArgumentType]
            RunRecord(run_id=new_run_id(), conversation_id=5),  # pyright: ignore[reportArgumentType]
            RunRecord(run_id=new_run_id(), parent_run_id=7),  # pyright: ignore[reportArgumentType]
            RunRecord(run_id=new_run_id(), agent_name=5),  # pyright: ignore[reportArgumentType]
            RunRecord(run_id=new_run_id(), run_metadata={'when': object()}),
            RunRecord(run_id=new_run_id(), run_metadata={'digits': [10**5000]}),
        ):
            with pytest.raises(InvalidRecordError):
                await store.register_run(bad)
            assert await store.get_run(run_id=bad.run_id) is None
        run_id = await new_run(store)
        with pytest.raises(InvalidRecordError, match='metadata'):
            await store.append_event(StepEvent(run_id=run_id, kind='run_started', step_index=0, metadata={'n': 1}))  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidRecordError, match='kind'):
            await store.append_event(StepEvent(run_id=run_id, kind='run_exploded', step_index=0))  # pyright: ignore[reportArgumentType]
        with pytest.raises(InvalidRecordError, match='state'):
            await store.save_snapshot(snapshot(run_id, tool_cycle(), state='half'))  # pyright: ignore[reportArgumentType]
        # Optional text fields of another type: one store would keep them, another turn them to
        # text, and the readers skip the record, so they are refused by name.
        for name in ('tool_name', 'error', 'conversation_id', 'idempotency_key', 'tool_args'):
            bad_event: Any = replace(StepEvent(run_id=run_id, kind='run_started', step_index=0), **{name: 7})
            with pytest.raises(InvalidRecordError, match=rf'StepEvent\.{name} must be a string or None'):
                await store.append_event(bad_event)
        with pytest.raises(InvalidRecordError, match=r'ContinuableSnapshot\.agent_name'):
            await store.save_snapshot(replace(snapshot(run_id, tool_cycle()), agent_name=5))  # pyright: ignore[reportArgumentType]
        effect = ToolEffectRecord(tool_call_id='bad', tool_name='t', run_id=run_id, status='started')
        for field, value, message in (
            ('idempotency_key', 7, 'idempotency_key must be a string or None, got int 7'),
            ('effect_summary', b'sent', 'effect_summary must be a string or None'),
            ('ended_at', 'yesterday', 'ended_at must be a datetime'),
            ('resolution', 'maybe', 'resolution must be one of'),
        ):
            with pytest.raises(InvalidRecordError, match=rf'ToolEffectRecord\.{message}'):
                await store.record_tool_effect(replace(effect, **{field: value}))
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='bad') is None
        assert await store.list_events(run_id=run_id) == []
        assert await store.latest_snapshot(run_id=run_id, include_interrupted=True) is None

    @pytest.mark.anyio
    async def test_a_lone_surrogate_in_a_record_is_refused_by_every_store_naming_the_field(
        self, store: StepStore
    ) -> None:
        """Text that is not valid Unicode (`\\udcff`, as `surrogateescape` decoding leaves) cannot go into
        UTF-8 storage, so every store refuses it, the in-memory one too: a run recorded in one store
        can be exported to any other. The field is named, the text is not echoed, nothing is kept."""
        named = RunRecord(run_id=new_run_id(), agent_name='agent-\udcff', started_at=T0)
        with pytest.raises(InvalidRecordError, match=r'RunRecord\.agent_name is not valid Unicode text') as refused:
            await store.register_run(named)
        assert 'agent-' not in str(refused.value)
        assert await store.get_run(run_id=named.run_id) is None
        for bad_run, field in (
            (RunRecord(run_id=new_run_id(), metadata={'tag': 'x\ud800'}), r"RunRecord\.metadata\['tag'\]"),
            (RunRecord(run_id=new_run_id(), run_metadata={'k\udcff': 1}), r'RunRecord\.run_metadata key'),
            (RunRecord(run_id=new_run_id(), run_metadata={'k': ['x\udcff']}), r"RunRecord\.run_metadata\['k'\]\[0\]"),
        ):
            with pytest.raises(InvalidRecordError, match=field):
                await store.register_run(bad_run)
            assert await store.get_run(run_id=bad_run.run_id) is None
        run_id = await new_run(store)
        odd_event = StepEvent(
            run_id=run_id, kind='tool_call_started', step_index=1, tool_call_id='c', tool_name='\ud800x'
        )
        with pytest.raises(InvalidRecordError, match=r'StepEvent\.tool_name is not valid Unicode text'):
            await store.append_event(odd_event)
        with pytest.raises(InvalidRecordError, match=r"StepEvent\.metadata\['note'\]"):
            await store.append_event(replace(odd_event, tool_name='t', metadata={'note': '\udc80'}))
        effect = ToolEffectRecord(tool_call_id='c', tool_name='t', run_id=run_id, status='started')
        with pytest.raises(InvalidRecordError, match=r'ToolEffectRecord\.effect_summary is not valid Unicode text'):
            await store.record_tool_effect(replace(effect, effect_summary='sent to x\udcff.txt'))
        with pytest.raises(InvalidRecordError, match=r'ContinuableSnapshot\.idempotency_key is not valid'):
            await store.save_snapshot(replace(snapshot(run_id, tool_cycle()), idempotency_key='k\ud800'))
        with pytest.raises(InvalidRecordError, match='conversation_id is not valid Unicode text'):
            await store.list_runs(conversation_id='c\udcff')
        for filters in ({'k': 'v\udcff'}, {'k\udcff': 1}):
            if isinstance(store, ManagedStepStore):
                with pytest.raises(InvalidRecordError, match=r'run_metadata.* is not valid Unicode text'):
                    await store.list_runs(run_metadata=filters)
        assert await store.list_events(run_id=run_id) == []
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='c') is None
        assert await store.latest_snapshot(run_id=run_id, include_interrupted=True) is None
        fine = StepEvent(
            run_id=run_id, kind='tool_call_started', step_index=1, tool_call_id='c', tool_name='tên-công-cụ'
        )
        await store.append_event(fine)  # other text outside ASCII is kept as written
        assert [event.tool_name for event in await store.list_events(run_id=run_id)] == ['tên-công-cụ']
        if isinstance(store, RecordBatchStore):  # a batch holding one such record is refused whole
            batch_run = new_run_id()
            opening = StepEvent(run_id=batch_run, kind='run_started', step_index=0)
            with pytest.raises(InvalidRecordError, match='tool_name'):
                await store.write_records(
                    run=RunRecord(run_id=batch_run, started_at=T0),
                    events=[opening, replace(odd_event, run_id=batch_run)],
                )
            assert await store.get_run(run_id=batch_run) is None

    @pytest.mark.anyio
    async def test_a_message_with_a_lone_surrogate_is_refused_naming_it_and_the_run_carries_on(
        self, store: StepStore
    ) -> None:
        """A tool returning `os.listdir()` of a file name that is not UTF-8 (`'x\\udc80y'`) gives a message
        no JSON in UTF-8 can hold: every store refuses it with `InvalidRecordError`, not a serializer's
        error, keeps its earlier snapshot, and takes the run's next good one."""
        run_id = await new_run(store)
        settled = tool_cycle()
        await store.save_snapshot(snapshot(run_id, settled))
        for returned in ('x\udc80y', {'sizes': {'x\udc80y': 1}}):  # in a dict key, pydantic would write U+FFFD
            odd = [*settled[:2], ModelRequest(parts=[ToolReturnPart('lookup', returned, tool_call_id='c1')])]
            with pytest.raises(InvalidRecordError, match='holds text that is not valid Unicode') as refused:
                await store.save_snapshot(snapshot(run_id, odd, step_index=2))
            assert str(refused.value).startswith(f'message 2 of run {run_id!r} ')
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None and latest.messages == settled
        grown = [*settled, ModelResponse(parts=[TextPart('done \ufffd', id='\ufffd')], timestamp=T0)]
        await store.save_snapshot(snapshot(run_id, grown, step_index=3))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None and latest.messages == grown

    @pytest.mark.anyio
    async def test_one_run_id_rule_for_every_store(self, store: StepStore) -> None:
        """Ids upstream users write (`job:123`) work; what some store could not hold is refused."""
        for good in ('job:123', 'tenant/42 run', 'naïve-run', 'x' * 200, 'a..b', '.hidden'):
            run_id = (good + '~' + new_run_id())[-200:] if len(good) == 200 else f'{good}~{new_run_id()}'
            await store.register_run(RunRecord(run_id=run_id, started_at=T0))
            await store.save_snapshot(snapshot(run_id, tool_cycle()))
            assert (await store.get_run(run_id=run_id)) is not None
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None and latest.run_id == run_id
        for bad in (
            '',
            '.',
            '..',
            '_index',
            'media',
            'MEDIA',
            'x' * 201,
            'nul\x00byte',
            'bell\x07',
            'esc\x1b[2J',
            'c1\x85',
        ):
            with pytest.raises(InvalidRunIdError):
                await store.register_run(RunRecord(run_id=bad))
