"""The change detection behind message-once storage."""

from __future__ import annotations

from hypothesis import given
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

from pydantic_ai_steps.step_persistence import is_provider_valid
from pydantic_ai_steps.step_persistence._helpers import ProviderValidity
from pydantic_ai_steps.step_persistence._history import TAIL, HistoryTracker


def history(length: int) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f'q{i}')]) if i % 2 == 0 else ModelResponse(parts=[TextPart(f'a{i}')])
        for i in range(length)
    ]


def commit_all(tracker: HistoryTracker[int], run_id: str, messages: list[ModelMessage]) -> list[int]:
    delta = tracker.delta(run_id, messages)
    tracker.commit(delta, {position: position for position in delta.candidates}, 0)
    return delta.candidates


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


def test_a_replaced_old_message_is_found_even_outside_the_tail() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(10 * TAIL)
    commit_all(tracker, 'r', messages)
    rewritten = [ModelRequest(parts=[UserPromptPart('summary')]), *messages[1:]]
    assert commit_all(tracker, 'r', rewritten) == [0]


def test_a_shorter_history_keeps_what_it_shares() -> None:
    tracker: HistoryTracker[int] = HistoryTracker()
    messages = history(30)
    commit_all(tracker, 'r', messages)
    assert commit_all(tracker, 'r', messages[:12]) == []
    assert commit_all(tracker, 'r', messages) == list(range(12, 30))


def test_forgotten_runs_start_over() -> None:
    tracker: HistoryTracker[int] = HistoryTracker(max_runs=1)
    messages = history(4)
    commit_all(tracker, 'a', messages)
    assert commit_all(tracker, 'a', messages) == []
    commit_all(tracker, 'b', history(4))
    assert commit_all(tracker, 'a', messages) == [0, 1, 2, 3]


@given(
    events=st.lists(
        st.tuples(st.sampled_from(['call', 'return', 'text', 'rewrite']), st.sampled_from(['a', 'b', 'c', 'd'])),
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
        else:
            messages = messages[len(messages) // 2 :]
        assert checker.check(messages) == is_provider_valid(messages)
