"""The demo's child process: one `code_librarian` run, writing to the demo's store.

It exists to be killed. It reports on stdout, one JSON object per line (`{"say": ...}` for the
narrator, `{"side_effect_started": key}` the moment its side-effecting tool is in flight,
`{"finished": output}` if nobody stops it), and the parent SIGKILLs it on the second kind: a
real crash in the middle of a tool call, not a simulated exception.

    PYDANTIC_AI_STEPS_STORE=URL python -m pydantic_ai_steps.cli._demo_worker --outbox PATH --parent-run-id ID ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from ..store.registry import open_step_store
from ._demo_story import Outbox, ToolHooks, build_librarian, librarian_model

STALL_SECONDS = 60.0
"""How long the side effect "takes": far longer than the parent needs to kill the process."""


def report(**message: str) -> None:
    sys.stdout.write(json.dumps(message) + '\n')
    sys.stdout.flush()


async def _stall(key: str) -> None:
    report(side_effect_started=key)
    await anyio.sleep(STALL_SECONDS)


async def run(args: argparse.Namespace) -> None:
    store = open_step_store(os.environ['PYDANTIC_AI_STEPS_STORE'])
    hooks = ToolHooks(say=lambda text: report(say=text), before_side_effect=_stall)
    librarian = build_librarian(
        store, librarian_model(args.model), hooks, Outbox(Path(args.outbox)), parent_run_id=args.parent_run_id
    )
    try:
        result = await librarian.run(args.question, conversation_id=args.conversation)
    finally:
        await store.aclose()
    report(finished=result.output)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m pydantic_ai_steps.cli._demo_worker')
    parser.add_argument('--outbox', required=True)
    parser.add_argument('--parent-run-id', required=True)
    parser.add_argument('--conversation', required=True)
    parser.add_argument('--question', required=True)
    parser.add_argument('--model')
    anyio.run(run, parser.parse_args(argv))
    return 0


if __name__ == '__main__':
    sys.exit(main())
