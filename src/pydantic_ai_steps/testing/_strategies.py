"""Hypothesis strategies for pydantic-ai messages, shared by the conformance suites."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

_text = st.text(max_size=40)
_big_text = st.sampled_from([70 * 1024, 65 * 1024]).map(lambda n: 'x' * n)
_times = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC))
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_binary = st.builds(
    BinaryContent,
    data=st.binary(max_size=64) | st.sampled_from([b'\x89PNG' + bytes(70 * 1024), bytes(range(256)) * 300]),
    media_type=st.sampled_from(['image/png', 'application/octet-stream', 'audio/wav']),
)
_call_ids = st.text(alphabet='abcdef0123456789', min_size=1, max_size=8)


def message_strategy() -> st.SearchStrategy[ModelMessage]:
    request_part = st.one_of(
        st.builds(UserPromptPart, content=_text | _big_text, timestamp=_times),
        st.builds(
            UserPromptPart,
            content=st.lists(_text | _binary, min_size=1, max_size=3),
            timestamp=_times,
        ),
        st.builds(SystemPromptPart, content=_text, timestamp=_times),
        st.builds(
            ToolReturnPart,
            tool_name=_text,
            content=_text | _big_text | _json_value,
            tool_call_id=_call_ids,
            timestamp=_times,
        ),
        # A retry answering a tool call. (The deprecated `RetryPromptPart` is not generated:
        # pydantic-ai rewrites it into this shape whenever it validates JSON.)
        st.builds(
            ToolReturnPart,
            tool_name=_text,
            content=_text,
            tool_call_id=_call_ids,
            outcome=st.just('retried'),
            timestamp=_times,
        ),
    )
    response_part = st.one_of(
        st.builds(TextPart, content=_text | _big_text),
        st.builds(ThinkingPart, content=_text),
        st.builds(
            ToolCallPart,
            tool_name=_text,
            args=st.dictionaries(_text, _json_value, max_size=3),
            tool_call_id=_call_ids,
        ),
    )
    request = st.builds(
        ModelRequest,
        parts=st.lists(request_part, min_size=1, max_size=3),
        timestamp=_times | st.none(),
        instructions=_text | st.none(),
    )
    response = st.builds(ModelResponse, parts=st.lists(response_part, min_size=1, max_size=3), timestamp=_times)
    return st.one_of(request, response)
