"""Ours timed inside its hooks at two revisions, in alternating processes: does a small change show in time?

    uv run python bench/hooks_ab.py a091a5d                # that commit against the working tree
    uv run python bench/hooks_ab.py a091a5d HEAD --rounds 10

A revision is checked out in a temporary git worktree; without a second revision the other side is
this checkout as it is, uncommitted changes included. Each round runs one child process per side,
in alternating order. A child warms up with a 20-step run, then times `StepPersistence` inside its
per-step hooks (`inside_hooks.TimedStepPersistence`: the tool's own time and pydantic-ai's dispatch
left out) in three 100-step runs and one 400-step run of `bench/steps.py`'s agent, each on a fresh
copy of a template database (`SqliteStepStore`, `NORMAL`). Printed: per side, the median ms a step
at each step count over every run so far, after each round.

A whole run moves by 10-20% from one to the next on a shared machine, so a change of a few percent
needs many rounds to show, and may not; `bench/instructions.py` ranks such changes without the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
RUNS = {100: 3, 400: 1}


async def child(root: Path) -> None:
    """Time ours at the checkout `root` (its `src` and `bench` imported first); print JSON."""
    sys.path[:0] = [str(root / 'src'), str(root / 'bench')]
    import pydantic_ai_steps
    from inside_hooks import TimedStepPersistence
    from sqlite_floor import make_template, open_store
    from steps import UNLIMITED, make_agent

    if not Path(pydantic_ai_steps.__file__).is_relative_to(root):
        raise SystemExit(f'imported {pydantic_ai_steps.__file__}, not the package under {root}')
    with tempfile.TemporaryDirectory(prefix='hooks-ab-') as scratch:
        directory = Path(scratch)
        template = await make_template(directory)

        async def per_step_ms(steps: int, index: int) -> float:
            database = directory / f'run-{index}.db'
            shutil.copyfile(template, database)
            store = open_store(database, durable=False)
            capability = TimedStepPersistence(store=store, agent_name='bench')
            gc.collect()
            await make_agent(steps, [capability]).run('go', usage_limits=UNLIMITED)
            store.close()
            return capability.clock.seconds / steps * 1e3

        await per_step_ms(20, 0)
        timed: dict[int, list[float]] = {}
        for steps, runs in RUNS.items():
            timed[steps] = [await per_step_ms(steps, steps * 10 + run) for run in range(runs)]
    print(json.dumps(timed))


def worktree(revision: str, into: Path) -> Path:
    path = into / revision.replace('/', '-')
    subprocess.run(['git', '-C', str(CHECKOUT), 'worktree', 'add', '--detach', str(path), revision], check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('base', help='the revision to compare against')
    parser.add_argument('head', nargs='?', help='the other revision (default: this checkout as it is)')
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--child', type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        asyncio.run(child(args.child))
        return
    scratch = Path(tempfile.mkdtemp(prefix='hooks-ab-'))
    sides: dict[str, Path] = {}
    try:
        sides[args.base] = worktree(args.base, scratch)
        sides[args.head or 'working tree'] = worktree(args.head, scratch) if args.head else CHECKOUT
        timed = {name: {steps: list[float]() for steps in RUNS} for name in sides}
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for name in order:
                command = [sys.executable, __file__, args.base, '--child', str(sides[name])]
                output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                for steps, values in json.loads(output.splitlines()[-1]).items():
                    timed[name][int(steps)] += values
            medians = ', '.join(
                f'{name}: ' + ' / '.join(f'{statistics.median(values):.3f}' for values in by_steps.values())
                for name, by_steps in timed.items()
            )
            print(f'round {round_index + 1}: ms a step inside the hooks @{" / @".join(map(str, RUNS))}: {medians}')
    finally:
        for path in sides.values():
            if path != CHECKOUT:
                subprocess.run(['git', '-C', str(CHECKOUT), 'worktree', 'remove', '--force', str(path)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
    main()
