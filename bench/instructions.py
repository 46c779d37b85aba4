"""Instructions a step of ours costs, counted by valgrind, and what each part of it accounts for.

    uv run python bench/instructions.py                          # ours, minus the empty capability
    uv run python bench/instructions.py --without snapshot events sql prepare
    PEERS_OA_PYTHON=/tmp/venv-oa/bin/python uv run python bench/instructions.py --peers

Timings inside running agents move by 10-20% between runs on a shared machine; an instruction
count does not move at all (`PYTHONHASHSEED=0`, the same workload), so it ranks a change of a few
percent that no timing can. It is a proxy: it counts no cache miss, no syscall and no fsync, so
SQL weighs less here than in time, and Python more.

Each count is a child process under `valgrind --tool=cachegrind` running `bench/steps.py`'s agent
(`SqliteStepStore`, `NORMAL`) once and three times after a warm-up; the difference over two runs
and the steps is what one step costs, start-up and imports left out. The empty capability
(`inside_hooks.EmptyHooks`: pydantic-ai's dispatch of our hooks) is counted the same way and taken
off. `--without PART` counts ours again with one part taken away (`PARTS`), so the difference is
what that part costs per step, its SQL included. Needs valgrind on the PATH.

`--peers` counts, the same way, pydantic-ai alone (no capability), the floor inside the agent
(`inside_hooks.FloorHooks`: the transactions a run of ours issued, replayed on a raw connection at
ours' write points, and each cycle's new messages serialized) and, given the interpreter of a
virtualenv with `openai-agents`, that SDK alone and with its `SQLiteSession` at `synchronous=NORMAL`
(`bench/peers/oa_bench.py --count`). No fsync happens at `NORMAL`; the count leaves out cache misses
and the time of system calls, and moves by about 1% from one invocation to the next: the comparison
`bench/peers.py` makes in time, without the noise of whole runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inside_hooks import EmptyHooks, FloorHooks, FloorState
from peers import capture
from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import SqliteStepStore
from sqlite_floor import Statement, make_template, raw_connection
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

# --- parts that can be taken away (in the child) -----------------------------------------------


def _module(name: str) -> Any:
    """A module of the package, private ones included (this script patches their internals)."""
    return importlib.import_module(f'pydantic_ai_steps.{name}')


def _no_snapshot() -> None:
    """No snapshot is written (its ledger entries and events then go with the next `started` write)."""

    async def save(*args: Any, **kwargs: Any) -> None:
        del args, kwargs

    _module('capability._snapshots').Snapshots.save = save


def _no_events() -> None:
    """No per-step event is recorded (the run's opening and closing ones still are)."""
    from pydantic_ai_steps.step_persistence import ToolEffectRecord

    persistence, writers = _module('capability._persistence'), _module('capability._writers')
    record = persistence.StepPersistence._record

    async def only_opening_and_closing(self: Any, ctx: Any, kind: str, **kwargs: Any) -> None:
        if kind in ('run_started', 'run_completed', 'run_failed'):
            await record(self, ctx, kind, **kwargs)

    async def ledger_entry_alone(self: Any, ctx: Any, run_id: str, call_id: str, name: str, event: Any) -> None:
        entry = ToolEffectRecord(
            tool_call_id=call_id, tool_name=name, run_id=run_id, status='started', started_at=event.timestamp
        )
        self._open[call_id] = entry
        await self._write(ctx, tool_effects=[entry], close_entries=False)

    persistence.StepPersistence._record = only_opening_and_closing
    writers.BatchingWriter.tool_started = ledger_entry_alone


def _no_sql() -> None:
    """The backend's commits run no SQL (a snapshot's log simply grows by its appends)."""
    ends: dict[str, int] = {}

    def commit(self: Any, conn: Any, batch: Any) -> int | None:
        del self, conn
        if batch.snapshot is None:
            return None
        run_id = batch.snapshot.run_id
        ends[run_id] = ends.get(run_id, 0) + len(batch.snapshot.appends)
        return ends[run_id]

    _module('store.backends.sqlite._backend').SqliteBackend._commit = commit


def _no_prepare() -> None:
    """The message log prepares nothing: a snapshot appends no message (nor any SQL for one)."""
    message_log = _module('store.message_log')

    async def prepare(self: Any, snapshot: Any) -> Any:
        del self
        return message_log.PreparedSnapshot(snapshot, [], len(snapshot.messages), None, None, {}, {})

    def committed(*args: Any) -> None:
        del args

    message_log.MessageLog.prepare = prepare
    message_log.MessageLog.committed = committed


PARTS: dict[str, Callable[[], None]] = {
    'snapshot': _no_snapshot,
    'events': _no_events,
    'sql': _no_sql,
    'prepare': _no_prepare,
}


# --- the child: one process, counted whole ---------------------------------------------------


async def child(mode: str, runs: int, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix='instructions-') as scratch:
        store = SqliteStepStore(database=Path(scratch) / 'steps.db')
        floor = await FloorRuns.captured(Path(scratch), {3, steps}) if mode == 'floor' else None

        def capabilities(steps_of_run: int) -> list[Any]:
            if mode == 'plain':
                return []
            if mode == 'empty':
                return [EmptyHooks()]
            if floor is not None:
                return floor.hooks(steps_of_run)
            return [StepPersistence(store=store, agent_name='bench')]

        await make_agent(3, capabilities(3)).run('go', usage_limits=UNLIMITED)  # warm-up
        for _ in range(runs):
            await make_agent(steps, capabilities(steps)).run('go', usage_limits=UNLIMITED)
        await store.aclose()
        if floor is not None:
            floor.close()


COUNTED_RUNS = (1, 3)
"""The runs of the two processes counted for each figure: their difference is what runs cost."""


@dataclass
class FloorRuns:
    """The floor inside the agent (`inside_hooks.FloorHooks`): the transactions a run of ours issued,
    replayed on a raw connection at ours' write points, and the cycle's new messages serialized.

    Each run needs a database of its own (the replayed rows would clash), and a connection to it
    is no part of the floor, as ours opens its store once: every process opens as many as the
    longest counted one uses, before its first run, so they cancel out of the difference.
    """

    transactions: dict[int, list[list[Statement]]]
    """Those of a run of ours, by its step count."""
    connections: list[sqlite3.Connection]
    used: int = 0

    @classmethod
    async def captured(cls, scratch: Path, step_counts: set[int]) -> FloorRuns:
        template = await make_template(scratch)
        transactions = {steps: (await capture(scratch, template, steps))[0] for steps in step_counts}
        connections: list[sqlite3.Connection] = []
        for run in range(1 + max(COUNTED_RUNS)):  # the warm-up and the runs
            directory = scratch / f'floor-{run}'
            directory.mkdir()
            shutil.copyfile(template, directory / 'steps.db')
            connections.append(raw_connection(directory / 'steps.db', durable=False))
        return cls(transactions, connections)

    def hooks(self, steps: int) -> list[Any]:
        self.used += 1
        return [FloorHooks(floor=FloorState(self.connections[self.used - 1], self.transactions[steps]))]

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


# --- the parent: counts and differences -------------------------------------------------------


def count(mode: str, runs: int, steps: int, oa_python: str | None = None) -> int:
    """Instructions of one child process: ours (this script), or a peer's (`oa-KIND`: `oa_bench.py --count`)."""
    if mode.startswith('oa-'):
        assert oa_python is not None
        kind = mode.removeprefix('oa-')
        program = [oa_python, str(OA_BENCH), '--count', kind, str(runs), str(steps), str(max(COUNTED_RUNS))]
    else:
        program = [sys.executable, str(Path(__file__).resolve()), '--child', mode, str(runs), str(steps)]
    command = ['valgrind', '--tool=cachegrind', '--cache-sim=no', '--cachegrind-out-file=/dev/null', *program]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, 'PYTHONHASHSEED': '0'})
    found = re.search(r'I\s+refs:\s+([\d,]+)', done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f'{mode}: valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}')
    return int(found.group(1).replace(',', ''))


OA_BENCH = Path(__file__).resolve().parent / 'peers' / 'oa_bench.py'


def per_step(counts: dict[tuple[str, int], int], mode: str, steps: int) -> float:
    fewer, more = COUNTED_RUNS
    return (counts[mode, more] - counts[mode, fewer]) / (more - fewer) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--steps', type=int, default=40, help='steps per counted run (default 40)')
    parser.add_argument('--without', nargs='*', default=[], choices=sorted(PARTS), help='parts to take away')
    parser.add_argument(
        '--peers', action='store_true', help='also count pydantic-ai alone, the floor, and the OpenAI Agents session'
    )
    parser.add_argument(
        '--oa-python',
        default=os.environ.get('PEERS_OA_PYTHON'),
        help='the interpreter of a virtualenv with openai-agents (default: $PEERS_OA_PYTHON)',
    )
    parser.add_argument('--jobs', type=int, default=2, help='valgrind processes at once (default 2)')
    parser.add_argument('--child', nargs=3, metavar=('MODE', 'RUNS', 'STEPS'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, runs, steps = args.child
        if mode.startswith('without-'):
            PARTS[mode.removeprefix('without-')]()
        asyncio.run(child(mode, int(runs), int(steps)))
        return
    if shutil.which('valgrind') is None:
        raise SystemExit('valgrind is not on the PATH: this benchmark counts instructions with cachegrind')
    parts: list[str] = args.without
    steps: int = args.steps
    oa_python: str | None = args.oa_python if args.peers else None
    if oa_python is not None and not Path(oa_python).is_file():
        raise SystemExit(f'--oa-python {oa_python!r} is not a file: give the python of a virtualenv with openai-agents')
    modes = ['empty', 'ours', *(f'without-{part}' for part in parts)]
    if args.peers:
        modes += ['plain', 'floor', *(['oa-none', 'oa-sqlite-normal'] if oa_python else [])]
    jobs = [(mode, runs) for mode in modes for runs in COUNTED_RUNS]

    def counted(job: tuple[str, int]) -> int:
        return count(*job, steps, oa_python)

    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(counted, jobs))
    counts = dict(zip(jobs, found, strict=True))
    empty = per_step(counts, 'empty', steps)
    ours = per_step(counts, 'ours', steps) - empty
    print(f'{steps} steps a run; instructions a step, the empty capability ({empty / 1e6:.3f} M) taken off:')
    print(f'  ours                   {ours / 1e6:7.3f} M')
    for part in parts:
        without = per_step(counts, f'without-{part}', steps) - empty
        share = (ours - without) / ours
        print(f'  without {part:<14} {without / 1e6:7.3f} M   ({part}: {(ours - without) / 1e6:.3f} M, {share:.0%})')
    if args.peers:
        report_peers(counts, steps, empty, oa_python is not None)


def report_peers(counts: dict[tuple[str, int], int], steps: int, empty: float, with_oa: bool) -> None:
    """Ours against the floor inside the agent and the OpenAI Agents session, `NORMAL` (no fsync to leave out)."""
    plain = per_step(counts, 'plain', steps)
    ours = per_step(counts, 'ours', steps)
    floor = per_step(counts, 'floor', steps) - empty
    print(f'\nAgainst the floor and the peers, instructions a step (pydantic-ai alone: {plain / 1e6:.3f} M):')
    print(f'  the empty capability minus pydantic-ai alone (dispatch)             {(empty - plain) / 1e6:7.3f} M')
    print(f'  ours minus pydantic-ai alone (its dispatch of our hooks included)   {(ours - plain) / 1e6:7.3f} M')
    print(f'  ours minus the empty capability                                     {(ours - empty) / 1e6:7.3f} M')
    print(f'  the floor inside the agent, minus the empty capability              {floor / 1e6:7.3f} M')
    print(f'  ours / the floor inside the agent                                   {(ours - empty) / floor:7.2f}x')
    if not with_oa:
        print('  the OpenAI Agents session: no interpreter given (--oa-python or PEERS_OA_PYTHON): skipped')
        return
    alone = per_step(counts, 'oa-none', steps)
    session = per_step(counts, 'oa-sqlite-normal', steps) - alone
    print(f'  OpenAI Agents alone                                                 {alone / 1e6:7.3f} M')
    print(f'  its SQLiteSession (synchronous=NORMAL) minus the SDK alone           {session / 1e6:7.3f} M')
    print(f'  ours minus pydantic-ai alone / the session                          {(ours - plain) / session:7.2f}x')


if __name__ == '__main__':
    main()
