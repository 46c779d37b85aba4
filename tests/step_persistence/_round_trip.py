"""The suite's history round-trip property, minus the deprecated `RetryPromptPart`.

`StepStoreConformance.test_arbitrary_histories_round_trip_exactly` generates `RetryPromptPart`,
which pydantic-ai (2.68) turns into `ToolReturnPart` / `RetryFeedbackPart` when it validates
JSON, so no store that serializes can round-trip it byte for byte. It also shares one hypothesis
test between every subclass (hypothesis' `differing_executors` health check). Until the suite
is fixed, each persistent store class gets its own copy of the property from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import ModelMessage, ModelRequest, RetryPromptPart

from pydantic_ai_steps.testing.step_store import (
    StoreFactory,
    all_snapshots,
    dump,
    message_strategy,
    new_run_id,
    snapshot,
)


def _without_retry_prompts(message: ModelMessage) -> ModelMessage | None:
    if not isinstance(message, ModelRequest):
        return message
    parts = [part for part in message.parts if not isinstance(part, RetryPromptPart)]  # pyright: ignore[reportDeprecated]
    if not parts:
        return None
    message.parts = parts
    return message


_messages = st.deferred(message_strategy).map(_without_retry_prompts).filter(lambda m: m is not None)


def round_trip_property() -> Callable[..., Any]:
    """A fresh hypothesis test per call, so each store class owns its own."""

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(histories=st.lists(st.lists(_messages, min_size=1, max_size=6), min_size=1, max_size=3))
    def test_arbitrary_histories_round_trip_exactly(
        self: object, make_store: StoreFactory, histories: list[list[ModelMessage]]
    ) -> None:
        store = make_store()

        async def check() -> None:
            run_id = new_run_id('prop')
            grown: list[ModelMessage] = []
            expected: list[bytes] = []
            for step, batch in enumerate(histories, start=1):
                grown = [*grown, *batch]
                expected.append(dump(grown))
                await store.save_snapshot(snapshot(run_id, list(grown), step_index=step))
            saved = await all_snapshots(store, run_id)
            assert [dump(s.messages) for s in saved] == expected

        anyio.run(check)

    return test_arbitrary_histories_round_trip_exactly
