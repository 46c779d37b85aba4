"""Child process: writes snapshots of one run that another process is writing too.

Usage: `python same_run_child.py <mongodb URL with database> <run id> <label> <steps> <out file> <go file>`;
it touches `<out file>.ready` once connected and starts when `<go file>` appears, pausing 10 ms
between saves, so the two writers' saves interleave however fast one of them starts.
Each step saves a snapshot of this process's own growing history (tool cycles labelled with
`<label>`) and an event keyed by label and step, as the capability's batching writer would. Every
history it saved is written to `<out file>` (one JSON text per line) so the test can check that
each stored snapshot is exactly one that some writer saved, never a mix of two.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from pydantic_ai_steps.step_persistence import ContinuableSnapshot, StepEvent, open_step_store
from pydantic_ai_steps.testing.step_store import tool_cycle


async def main(location: str, run_id: str, label: str, steps: int, out: Path, go: Path) -> None:
    store = open_step_store(location)
    history: list[ModelMessage] = []
    async with store:
        await store.get_run(run_id=run_id)  # connected: the first save does not wait for it
        Path(f'{out}.ready').touch()
        while not go.exists():  # noqa: ASYNC110 - another process creates it: no event to wait on
            await asyncio.sleep(0.005)
        with out.open('w', encoding='utf-8') as saved:
            for step in range(1, steps + 1):
                history = [*history, *tool_cycle(f'{label}-{step}', f'{label} asks {step}')]
                await store.write_records(
                    snapshot=ContinuableSnapshot(run_id=run_id, step_index=step, messages=list(history)),
                    events=[
                        StepEvent(
                            run_id=run_id,
                            kind='tool_call_completed',
                            step_index=step,
                            idempotency_key=f'{label}:{step}',
                        )
                    ],
                )
                saved.write(ModelMessagesTypeAdapter.dump_json(history).decode() + '\n')
                saved.flush()
                await asyncio.sleep(0.01)


if __name__ == '__main__':
    location, run_id, label, steps, out, go = sys.argv[1:]
    asyncio.run(main(location, run_id, label, int(steps), Path(out), Path(go)))
