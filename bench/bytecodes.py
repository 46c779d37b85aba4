"""Where a step's Python goes: this package's bytecodes per step, as a call tree, in a running agent.

    uv run python bench/bytecodes.py                 # 40-step runs, the tree four calls deep
    uv run python bench/bytecodes.py --depth 8 --min 20 --under save
    uv run python bench/bytecodes.py --own           # each function's own bytecodes, flat

`bench/instructions.py` counts a step's instructions with valgrind (C included) in minutes; this
counts the Python only, exactly, in seconds, and says where it is: every bytecode run in a frame
of this package is added to each function on the stack of this package's frames above it (its
callers' totals include it), keyed by the chain of function names from the hook down. A function
of pydantic-ai or the standard library that this package calls is not counted, nor what it calls
back. The count is the same on every run of the same code (`sys.settrace` with `f_trace_opcodes`;
the tracer slows the run down about 50x, so nothing here is a time).

The workload is `bench/steps.py`'s agent on a `SqliteStepStore` (`NORMAL`): one warm-up run, then
one traced run, divided by its steps.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import SqliteStepStore
from steps import UNLIMITED, make_agent


def _ours(code: CodeType) -> bool:
    return 'pydantic_ai_steps' in code.co_filename


def count(steps: int, depth: int) -> tuple[Counter[tuple[str, ...]], Counter[str]]:
    """Inclusive counts by call chain (at most `depth` deep) and own counts by function, per run."""
    tree: Counter[tuple[str, ...]] = Counter()
    own: Counter[str] = Counter()

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        del arg
        if event == 'opcode':
            chain: list[str] = []
            walk: FrameType | None = frame
            while walk is not None:
                if _ours(walk.f_code):
                    chain.append(walk.f_code.co_qualname)
                walk = walk.f_back
            chain.reverse()
            for end in range(1, min(len(chain), depth) + 1):
                tree[tuple(chain[:end])] += 1
            own[f'{frame.f_code.co_filename.split("pydantic_ai_steps/")[-1]}:{frame.f_code.co_qualname}'] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        del event, arg
        if not _ours(frame.f_code):
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return local

    async def run() -> None:
        with tempfile.TemporaryDirectory() as scratch:
            store = SqliteStepStore(database=Path(scratch) / 'steps.db')
            agent = make_agent(steps, [StepPersistence(store=store, agent_name='bench')])
            await agent.run('go', usage_limits=UNLIMITED)  # warm-up: imports, the schema, first-call caches
            sys.settrace(tracer)
            try:
                await agent.run('go', usage_limits=UNLIMITED)
            finally:
                sys.settrace(None)
            await store.aclose()

    asyncio.run(run())
    return tree, own


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--steps', type=int, default=40, help='steps of the traced run (default 40)')
    parser.add_argument('--depth', type=int, default=4, help='calls below the hook to show (default 4)')
    parser.add_argument('--min', type=float, default=50.0, help='hide entries under this many a step (default 50)')
    parser.add_argument('--under', help='show only chains through a function of this name')
    parser.add_argument('--own', action='store_true', help="each function's own bytecodes instead of the tree")
    args = parser.parse_args()
    tree, own = count(args.steps, args.depth + 1)
    total = sum(value for chain, value in tree.items() if len(chain) == 1) / args.steps
    print(f'this package: {total:,.0f} bytecodes a step ({args.steps}-step run, {SqliteStepStore.__name__})')
    if args.own:
        for name, value in own.most_common():
            if value / args.steps >= args.min:
                print(f'{value / args.steps:9,.1f}  {name}')
        return

    def heaviest_first(chain: tuple[str, ...]) -> list[tuple[float, str]]:
        return [(-tree[chain[:end]], chain[end - 1]) for end in range(1, len(chain) + 1)]

    shown = set(tree)
    if args.under is not None:  # the chains through it, and their callers
        through = [chain for chain in tree if any(args.under in name for name in chain)]
        shown = {chain[:end] for chain in through for end in range(1, len(chain) + 1)}
    for chain in sorted(shown, key=heaviest_first):
        per_step = tree[chain] / args.steps
        if per_step < args.min:
            continue
        print(f'{per_step:9,.1f}  {"  " * (len(chain) - 1)}{chain[-1]}')


if __name__ == '__main__':
    main()
