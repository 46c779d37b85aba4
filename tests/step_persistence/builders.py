"""Small builders shared by the store tests."""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import ModelMessage

from pydantic_ai_steps.step_persistence import ContinuableSnapshot
from pydantic_ai_steps.testing.step_store import T0, tool_cycle


def snap(run_id: str, messages: list[ModelMessage], step: int = 1, **fields: Any) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages, timestamp=T0, **fields)


def history(cycles: int, payload: str = '') -> list[ModelMessage]:
    return [message for index in range(cycles) for message in tool_cycle(f'c{index}', f'q{index}{payload}')]
