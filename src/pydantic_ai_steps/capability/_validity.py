"""Provider validity: whether every tool call in a history is answered, which decides a snapshot's state."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    ToolCallPart,
    ToolReturnPart,
)

from ..store.history import TAIL


def is_provider_valid(messages: Sequence[ModelMessage]) -> bool:
    """Whether every tool call in `messages` is answered, in order, exactly once.

    A provider rejects a history with an unanswered call or an orphan return; this is the test
    that decides a snapshot's state (`complete` when valid, `interrupted` otherwise). A legacy
    `RetryPromptPart` naming a tool answers that tool's call, as it did in older histories.
    """
    open_calls = _open_calls_after(messages, set())
    return open_calls is not None and not open_calls


def _open_calls_after(messages: Iterable[ModelMessage], open_calls: set[str]) -> set[str] | None:
    """The calls still open after `messages`, starting from `open_calls`; `None` on an orphan return."""
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    open_calls.add(part.tool_call_id)
            continue
        for part in message.parts:
            answered = _answered_call(part)
            if answered is None:
                continue
            if answered not in open_calls:
                return None
            open_calls.discard(answered)
    return open_calls


class ProviderValidity:
    """`is_provider_valid` for one run's growing history, paying only for what is new.

    It remembers the open calls after a settled prefix (all but the newest `TAIL` messages) and
    resumes from there when the next history starts with equal messages; the prefix
    grows in place, so a check copies only the messages it settles.
    """

    def __init__(self) -> None:
        self._prefix: list[ModelMessage] = []
        self._open_after_prefix: set[str] = set()

    def check(self, messages: Sequence[ModelMessage]) -> bool:
        known = len(self._prefix)
        if known and len(messages) >= known and _same_prefix(messages[:known], self._prefix):
            start, open_calls = known, set(self._open_after_prefix)
        else:
            start, open_calls = 0, set[str]()
        checkpoint = max(start, len(messages) - TAIL)
        settled = _open_calls_after(messages[start:checkpoint], open_calls)
        if settled is None:
            return False
        if start:
            self._prefix += messages[start:checkpoint]
        else:
            self._prefix = list(messages[:checkpoint])
        self._open_after_prefix = set(settled)
        remaining = _open_calls_after(messages[checkpoint:], settled)
        return remaining is not None and not remaining


def _same_prefix(head: Sequence[ModelMessage], prefix: list[ModelMessage]) -> bool:
    """Whether `head` answers the same calls as `prefix`: equal messages do.

    Compared as lists, in C: identical items (the rule) without calling `__eq__`. Messages that are
    equal copies compare their fields, tool results included, whose `__eq__` is the caller's and
    may raise (an array's ambiguous truth value): that counts as different, and the check starts
    over.
    """
    try:
        return head == prefix
    except Exception:
        return False


def _answered_call(part: object) -> str | None:
    """The tool call id a request part answers, if it answers one."""
    if isinstance(part, ToolReturnPart):
        return part.tool_call_id
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:  # pyright: ignore[reportDeprecated]
        return part.tool_call_id
    return None
