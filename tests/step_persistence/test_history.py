"""The change detection behind message-once storage, and the patches of stamped messages."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import pickle
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from pydantic_ai_steps.capability._validity import ProviderValidity
from pydantic_ai_steps.media import DiskMediaStore, MediaContext
from pydantic_ai_steps.media._context import EMPTY_CONTEXT
from pydantic_ai_steps.media._walker import externalize_tree
from pydantic_ai_steps.step_persistence import ContinuableSnapshot, is_provider_valid
from pydantic_ai_steps.store import patch as patch_module
from pydantic_ai_steps.store.history import (
    TAIL,
    HistoryTracker,
    MessageAdapter,
    content_digest,
    digest_after,
    message_to_json,
    parts_hash,
    request_tail,
    request_to_json,
)
from pydantic_ai_steps.store.log_entries import LogEntry, resolve_history
from pydantic_ai_steps.store.message_log import MessageLog, PreparedSnapshot
from pydantic_ai_steps.store.patch import PATCH_PREFIX, apply_patch, is_patch, make_patch, patch_base_index, restamp
from pydantic_ai_steps.testing._strategies import message_strategy


def history(length: int) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f'q{i}')]) if i % 2 == 0 else ModelResponse(parts=[TextPart(f'a{i}')])
        for i in range(length)
    ]


def commit_all(tracker: HistoryTracker[int], run_id: str, messages: list[ModelMessage]) -> list[int]:
    delta = tracker.delta(run_id, messages)
    tracker.commit(delta, {position: position for position in delta.candidates}, 0)
    return delta.candidates


@pytest.mark.parametrize('known', [False, True], ids=['first write', 'later write'])
def test_a_message_stamped_while_its_write_is_in_flight_is_a_candidate_again(known: bool) -> None:
    """What a write stored is judged by the message as it was serialized, not as it is when the
    write returns: a field reassigned meanwhile makes the position a candidate at the next save."""
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(4)
    if known:
        commit_all(tracker, 'r', messages[:2])
    delta = tracker.delta('r', messages)
    messages[3].timestamp = STAMP  # pydantic-ai stamping it while the store commits
    tracker.commit(delta, {position: position for position in delta.candidates}, 0)
    assert tracker.delta('r', messages).candidates == [3]


def test_only_new_positions_are_candidates_in_a_growing_history() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(40)
    assert commit_all(tracker, 'r', messages[:30]) == list(range(30))
    assert commit_all(tracker, 'r', messages) == list(range(30, 40))
    assert commit_all(tracker, 'r', messages) == []


def test_a_request_stamped_after_its_boundary_is_a_candidate() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(20)
    commit_all(tracker, 'r', messages)
    pending = messages[-2]
    assert isinstance(pending, ModelRequest)
    pending.instructions = 'stamped later'
    assert commit_all(tracker, 'r', [*messages, ModelResponse(parts=[TextPart('next')])]) == [18, 20]


def test_a_tail_message_whose_metadata_is_written_into_in_place_is_a_candidate() -> None:
    """pydantic-ai adds its own keys to the newest request's `metadata` dict in place after a
    boundary (when it counts tokens before a request): no attribute is reassigned, yet the
    message changed, so a newest message holding `metadata` is compared by content."""
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(20)
    pending = messages[-2]
    assert isinstance(pending, ModelRequest)
    pending.metadata = {'__pydantic_ai__': {}}
    commit_all(tracker, 'r', messages)
    namespace = pending.metadata['__pydantic_ai__']
    namespace['counted'] = True
    messages.append(ModelResponse(parts=[TextPart('next')]))
    assert commit_all(tracker, 'r', messages) == [18, 20]
    messages.append(ModelRequest(parts=[UserPromptPart('more')]))
    assert commit_all(tracker, 'r', messages) == [21]  # metadata as it was stored: nothing to compare by content
    old = messages[0]
    assert isinstance(old, ModelRequest)
    old.metadata = {}  # outside the tail, a reassignment is what counts: settled positions go by identity
    assert commit_all(tracker, 'r', messages) == []
    pending.metadata = {'when': object()}  # cannot be serialized to compare: compared by content at every save
    assert commit_all(tracker, 'r', messages) == [18]
    assert commit_all(tracker, 'r', messages) == [18]


def test_a_replaced_old_message_is_found_even_outside_the_tail() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(10 * TAIL)
    commit_all(tracker, 'r', messages)
    rewritten = [ModelRequest(parts=[UserPromptPart('summary')]), *messages[1:]]
    assert commit_all(tracker, 'r', rewritten) == [0]


def test_an_old_message_replaced_by_an_equal_copy_that_spells_differently_is_written() -> None:
    """`{'page': 1} == {'page': True}`, yet they serialize differently: the settled positions are
    compared by identity, never by `==`, so the copy is a candidate and its text is stored."""
    call = ModelResponse(parts=[ToolCallPart('fetch', {'page': 1}, tool_call_id='c')])
    equal = ModelResponse(parts=[ToolCallPart('fetch', {'page': True}, tool_call_id='c')], timestamp=call.timestamp)
    assert equal == call
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), call, *history(2 * TAIL)]

    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        await log.save(snapshot_of(messages), store.write)
        written = len(store.log)
        await log.save(snapshot_of([messages[0], equal, *messages[2:]], 1), store.write)
        assert [(entry.position, json.loads(entry.text)['parts'][0]['args']) for entry in store.log[written:]] == [
            (1, {'page': True})
        ]

    asyncio.run(main())


def _holds_a_dict_of_its_own(value: object) -> bool:
    return dict in map(type, gc.get_referents(value))


def test_the_tracker_reads_messages_without_giving_them_a_dict() -> None:
    """Asked for its `__dict__` (`vars()`), a CPython object trades the attribute values it keeps
    inline for a dict of its own, and pydantic-ai's reads of every message at every step slow down."""
    probe = TextPart('probe')
    vars(probe)
    if not _holds_a_dict_of_its_own(probe):
        pytest.skip('this Python keeps attribute values inline after vars()')
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(2 * TAIL)
    commit_all(tracker, 'r', messages)
    stamp_target = messages[-2]
    assert isinstance(stamp_target, ModelRequest)
    stamp_target.instructions = 'stamped later'
    commit_all(tracker, 'r', [*messages, ModelResponse(parts=[TextPart('next')])])
    touched = [value for message in messages for value in (message, *message.parts)]
    assert not any(map(_holds_a_dict_of_its_own, touched))


def test_a_part_with_a_field_never_assigned_is_tracked_by_its_attributes() -> None:
    """A part whose field was never assigned (or was deleted) has no value to read by name: its
    attributes stand in, and a later change of them still makes its message a candidate."""
    messages = history(2 * TAIL)
    part = messages[-1].parts[0]
    assert isinstance(part, TextPart)
    del part.content  # a field without a class default
    tracker: HistoryTracker[int] = HistoryTracker()
    assert commit_all(tracker, 'r', messages) == list(range(2 * TAIL))
    assert commit_all(tracker, 'r', messages) == []
    part.id = 'changed'
    assert commit_all(tracker, 'r', messages) == [2 * TAIL - 1]


def test_a_shorter_history_keeps_what_it_shares() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(30)
    commit_all(tracker, 'r', messages)
    assert commit_all(tracker, 'r', messages[:12]) == []
    assert commit_all(tracker, 'r', messages) == list(range(12, 30))


def test_a_delta_taken_before_another_write_of_its_run_was_recorded_forgets_the_run() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(10)
    commit_all(tracker, 'r', messages[:6])
    first, second = tracker.delta('r', messages[:8]), tracker.delta('r', messages)
    tracker.commit(first, {position: position for position in first.candidates}, 8)
    tracker.commit(second, {position: position for position in second.candidates}, 10)
    assert len(tracker) == 0  # the second write was taken against the state before the first
    assert commit_all(tracker, 'r', messages) == list(range(10))


def test_two_first_writes_of_one_run_leave_the_weight_of_the_last() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(4)
    first, second = tracker.delta('r', messages), tracker.delta('r', messages)
    tracker.commit(first, dict.fromkeys(first.candidates, 0), 4, weights=dict.fromkeys(first.candidates, 100))
    tracker.commit(second, dict.fromkeys(second.candidates, 0), 8, weights=dict.fromkeys(second.candidates, 10))
    assert len(tracker) == 1 and tracker.weight == 40
    tracker.forget('r')
    assert tracker.weight == 0


def test_the_weight_follows_a_history_that_grows_changes_and_shrinks() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(10)

    def write(upto: int, size: int) -> None:
        delta = tracker.delta('r', messages[:upto])
        tracker.commit(delta, dict.fromkeys(delta.candidates, 0), upto, weights=dict.fromkeys(delta.candidates, size))

    write(6, 100)
    write(10, 10)
    assert tracker.weight == 6 * 100 + 4 * 10
    write(3, 1)
    assert tracker.weight == 3 * 100
    write(10, 10)
    assert tracker.weight == 3 * 100 + 7 * 10
    tracker.forget('r')
    assert tracker.weight == 0


def test_forgotten_runs_start_over() -> None:
    tracker: HistoryTracker[int] = HistoryTracker(max_runs=1)
    messages = history(4)
    commit_all(tracker, 'a', messages)
    assert commit_all(tracker, 'a', messages) == []
    commit_all(tracker, 'b', history(4))
    assert commit_all(tracker, 'a', messages) == [0, 1, 2, 3]


@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(['call', 'return', 'text', 'rewrite', 'copy']), st.sampled_from(['a', 'b', 'c', 'd'])
        ),
        max_size=60,
    )
)
def test_incremental_validity_agrees_with_the_full_check(events: list[tuple[str, str]]) -> None:
    checker = ProviderValidity()
    messages: list[ModelMessage] = []
    for index, (kind, call_id) in enumerate(events):
        if kind == 'call':
            messages = [*messages, ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id=f'{call_id}{index // 8}')])]
        elif kind == 'return':
            messages = [
                *messages,
                ModelRequest(parts=[ToolReturnPart('t', 'ok', tool_call_id=f'{call_id}{index // 8}')]),
            ]
        elif kind == 'text':
            messages = [*messages, ModelResponse(parts=[TextPart('hi')])]
        elif kind == 'copy':  # equal messages, none of them the same object
            messages = copy.deepcopy(messages)
        else:
            messages = messages[len(messages) // 2 :]
        assert checker.check(messages) == is_provider_valid(messages)


class _Ambiguous:
    """A tool result whose comparison has no truth value (as a numpy array's has none)."""

    def __eq__(self, other: object) -> bool:
        return _Undecided()  # pyright: ignore[reportReturnType]

    __hash__ = None  # pyright: ignore[reportAssignmentType]


class _Undecided:
    def __bool__(self) -> bool:
        raise ValueError('the truth value of an array with more than one element is ambiguous')


def test_the_incremental_validity_check_survives_tool_results_that_cannot_be_compared() -> None:
    call = ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id='c')])
    answer = ModelRequest(parts=[ToolReturnPart('t', _Ambiguous(), tool_call_id='c')])
    messages: list[ModelMessage] = [call, answer, *(ModelResponse(parts=[TextPart('hi')]) for _ in range(TAIL))]
    checker = ProviderValidity()
    assert checker.check(messages)
    copied = copy.deepcopy(messages)  # none of them the same object; comparing them asks the result
    unanswered = ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id='d')])
    assert not checker.check([*copied, unanswered])
    assert checker.check(copied)


# --- patches: format and exactness ------------------------------------------------------------

STAMP = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def tool_return(index: int) -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart('fetch', 'x' * 2048, tool_call_id=f'call-{index}')])


def stamp(request: ModelRequest) -> None:
    """What pydantic-ai does to a request after the boundary that first saved it."""
    request.timestamp = STAMP
    request.run_id = 'run-1'
    request.conversation_id = 'conversation-1'
    request.instructions = 'be brief'


def test_a_stamped_request_is_a_small_patch_that_rebuilds_it_exactly() -> None:
    request = tool_return(0)
    before = message_to_json(request)
    stamp(request)
    after = message_to_json(request)
    patch = make_patch(7, before, after)
    assert patch is not None and is_patch(patch) and not is_patch(before)
    assert patch.startswith(PATCH_PREFIX + '7,')
    assert patch_base_index(patch) == 7
    assert len(patch) < 250 < 2048 < len(after)
    assert 'x' * 100 not in patch
    assert apply_patch(patch, before) == after
    json.loads(patch)  # a patch is itself JSON (the file store's log lines hold it as an object)


def test_parts_are_reused_appended_and_replaced_without_repeating_unchanged_ones() -> None:
    big = ['a' * 500, 'b' * 500, 'c' * 500]
    before = ModelRequest(parts=[UserPromptPart(text) for text in big])
    after = ModelRequest(parts=[UserPromptPart(big[0]), UserPromptPart('changed'), UserPromptPart(big[2])])
    after.parts = [*after.parts, UserPromptPart('appended')]
    for part_before, part_after in zip(before.parts, after.parts[:3], strict=True):
        part_after.timestamp = part_before.timestamp
    after.timestamp = before.timestamp
    old, new = message_to_json(before), message_to_json(after)
    patch = make_patch(0, old, new)
    assert patch is not None
    assert 'a' * 500 not in patch and 'c' * 500 not in patch
    assert '"changed"' in patch and '"appended"' in patch
    assert apply_patch(patch, old) == new


def test_patches_copy_raw_text_so_number_spellings_and_escapes_survive() -> None:
    base = '{"a":1e16,"b":"\\u00e9\\/","parts":[1E2,{"x":-0.0}],"c":[1,2]}'
    text = '{"b":"\\u00e9\\/","parts":[{"x":-0.0},1E2,{"y":1e+16}],"a":1e16,"d":"\\ud800","c":[3,1]}'
    patch = make_patch(3, base, text)
    assert patch is not None
    assert apply_patch(patch, base) == text


def test_only_compact_json_objects_are_patched() -> None:
    assert make_patch(0, '{"a": 1}', '{"a":2}') is None
    assert make_patch(0, '{"a":1}', '{"a":2} ') is None
    assert make_patch(0, '[1]', '{"a":2}') is None
    assert make_patch(0, '{"$patch":[0,0]}', '{"a":2}') is None  # never a patch of a patch
    assert make_patch(0, '{}', '{}') == PATCH_PREFIX + '0]}'
    assert apply_patch(PATCH_PREFIX + '0]}', '{}') == '{}'


@pytest.mark.parametrize(
    'patch',
    [
        '{"$patch":[0,5]}',  # no member 5
        '{"$patch":[0,-1]}',
        '{"$patch":[0,{}]}',  # an added member must be exactly one
        '{"$patch":[0,{"a":1,"b":2}]}',
        '{"$patch":[0,[1,9]]}',  # no element 9
        '{"$patch":[0,[]]}',
        '{"$patch":[0,"a"]}',
        '{"$patch":[]}',
        '{"$patch":[0,0],"x":1}',
        '{"$patch":[0, 0]}',
        '{"other":[0,0]}',
    ],
)
def test_a_malformed_patch_does_not_apply(patch: str) -> None:
    with pytest.raises(ValueError):
        apply_patch(patch, '{"a":1,"b":[1,2]}')


def test_a_restamped_text_keeps_the_first_member_and_takes_the_new_tail() -> None:
    base = '{"parts":[{"a":"],\\"timestamp\\":1","b":{"c":[1]}}],"timestamp":null,"kind":"request","meta":{"b":[1]}}'
    result = restamp(4, base, ',"timestamp":"now","meta":null,"state":"complete"}')
    assert result is not None
    text, patch = result
    head = '{"parts":[{"a":"],\\"timestamp\\":1","b":{"c":[1]}}]'
    assert text == head + ',"timestamp":"now","meta":null,"state":"complete"}'
    assert patch == PATCH_PREFIX + '4,0,{"timestamp":"now"},{"meta":null},{"state":"complete"}]}'  # other keys
    restamped = restamp(4, base, ',"timestamp":"now","kind":"request","meta":{"b":[1]}}')
    assert restamped is not None and restamped[1] == PATCH_PREFIX + '4,0,{"timestamp":"now"},2,3]}'
    assert apply_patch(restamped[1], base) == restamped[0]
    assert apply_patch(patch, base) == text


@pytest.mark.parametrize(
    ('base', 'tail'),
    [
        ('{"parts": [],"timestamp":1}', ',"timestamp":3}'),  # not compact
        ('{"parts" :[],"timestamp":1}', ',"timestamp":3}'),
        ('{"parts":[] ,"timestamp":1}', ',"timestamp":3}'),
        ('{"parts":[],"timestamp":1}', ',"timestamp": 3}'),
        ('{"parts":[],"timestamp":1}', '}'),  # no members after the first
        ('{"parts":[],"timestamp":1}', '"timestamp":3}'),
        ('{"parts":[1,"timestamp":1}', ',"timestamp":3}'),  # not JSON
        ('{"parts"', ',"timestamp":3}'),
        ('[1,2]', ',"timestamp":3}'),
        (PATCH_PREFIX + '0,0,{"timestamp":1}]}', ',"timestamp":3}'),  # never a patch of a patch
    ],
)
def test_a_text_that_is_not_compact_json_is_not_restamped(base: str, tail: str) -> None:
    assert restamp(0, base, tail) is None


def test_a_stamped_request_is_not_serialized_again_when_its_parts_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serializing tool results is most of a boundary's cost: a stamped version spells its parts as
    the base does, so only its other fields are serialized, and the text is the same byte for byte.
    Nor are its parts hashed again: its digest goes on from the base's parts."""
    import pydantic_ai_steps.store.message_log as message_log

    serialized: list[ModelMessage] = []
    hashed: list[str] = []

    def counting_hash(text: str, split: int) -> Any:
        hashed.append(text[:split])
        return parts_hash(text, split)

    monkeypatch.setattr(message_log, 'parts_hash', counting_hash)

    def counting(message: ModelMessage) -> str:
        serialized.append(message)
        return message_to_json(message)

    def counting_request(request: ModelRequest) -> tuple[str, int]:
        serialized.append(request)
        return request_to_json(request)

    monkeypatch.setattr(message_log, 'message_to_json', counting)
    monkeypatch.setattr(message_log, 'request_to_json', counting_request)

    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        request = tool_return(0)
        messages: list[ModelMessage] = [request]
        await log.save(snapshot_of(messages), store.write)
        stamp(request)
        serialized.clear()
        await log.save(snapshot_of(messages), store.write)
        assert serialized == [] and is_patch(store.log[-1].text)
        request.parts = [request.parts[0]]  # a new list of the same parts: spelled the same
        request.instructions = 'again'
        await log.save(snapshot_of(messages), store.write)
        assert serialized == [] and is_patch(store.log[-1].text)
        request.parts = [ToolReturnPart('fetch', 'y' * 2048, tool_call_id='call-0')]  # other parts
        request.instructions = 'and again'
        await log.save(snapshot_of(messages), store.write)
        assert serialized == [request]
        assert len(hashed) == 2 and 'y' * 2048 in hashed[1]
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts

    asyncio.run(main())


# --- patches: resolving a snapshot ---------------------------------------------------------------


def entries(*items: tuple[int, str]) -> list[LogEntry]:
    return [LogEntry(index, position, text) for index, (position, text) in enumerate(items)]


BASE = '{"parts":[{"content":"' + 'x' * 200 + '"}],"timestamp":null,"kind":"request"}'
STAMPED = '{"parts":[{"content":"' + 'x' * 200 + '"}],"timestamp":"2025-01-01T00:00:00Z","kind":"request"}'


def patch_of(base_index: int) -> str:
    patch = make_patch(base_index, BASE, STAMPED)
    assert patch is not None
    return patch


def test_resolving_applies_patches_and_old_full_text_logs_still_read() -> None:
    log = entries((0, '{"a":1}'), (1, BASE), (1, patch_of(1)), (2, '{"b":2}'))
    assert resolve_history(log, 3, 4) == ['{"a":1}', STAMPED, '{"b":2}']
    assert resolve_history(log, 2, 2) == ['{"a":1}', BASE]  # an earlier snapshot: before the patch
    assert resolve_history(entries((0, '{"a":1}'), (1, BASE)), 2, 2) == ['{"a":1}', BASE]


@pytest.mark.parametrize(
    'log',
    [
        entries((0, '{"a":1}'), (1, patch_of(5))),  # no such base
        entries((0, BASE), (1, patch_of(0))),  # base of another position
        entries((0, '{"a":1}'), (1, patch_of(1))),  # base is the patch itself
        entries((0, '{"a":1}'), (1, BASE), (1, patch_of(1)), (1, patch_of(2))),  # patch of a patch
        entries((0, '{"a":1}'), (1, '{"parts":[]}'), (1, patch_of(1))),  # base too short for the patch
        entries((0, '{"a":1}'), (1, BASE), (1, '{"$patch":[1,[0,7]]}')),
    ],
)
def test_a_snapshot_whose_patch_base_is_missing_or_wrong_does_not_resolve(log: list[LogEntry]) -> None:
    assert resolve_history(log, 2, len(log)) is None


def test_a_base_outside_the_entries_a_reader_loaded_does_not_resolve() -> None:
    log = entries((0, '{"a":1}'), (1, BASE), (1, patch_of(1)))
    assert resolve_history([log[0], log[2]], 2, 3) is None  # the base line was lost
    later = entries((0, '{"a":1}'), (1, patch_of(2)), (1, BASE))
    assert resolve_history(later, 2, 2) is None  # a base after the patch is beyond its snapshots
    assert resolve_history(later, 2, 3) == ['{"a":1}', BASE]


# --- patches: the write path ----------------------------------------------------------------------


class FakeStore:
    """A message log in a list, written the way the File and SQLite stores write it."""

    def __init__(self) -> None:
        self.log: list[LogEntry] = []
        self.snapshots: list[tuple[int, int, list[str]]] = []
        """`(message_count, log_size, the texts message_to_json gave at save time)`."""

    async def write(self, prepared: PreparedSnapshot) -> int:
        if prepared.known_log_size is not None:
            assert prepared.known_log_size == len(self.log)
        for position, text in prepared.appends:
            self.log.append(LogEntry(len(self.log), position, text))
        messages = prepared.snapshot.messages
        self.snapshots.append((len(messages), len(self.log), [message_to_json(m) for m in messages]))
        return len(self.log)

    def appended(self, since: int) -> list[str]:
        return [entry.text for entry in self.log[since:]]


def snapshot_of(messages: list[ModelMessage], step: int = 0) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id='run-1', step_index=step, messages=list(messages))


def test_a_stamped_request_is_written_once_in_full_then_as_a_patch() -> None:
    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        for step in range(6):
            messages.append(ModelResponse(parts=[ToolCallPart('fetch', {}, tool_call_id=f'call-{step}')]))
            request = tool_return(step)
            messages.append(request)
            await log.save(snapshot_of(messages, step), store.write)
            size = len(store.log)
            stamp(request)
            messages.append(ModelResponse(parts=[TextPart('thinking')]))
            await log.save(snapshot_of(messages, step), store.write)
            written = store.appended(size)
            assert len(written) == 2 and is_patch(written[0]) and not is_patch(written[1])
            assert len(written[0]) < 300
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts
        loaded = await log.load(resolve_history(store.log, len(messages), len(store.log)) or [])
        assert [message_to_json(m) for m in loaded] == [message_to_json(m) for m in messages]

    asyncio.run(main())


def test_metadata_written_into_a_saved_request_in_place_is_stored_at_the_next_save() -> None:
    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        request = ModelRequest(parts=[UserPromptPart('go')], metadata={'__pydantic_ai__': {'binding': 1}})
        messages: list[ModelMessage] = [request]
        await log.save(snapshot_of(messages), store.write)
        metadata = request.metadata
        assert metadata is not None
        metadata['__pydantic_ai__']['counted_input_tokens'] = 12  # in place, nothing reassigned
        messages.append(ModelResponse(parts=[TextPart('done')]))
        await log.save(snapshot_of(messages, 1), store.write)
        texts = resolve_history(store.log, len(messages), len(store.log))
        assert texts is not None and json.loads(texts[0])['metadata'] == {
            '__pydantic_ai__': {'binding': 1, 'counted_input_tokens': 12}
        }
        unchanged = len(store.log)
        await log.save(snapshot_of(messages, 2), store.write)  # compared by content: nothing new to write
        assert len(store.log) == unchanged

    asyncio.run(main())


def test_a_log_copied_between_a_request_and_its_stamp_still_patches_it() -> None:
    """A copy (`copy.deepcopy`, pickling) leaves out the parts' hash state, which `hashlib` cannot
    copy: the copy hashes those parts again and writes what the original would."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        request = tool_return(0)
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), request]
        await log.save(snapshot_of(messages), store.write)
        copied_store, copied_log, copied_messages = copy.deepcopy(
            (store, log, messages)
        )  # one memo: shared objects stay shared
        pickle.loads(pickle.dumps((log, messages)))
        copied_request = copied_messages[1]
        assert isinstance(copied_request, ModelRequest)
        stamp(request)
        stamp(copied_request)
        size = len(store.log)
        await log.save(snapshot_of(messages), store.write)
        await copied_log.save(snapshot_of(copied_messages), copied_store.write)
        assert store.appended(size) == copied_store.appended(size)
        assert len(store.appended(size)) == 1 and is_patch(store.appended(size)[0])

    asyncio.run(main())


def test_without_a_known_base_a_changed_version_is_written_in_full() -> None:
    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        request = tool_return(0)
        messages: list[ModelMessage] = [request]
        await log.save(snapshot_of(messages), store.write)
        stamp(request)
        log.forget('run-1')  # e.g. a failed write
        await log.save(snapshot_of(messages), store.write)
        assert not is_patch(store.log[-1].text)
        fresh = MessageLog(None, 1 << 20)  # another process
        request.instructions = 'other'
        await fresh.save(snapshot_of(messages), store.write)
        assert not is_patch(store.log[-1].text)
        request.instructions = 'third'
        await fresh.save(snapshot_of(messages), store.write)  # now it knows the base it just wrote
        assert is_patch(store.log[-1].text) and patch_base_index(store.log[-1].text) == 2
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts

    asyncio.run(main())


def test_bases_are_kept_for_the_tail_positions_only() -> None:
    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        requests = [tool_return(i) for i in range(3 * TAIL)]
        messages: list[ModelMessage] = list(requests)
        await log.save(snapshot_of(messages), store.write)
        delta = log._tracker.delta('run-1', messages)  # pyright: ignore[reportPrivateUsage]
        assert delta.previous is not None
        assert sorted(delta.previous.bases) == list(range(2 * TAIL, 3 * TAIL))
        assert all(store.log[base.index].text == base.text for base in delta.previous.bases.values())
        stamp(requests[-1])
        replaced = [ModelRequest(parts=[UserPromptPart('summary')]), *messages[1:]]  # an old position, rewritten
        await log.save(snapshot_of(replaced), store.write)
        assert [is_patch(text) for text in store.appended(3 * TAIL)] == [False, True]
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts

    asyncio.run(main())


def test_a_patch_keeps_media_markers_and_reads_back(tmp_path: Path) -> None:
    async def main() -> None:
        media = DiskMediaStore(tmp_path / 'media')
        store, log = FakeStore(), MessageLog(media, 1024)
        image = BinaryContent(data=bytes(range(256)) * 64, media_type='image/png')
        request = ModelRequest(parts=[UserPromptPart(['look ' * 100, image])])
        await log.save(snapshot_of([request]), store.write)
        assert image.data not in store.log[0].text.encode()
        stamp(request)
        await log.save(snapshot_of([request]), store.write)
        patch = store.log[1].text
        assert is_patch(patch) and 'look' not in patch
        texts = resolve_history(store.log, 1, 2)
        assert texts is not None
        assert (
            json.loads(texts[0])['parts'][0]['content'][1] == json.loads(store.log[0].text)['parts'][0]['content'][1]
        )  # the marker, as the full text stored it
        (loaded,) = await log.load(texts)
        assert message_to_json(loaded) == message_to_json(request)

    asyncio.run(main())


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The trees the message log walks for media, from now on."""
    import pydantic_ai_steps.store.message_log as message_log

    trees: list[object] = []

    async def counting_walk(tree: object, **kwargs: Any) -> Any:
        trees.append(tree)
        return await externalize_tree(tree, **kwargs)

    monkeypatch.setattr(message_log, 'externalize_tree', counting_walk)
    return trees


def test_a_large_result_of_small_values_is_stored_as_serialized_and_restamped(
    tmp_path: Path, walked: list[object]
) -> None:
    """A tool result over the media threshold with no payload that large has nothing to move: it is
    not parsed and walked, its text is stored as serialized, and its stamped version is a patch."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(DiskMediaStore(tmp_path / 'media'), 1024)
        rows = {f'row{i}': {'id': i, 'name': f'item {i}'} for i in range(100)}
        request = ModelRequest(parts=[ToolReturnPart('query', rows, tool_call_id='call-0')])
        await log.save(snapshot_of([request]), store.write)
        assert len(store.log[0].text) > 1024
        assert store.log[0].text == message_to_json(request)
        stamp(request)
        await log.save(snapshot_of([request]), store.write)
        assert is_patch(store.log[1].text)
        assert walked == []
        request.parts = [ToolReturnPart('query', {'blob': 'z' * 2048}, tool_call_id='call-0')]  # one long string
        await log.save(snapshot_of([request]), store.write)
        assert len(walked) == 1
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts

    asyncio.run(main())


@pytest.mark.parametrize('with_media', [True, False])
def test_a_restamped_request_whose_new_fields_spell_a_reserved_key_reads_back(tmp_path: Path, with_media: bool) -> None:
    """Only the fields after a restamped request's parts are checked for media and reserved keys
    (its parts were checked when its base was stored): a reserved key there is still caught."""

    async def main() -> None:
        media = DiskMediaStore(tmp_path / 'media') if with_media else None
        store, log = FakeStore(), MessageLog(media, 1 << 20)
        request = tool_return(0)
        await log.save(snapshot_of([request]), store.write)
        stamp(request)
        request.metadata = {'__harness_external_media__': True, 'note': 'a caller value'}
        await log.save(snapshot_of([request]), store.write)
        texts = resolve_history(store.log, 1, len(store.log))
        assert texts is not None
        (loaded,) = await log.load(texts)
        assert message_to_json(loaded) == message_to_json(request)

    asyncio.run(main())


def test_a_long_text_result_is_put_in_the_media_store_once_when_its_request_is_stamped(tmp_path: Path) -> None:
    """The stamped version of a request whose tool result went to the media store names the same
    blob without putting it again; the history reads back whole."""

    class CountingStore(DiskMediaStore):
        puts = 0

        async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
            CountingStore.puts += 1
            return await super().put(data, context=context)

    async def main() -> None:
        store, log = FakeStore(), MessageLog(CountingStore(tmp_path / 'media'), 1024)
        request = tool_return(0)  # 2 KB of text: over the threshold, so it moves out
        await log.save(snapshot_of([request]), store.write)
        assert CountingStore.puts == 1 and 'xxxx' not in store.log[0].text
        stamp(request)
        await log.save(snapshot_of([request]), store.write)
        assert CountingStore.puts == 1
        texts = resolve_history(store.log, 1, len(store.log))
        assert texts is not None
        (loaded,) = await log.load(texts)
        assert message_to_json(loaded) == message_to_json(request)

    asyncio.run(main())


@pytest.mark.parametrize('first', ['a binary of another media type', 'the same text'])
def test_bytes_put_before_under_another_context_are_put_again_under_this_one(tmp_path: Path, first: str) -> None:
    """A media store may file a blob by its context (`key_strategy(uri, context)`), and reads ask
    with the context it was put with: bytes this process put lately under one context are put again
    under another, not taken as stored."""
    document = 'a line of the report\n' * 100  # over the 1024-byte threshold

    def by_media_type(uri: str, context: MediaContext) -> str:
        return f'{(context.media_type or "none").replace("/", "_")}/{uri[-64:]}.bin'

    async def main() -> None:
        store, log = FakeStore(), MessageLog(DiskMediaStore(tmp_path / 'media', key_strategy=by_media_type), 1024)
        earlier: Any = (
            [BinaryContent(document.encode(), media_type='text/markdown')]
            if first == 'a binary of another media type'
            else [BinaryContent(document.encode(), media_type='text/plain')]
        )
        messages: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(['see', *earlier])]),
            ModelRequest(parts=[ToolReturnPart('read', document, tool_call_id='c')]),
            ModelRequest(parts=[UserPromptPart([BinaryContent(document.encode(), media_type='text/csv')])]),
        ]
        await log.save(snapshot_of(messages), store.write)
        texts = resolve_history(store.log, len(messages), len(store.log))
        assert texts is not None
        loaded = await log.load(texts)
        assert [message_to_json(message) for message in loaded] == [message_to_json(m) for m in messages]

    asyncio.run(main())


@pytest.mark.parametrize('payload', ['text', 'binary'])
def test_the_stamped_version_of_a_request_whose_payload_moved_out_is_a_patch_of_its_stored_text(
    tmp_path: Path, walked: list[object], payload: str
) -> None:
    """A request whose payload went to the media store is stored with a marker in its place; its
    stamped version is that stored text with the new fields after the parts, as a patch: the parts
    are neither serialized nor walked again."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(DiskMediaStore(tmp_path / 'media'), 1024)
        content: Any = 'x' * 2048 if payload == 'text' else [BinaryContent(b'\x89PNG' * 512, media_type='image/png')]
        request = ModelRequest(parts=[ToolReturnPart('fetch', content, tool_call_id='call-0')])
        await log.save(snapshot_of([request]), store.write)
        assert '__harness_external_media__' in store.log[0].text
        stamp(request)
        await log.save(snapshot_of([request]), store.write)
        assert is_patch(store.log[1].text) and len(store.log[1].text) < 400
        assert len(walked) == 1
        texts = resolve_history(store.log, 1, len(store.log))
        assert texts is not None
        (loaded,) = await log.load(texts)
        assert message_to_json(loaded) == message_to_json(request)

    asyncio.run(main())


def test_a_version_spelled_as_an_earlier_one_was_stored_is_still_written() -> None:
    """The stamped version of a request stored with a caller's value wrapped is its stored text with
    new fields; a later version whose own JSON spells that stored text (the caller now hands back
    the wrapper itself) is a different message, and is written."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 16)
        value = {'__harness_external_media__': True, 'note': 'x' * 200}
        request = ModelRequest(parts=[ToolReturnPart('t', value, tool_call_id='c')])
        await log.save(snapshot_of([request]), store.write)  # stored with the value wrapped as a literal
        stamp(request)
        await log.save(snapshot_of([request]), store.write)
        part = request.parts[0]
        assert isinstance(part, ToolReturnPart)
        wrapped = json.loads(store.log[0].text)['parts'][0]['content']
        assert '__harness_external_literal__' in wrapped
        request.parts = [ToolReturnPart('t', wrapped, tool_call_id='c', timestamp=part.timestamp)]
        await log.save(snapshot_of([request]), store.write)
        assert len(store.log) == 3
        for count, size, texts in store.snapshots:
            resolved = resolve_history(store.log, count, size)
            assert resolved is not None
            (loaded,) = await log.load(resolved)
            assert message_to_json(loaded) == texts[0]

    asyncio.run(main())


@pytest.mark.parametrize('metadata', [{'__harness_external_media__': True}, {'content': 'z' * 2048}])
def test_a_stamped_request_whose_payload_moved_out_and_whose_new_fields_need_a_walk_reads_back(
    tmp_path: Path, metadata: dict[str, object]
) -> None:
    """New fields after the parts that spell a reserved key or hold a payload are not written onto
    the stored text with its markers (a walk of that text would take them for a caller's values):
    the whole request is serialized and walked again, and reads back as it was."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(DiskMediaStore(tmp_path / 'media'), 1024)
        request = tool_return(0)  # 2 KB of text: over the threshold, so it moves out
        await log.save(snapshot_of([request]), store.write)
        stamp(request)
        request.metadata = metadata
        await log.save(snapshot_of([request]), store.write)
        for count, size, texts in store.snapshots:
            resolved = resolve_history(store.log, count, size)
            assert resolved is not None
            (loaded,) = await log.load(resolved)
            assert message_to_json(loaded) == texts[0]
        assert store.snapshots[-1][2][0] == message_to_json(request)

    asyncio.run(main())


# --- patches: properties ----------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)

NUMBER_SPELLINGS: dict[object, list[str]] = {}


@st.composite
def raw_json(draw: st.DrawFn, value: Any) -> str:
    """`value` as compact JSON, with the spellings other encoders use (escapes, exponents) drawn at random."""
    if isinstance(value, dict):
        members = [
            draw(raw_json(key)) + ':' + draw(raw_json(item))
            for key, item in value.items()  # pyright: ignore[reportUnknownVariableType]
        ]
        return '{' + ','.join(members) + '}'
    if isinstance(value, list):
        return '[' + ','.join(draw(raw_json(item)) for item in value) + ']'  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=draw(st.booleans()))
    if isinstance(value, float) and value == value and abs(value) != float('inf'):
        return draw(st.sampled_from([repr(value), f'{value:e}', f'{value:E}', json.dumps(value)]))
    return json.dumps(value)


@st.composite
def message_dict_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A message-like dict and a changed version: members kept, changed, dropped, added, moved; parts too."""
    keys = st.text(max_size=6).filter(lambda key: key != '$patch')  # a message's keys are field names
    base = draw(st.dictionaries(keys, json_values, max_size=6))
    base['parts'] = draw(st.lists(json_values, max_size=6))
    changed: dict[str, Any] = {}
    for key, value in base.items():
        action = draw(st.sampled_from(['keep', 'keep', 'change', 'drop']))
        if action == 'keep':
            changed[key] = value
        elif action == 'change':
            if key == 'parts' and draw(st.booleans()):
                kept = [item for item in value if draw(st.booleans())]
                changed[key] = draw(st.permutations(kept + draw(st.lists(json_values, max_size=3))))
            else:
                changed[key] = draw(json_values)
    changed.update(draw(st.dictionaries(keys, json_values, max_size=3)))
    if draw(st.booleans()):
        changed = dict(draw(st.permutations(list(changed.items()))))
    return base, changed


@settings(max_examples=300, deadline=None)
@given(pair=message_dict_pairs(), data=st.data(), base_index=st.integers(0, 10**6))
def test_any_change_round_trips_byte_exactly(
    pair: tuple[dict[str, Any], dict[str, Any]], data: st.DataObject, base_index: int
) -> None:
    base = data.draw(raw_json(pair[0]))
    text = data.draw(raw_json(pair[1]))
    patch = make_patch(base_index, base, text)
    assert patch is not None
    assert patch_base_index(patch) == base_index
    assert apply_patch(patch, base) == text
    log = [LogEntry(base_index, 0, base), LogEntry(base_index + 1, 0, patch)]
    assert resolve_history(log, 1, base_index + 2) == [text]
    assert resolve_history(log, 1, base_index + 1) == [base]


@settings(max_examples=300, deadline=None)
@given(pair=message_dict_pairs(), data=st.data(), base_index=st.integers(0, 10**6))
def test_any_restamp_is_the_base_with_the_new_tail_exactly(
    pair: tuple[dict[str, Any], dict[str, Any]], data: st.DataObject, base_index: int
) -> None:
    old, new = pair

    def members(value: dict[str, Any]) -> str:
        spelled = (data.draw(raw_json(key)) + ':' + data.draw(raw_json(item)) for key, item in value.items())
        return ''.join(',' + member for member in spelled)

    old, new = dict(old), dict(new)
    head = '{"parts":' + data.draw(raw_json(old.pop('parts')))
    new.pop('parts', None)
    base, tail = head + members(old) + '}', members(new) + '}'
    result = restamp(base_index, base, tail)
    assert restamp(base_index, base, tail, len(head)) == result  # the writer's known end of `parts` agrees
    if not new:
        assert result is None
        return
    assert result is not None
    text, patch = result
    assert text == head + tail
    assert patch_base_index(patch) == base_index
    assert apply_patch(patch, base) == text
    log = [LogEntry(base_index, 0, base), LogEntry(base_index + 1, 0, patch)]
    assert resolve_history(log, 1, base_index + 2) == [text]


def _split_by_the_scanner(tail: str) -> list[str] | None:
    """A request's tail split by the JSON scanner, member by member; `None` where it refuses it."""
    try:
        return [raw for _, raw, _ in patch_module._members('{' + tail[1:])]  # pyright: ignore[reportPrivateUsage]
    except (ValueError, RecursionError):
        return None


def _split_in_one_pass(tail: str) -> list[str] | None:
    try:
        return patch_module._tail_members(tail)  # pyright: ignore[reportPrivateUsage]
    except (ValueError, RecursionError):
        return None


@pytest.mark.parametrize(
    'tail',
    [
        ',"timestamp":"2026-01-01T00:00:00Z","instructions":null,"kind":"request","metadata":{"a":[1]}}',
        ',"k":"\\x"}',  # an escape JSON does not have
        ',"k":"\\u12"}',
        ',"k":"\\u00e9\\"\\\\\\/"}',
        ',"k":"a' + '\x01' + '"}',  # a raw control character
        ',"k":"a\\"}',  # an unclosed string
        ',"k":01}',
        ',"k":1.}',
        ',"k":-}',
        ',"k":1e5,"l":-0.5E-3,"m":true,"n":false}',
        ',"k":NaN}',  # Python's scanner takes it; no writer here spells it
        ',"k":nul}',
        ',"k":1',
        ',"k":1}}',
        ',"k":1,}',
        ',"k" :1}',
    ],
)
def test_a_tail_splits_as_the_scanner_does_at_the_edges_of_json(tail: str) -> None:
    assert _split_in_one_pass(tail) == _split_by_the_scanner(tail)


_string_like = st.text(
    alphabet=st.sampled_from(['\\', 'u', '0', 'a', 'F', 'n', 'x', '"', '\x01', '\n', '\x1f', ' ', 'é']), max_size=8
)


@settings(max_examples=500, deadline=None)
@given(
    data=st.data(),
    value=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=8),
    garbled=st.one_of(st.text(), _string_like.map(lambda inner: f'"{inner}"')),
)
def test_a_tail_splits_into_the_members_the_json_scanner_finds(
    data: st.DataObject, value: dict[str, Any], garbled: str
) -> None:
    """The one-pass split of a request's tail agrees with the scanner's, and refuses what it refuses
    (raw control characters and bad escapes in a string, values that are not JSON)."""
    members = [data.draw(raw_json(key)) + ':' + data.draw(raw_json(item)) for key, item in value.items()]
    if data.draw(st.booleans()):  # a member whose value is not JSON at all
        members.insert(data.draw(st.integers(0, len(members))), '"k":' + garbled)
    tail = ''.join(',' + member for member in members) + '}'
    assert _split_in_one_pass(tail) == _split_by_the_scanner(tail)


@settings(max_examples=500, deadline=None)
@given(data=st.data(), value=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=8))
def test_a_serialized_tail_splits_without_a_check_into_the_scanners_members(
    data: st.DataObject, value: dict[str, Any]
) -> None:
    """The unchecked split of a tail pydantic wrote finds the scanner's members, or declines (an
    object, an array or a bracket anywhere, a string ending in a comma, a key starting with a
    comma or a colon), never other ones."""
    members = [data.draw(raw_json(key)) + ':' + data.draw(raw_json(item)) for key, item in value.items()]
    tail = ''.join(',' + member for member in members) + '}'
    split = patch_module.serialized_scalar_members(tail)
    assert split is None or split == _split_by_the_scanner(tail)
    if not any(mark in tail for mark in ('{', '[', ',",', ',":')) and not any(',"' in member for member in members):
        assert split == _split_by_the_scanner(tail)


def test_a_serialized_tail_with_a_string_ending_in_a_comma_is_left_to_the_scanner() -> None:
    for tail in (',"a":"x,","b":1}', ',"a":"x,"}', ',"a,":1}', ',":":null}', ',",0":null}'):
        assert patch_module.serialized_scalar_members(tail) is None
        assert _split_in_one_pass(tail) == _split_by_the_scanner(tail)


@settings(max_examples=200, deadline=None)
@given(left=json_values, right=json_values, spaced=st.booleans())
def test_any_pair_of_texts_patches_exactly_or_not_at_all(left: Any, right: Any, spaced: bool) -> None:
    separators = (', ', ': ') if spaced else (',', ':')
    base, text = (json.dumps(value, separators=separators, ensure_ascii=False) for value in (left, right))
    patch = make_patch(0, base, text)
    if patch is not None:
        assert apply_patch(patch, base) == text


events = st.lists(
    st.sampled_from(['call', 'stamp', 'text', 'rewrite', 'shrink', 'forget', 'part']),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(script=events)
def test_every_snapshot_resolves_to_what_was_saved(script: list[str]) -> None:
    """Stamp, append, rewrite, shrink and forget in any order: each snapshot reads back exactly."""

    async def main() -> None:
        store, log = FakeStore(), MessageLog(None, 1 << 20)
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        for step, event in enumerate(script):
            requests = [m for m in messages[-3:] if isinstance(m, ModelRequest)]
            if event == 'call':
                messages = [*messages, ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id=f'c{step}')])]
                messages.append(tool_return(step))
            elif event == 'stamp' and requests:
                stamp(requests[-1])
                requests[-1].instructions = f'step {step}'
            elif event == 'part' and requests:
                requests[-1].parts = [*requests[-1].parts, UserPromptPart(f'more {step}')]
            elif event == 'text':
                messages = [*messages, ModelResponse(parts=[TextPart(f'a{step}')])]
            elif event == 'rewrite':
                messages = [ModelRequest(parts=[UserPromptPart(f'summary {step}')]), *messages[2:]]
            elif event == 'shrink':
                messages = messages[: max(1, len(messages) - 3)]
            elif event == 'forget':
                log.forget('run-1')
            await log.save(snapshot_of(messages, step), store.write)
        for count, size, texts in store.snapshots:
            assert resolve_history(store.log, count, size) == texts

    asyncio.run(main())


_spoofing_text = st.sampled_from([',"timestamp":', '","timestamp":"x', '}', 'plain'])
_metadata = st.none() | st.dictionaries(
    st.sampled_from(['timestamp', 'instructions', 'state', 'k']),
    st.none() | _spoofing_text | st.dictionaries(st.sampled_from(['timestamp', 'kind']), _spoofing_text, max_size=2),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    message=message_strategy(),
    instructions=st.none() | st.text(max_size=20) | _spoofing_text,
    metadata=_metadata,
)
def test_a_restamped_request_is_the_adapters_bytes(
    message: ModelMessage, instructions: str | None, metadata: dict[str, Any] | None
) -> None:
    """What a boundary writes for a stamped request is what serializing all of it would write, and
    the end of its parts is found whatever its other fields spell (the parts' end read from the end)."""
    if not isinstance(message, ModelRequest):
        return
    message.metadata = metadata
    message.instructions = instructions
    before, split = request_to_json(message)
    assert before == message_to_json(message)
    assert json.loads(before[:split] + '}') == {'parts': json.loads(before)['parts']}
    assert before.startswith((',', '}'), split)
    stamp(message)
    message.instructions = instructions
    tail = request_tail(message)
    assert tail is not None
    result = restamp(0, before, tail, split)
    assert result is not None
    assert result == restamp(0, before, tail)  # the same as finding the end of `parts` by scanning
    assert result[0] == message_to_json(message) == MessageAdapter.dump_json(message).decode()
    assert apply_patch(result[1], before) == result[0]
    parts = parts_hash(before, split)
    assert digest_after(parts, before, split) == content_digest(before)
    assert digest_after(parts, result[0], split) == content_digest(result[0])  # the base's state is not used up


def test_the_end_of_a_requests_parts_is_not_read_off_members_of_other_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from the end, the fields after the parts must be exactly the request's, in order: a
    serializer that spells them otherwise (another order, a field left out) has the parts measured."""
    import pydantic_ai_steps.store.history as history_module

    request = ModelRequest(parts=[UserPromptPart('hello')], instructions='be brief')
    text, split = request_to_json(request)
    assert text[split:].startswith(',"timestamp":')
    measured: list[object] = []
    dump_json = history_module._REQUESTS.dump_json  # pyright: ignore[reportPrivateUsage]

    def counting_dump_json(value: Any, **kwargs: Any) -> bytes:
        if kwargs.get('include') is not None:
            measured.append(value)
        return dump_json(value, **kwargs)

    monkeypatch.setattr(history_module._REQUESTS, 'dump_json', counting_dump_json)  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(history_module, '_SCALARS_BUT_METADATA', False)
    monkeypatch.setattr(history_module, '_TAIL_KEYS', ('"instructions":', '"kind":'))
    assert request_to_json(request) == (text, split)
    assert len(measured) == 1  # the parts were serialized alone to find their end


def test_a_request_without_metadata_has_its_parts_end_read_off_the_match() -> None:
    """With only scalars after the parts, the last `,"timestamp":` is where they end, whatever the
    parts or the instructions spell."""
    spoof = ',"timestamp":"2020-01-01T00:00:00Z","instructions":null}'
    request = ModelRequest(
        parts=[
            UserPromptPart(spoof),
            ToolReturnPart('tool', {'timestamp': spoof, 'x': [{'timestamp': 1}]}, tool_call_id='c'),
        ],
        instructions=spoof,
    )
    text, split = request_to_json(request)
    assert text == message_to_json(request)
    assert json.loads(text[:split] + '}') == {'parts': json.loads(text)['parts']}


@settings(max_examples=150, deadline=None)
@given(st.lists(message_strategy(), min_size=1, max_size=4))
def test_message_to_json_is_the_union_adapters_bytes(messages: list[ModelMessage]) -> None:
    """The per-class fast path writes exactly what pydantic-ai's own adapter writes."""
    for message in messages:
        assert message_to_json(message) == MessageAdapter.dump_json(message).decode()
    assert '[' + ','.join(map(message_to_json, messages)) + ']' == ModelMessagesTypeAdapter.dump_json(messages).decode()
