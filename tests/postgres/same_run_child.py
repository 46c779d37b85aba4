"""Child process for the stale-path test: one writer of snapshots of a run another process writes too.

Usage: `python same_run_child.py <store url> <run id> <writer> <saves> <out-dir>`. The writer waits for
`<out-dir>/go`, then saves `saves` snapshots of the run, each a history of its own (the run's prompt,
then one response per save so far, naming the writer), keyed `<writer>:<n>`, with a keyed event each.
Both writers extend the run's message log, so each one's picture of where the log ends keeps going
stale; every save must still store exactly the history it was given.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from pydantic_ai_steps.step_persistence import ContinuableSnapshot, StepEvent, open_step_store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def history(writer: str, saves: int) -> list[ModelMessage]:
    prompt: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('shared prompt', timestamp=T0)], timestamp=T0)]
    return prompt + [ModelResponse(parts=[TextPart(f'{writer} answer {n}')], timestamp=T0) for n in range(saves)]


async def main(url: str, run_id: str, writer: str, saves: int) -> None:
    store = open_step_store(url)
    try:
        for n in range(1, saves + 1):
            await store.write_records(
                snapshot=ContinuableSnapshot(
                    run_id=run_id, step_index=n, messages=history(writer, n), idempotency_key=f'{writer}:{n}'
                ),
                events=[
                    StepEvent(run_id=run_id, kind='tool_call_completed', step_index=n, idempotency_key=f'{writer}:{n}')
                ],
            )
            await asyncio.sleep(0)
    finally:
        await store.aclose()


if __name__ == '__main__':
    url, run_id, writer, saves, out = sys.argv[1:]
    (Path(out) / f'{writer}.ready').touch()
    while not (Path(out) / 'go').exists():
        time.sleep(0.005)
    asyncio.run(main(url, run_id, writer, int(saves)))
