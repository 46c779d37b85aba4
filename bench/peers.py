"""Per-step cost of persistence against the peers a user may pick, with the floor, in one run.

    uv run python bench/peers.py                      # 100 and 400 steps, three rounds
    uv run python bench/peers.py --given-usage        # the model reports its usage (see below)
    PEERS_OA_PYTHON=/tmp/venv-oa/bin/python PEERS_LG_PYTHON=/tmp/venv-lg/bin/python \\
        uv run python bench/peers.py --rounds 3

The workload is `bench/steps.py`'s: a `FunctionModel` calling a tool that returns 2 KB, `steps`
model requests (`steps - 1` tool cycles, then a text answer). With `--given-usage` the model
reports a usage, so `FunctionModel` does not estimate one by splitting every message of the history
at each request (the peers' scripted models estimate nothing). The peers run the same workload in
`bench/peers/` (`oa_bench.py`: the OpenAI Agents SDK's `SQLiteSession`; `lg_bench.py`:
LangGraph's `AsyncSqliteSaver`), each as a subprocess of the interpreter of its own virtualenv
(`--oa-python` / `PEERS_OA_PYTHON`, `--lg-python` / `PEERS_LG_PYTHON`; a peer whose interpreter is
not given or does not exist is skipped with a note). The peers stay up for the whole invocation and
answer one run per request, so their runs alternate with ours.

Each round runs every configuration once at each step count, in an order rotated from round to
round. Every persisted run is paired with a run of the same framework without persistence just
before it, and its overhead per step is `(persisted - plain) / steps`; the table shows the median
over the rounds and the spread (min-max).

Rows (SQLite everywhere: WAL, a file in a fresh temporary directory):

- ours: `SqliteStepStore(durable=False)` (`synchronous=NORMAL`) and `durable=True` (`FULL`); the
  store is opened before the run (as the session is), on a database that already has the schema.
- OpenAI Agents `SQLiteSession`: its default (`FULL`), and `synchronous=NORMAL`.
- LangGraph `AsyncSqliteSaver`, its default `durability="async"`.
- the floor, measured in the same rounds: (a) an empty capability overriding exactly the hooks
  `StepPersistence` overrides (pydantic-ai's own dispatch), (b) the SQL ours issues for the run
  (captured from a run of ours with a recording connection, texts and all), replayed on a raw
  `sqlite3` connection to a database with the same schema in the same `synchronous` mode,
  (c) serializing only each cycle's two new messages with pydantic-ai's `ModelMessagesTypeAdapter`.
  `floor = a + b + c`.
- one commit alone: a one-row insert committed on its own, `FULL` and `NORMAL` (the durable target
  allows ours the session's cost plus one fsync'd commit).
- the floor inside the agent (`inside_hooks.FloorHooks`): (b) and (c) done at the points where ours
  writes, inside running agents, where every cache is cold again after pydantic-ai's own step.

A last table gives the time spent inside the persistence layer per step, without the noise of two
whole runs: inside the hooks (the tool's own time left out) for ours
(`inside_hooks.TimedStepPersistence`) and for the floor inside the agent, and inside the SDK's
session work for the session (`oa_bench.SessionClock`: converting, fingerprinting and adding each
turn's items, its commit on a worker thread, the runner's pass over the run's items before each
save, and the history read when a run starts); with the
ratios of ours to each. Ours leaves pydantic-ai's dispatch of its hooks out (row (a)).

Each target is judged as the issue sets it: ours against the session (at `FULL`, plus one fsync'd
commit); where that lies below the floor inside the agent, the verdict also says so and judges ours
against 1.3x that floor instead.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage

from inside_hooks import EmptyHooks, FloorHooks, FloorState, TimedStepPersistence
from pydantic_ai_steps import StepPersistence
from sqlite_floor import (
    Statement,
    describe_cycle,
    make_template,
    one_commit,
    open_store,
    raw_connection,
    record_store,
    replay,
    serialize_cycles,
    transactions,
)
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

HERE = Path(__file__).resolve().parent
STEPS = (100, 400)

HOOKS = (
    'for_run',
    'wrap_run',
    'before_run',
    'after_run',
    'on_run_error',
    'before_model_request',
    'after_model_request',
    'on_model_request_error',
    'wrap_tool_execute',
    'after_node_run',
)


def overridden_hooks(cls: type) -> set[str]:
    """The public instance methods of `AbstractCapability` that `cls` overrides (`from_spec` aside)."""
    found: set[str] = set()
    for name in dir(AbstractCapability):
        if name.startswith('_') or name in ('from_spec', 'combine', 'get_serialization_name'):
            continue
        base: object = getattr(AbstractCapability, name)
        if callable(base) and getattr(cls, name) is not base:
            found.add(name)
    return found


def check_same_hooks() -> None:
    ours, empty = overridden_hooks(StepPersistence), overridden_hooks(EmptyHooks)
    if ours != empty or ours != set(HOOKS):
        raise SystemExit(f'EmptyHooks must override the hooks StepPersistence overrides: ours {ours}, empty {empty}')


# --- the peers ------------------------------------------------------------------------------


class Peer:
    """A peer's benchmark script serving runs over its stdin/stdout, in its own virtualenv."""

    def __init__(self, label: str, python: str, script: Path) -> None:
        self.label = label
        self.process = subprocess.Popen(
            [python, str(script), '--serve'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        ready = self._read()
        if not ready.get('ready'):
            raise SystemExit(f'{label}: unexpected first line {ready!r}')

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f'{self.label}: the peer process ended (exit {self.process.wait()})')
        return cast(dict[str, Any], json.loads(line))

    def run(self, kind: str, steps: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({'kind': kind, 'steps': steps}) + '\n')
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


# --- the rounds -----------------------------------------------------------------------------


Series = dict[tuple[str, int], list[float]]


@dataclass
class Results:
    overhead: Series = field(default_factory=Series)
    """(row, steps) -> wall seconds per step, one value per round."""
    cpu: Series = field(default_factory=Series)
    """(row, steps) -> CPU seconds of the process (all its threads) per step, one value per round."""
    own: Series = field(default_factory=Series)
    """(framework, steps) -> the plain run's wall seconds per step."""
    inside: Series = field(default_factory=Series)
    """(row, steps) -> seconds inside the persistence layer per step: a capability's hooks (the tool's
    own time left out), the OpenAI Agents SDK's session work (`oa_bench.SessionClock`)."""
    notes: list[str] = field(default_factory=list[str])

    def add(self, row: str, steps: int, value: float, cpu: float | None = None, inside: float | None = None) -> None:
        self.overhead.setdefault((row, steps), []).append(value)
        if cpu is not None:
            self.cpu.setdefault((row, steps), []).append(cpu)
        if inside is not None:
            self.inside.setdefault((row, steps), []).append(inside)

    def add_own(self, framework: str, steps: int, value: float) -> None:
        self.own.setdefault((framework, steps), []).append(value)


OURS_NORMAL = 'ours, `SqliteStepStore` (WAL, `synchronous=NORMAL`)'
OURS_FULL = 'ours, `durable=True` (`FULL`)'
OA_FULL = 'OpenAI Agents `SQLiteSession`, its default `FULL`'
OA_NORMAL = 'the same with `synchronous=NORMAL`'
LG = 'LangGraph `AsyncSqliteSaver` (default `durability="async"`)'
EMPTY = '(a) empty capability, the same hooks (dispatch)'
RAW_NORMAL = "(b) raw `sqlite3`, ours' statements, `NORMAL`"
RAW_FULL = "(b) raw `sqlite3`, ours' statements, `FULL`"
SERIALIZE = "(c) serializing each cycle's new messages"
FLOOR_NORMAL = 'floor `NORMAL` = a + b + c'
FLOOR_FULL = 'floor `FULL` = a + b + c'
COMMIT_FULL = 'one commit alone, `FULL` (per commit)'
COMMIT_NORMAL = 'one commit alone, `NORMAL` (per commit)'
OURS_MINUS_EMPTY = 'ours `NORMAL` minus (a)'
FLOOR_INSIDE_NORMAL = "floor inside the agent, `NORMAL`: ours' transactions and (c) at ours' write points"
FLOOR_INSIDE_FULL = "floor inside the agent, `FULL`: ours' transactions and (c) at ours' write points"
OURS_FULL_MINUS_EMPTY = 'ours `FULL` minus (a)'


@dataclass
class Bench:
    scratch: Path
    template: Path
    captured: dict[int, list[list[Statement]]]
    histories: dict[int, list[ModelMessage]]
    peers: dict[str, Peer]
    given_usage: bool = False
    """The model reports its usage (`steps.make_agent`): no estimate over the history at each request."""
    results: Results = field(default_factory=Results)
    counter: int = 0

    def fresh_database(self) -> Path:
        self.counter += 1
        directory = self.scratch / f'run-{self.counter}'
        directory.mkdir()
        path = directory / 'steps.db'
        shutil.copyfile(self.template, path)
        return path

    async def plain(self, steps: int) -> tuple[float, float]:
        elapsed = await timed_run(make_agent(steps, [], given_usage=self.given_usage))
        self.results.add_own('pydantic-ai', steps, elapsed[0] / steps)
        return elapsed

    async def ours(self, steps: int, order: int) -> None:
        configs: list[tuple[str, Callable[[], tuple[list[Any], Callable[[], float | None], Callable[[], None]]]]] = [
            (EMPTY, lambda: ([EmptyHooks()], lambda: None, lambda: None)),
            (OURS_NORMAL, lambda: self._persisted(durable=False)),
            (OURS_FULL, lambda: self._persisted(durable=True)),
            (FLOOR_INSIDE_NORMAL, lambda: self._floor_inside(steps, durable=False)),
            (FLOOR_INSIDE_FULL, lambda: self._floor_inside(steps, durable=True)),
        ]
        for label, build in rotated(configs, order):
            base, base_cpu = await self.plain(steps)
            capabilities, inside, close = build()
            elapsed, cpu = await timed_run(make_agent(steps, capabilities, given_usage=self.given_usage))
            close()
            seconds = inside()
            per_step = seconds / steps if seconds is not None else None
            self.results.add(label, steps, (elapsed - base) / steps, (cpu - base_cpu) / steps, per_step)

    def _persisted(self, *, durable: bool) -> tuple[list[Any], Callable[[], float | None], Callable[[], None]]:
        store = open_store(self.fresh_database(), durable=durable)
        capability = TimedStepPersistence(store=store, agent_name='bench')

        def close() -> None:
            store.close()
            shutil.rmtree(Path(cast(str, store.database)).parent, ignore_errors=True)

        return [capability], lambda: capability.clock.seconds, close

    def _floor_inside(
        self, steps: int, *, durable: bool
    ) -> tuple[list[Any], Callable[[], float | None], Callable[[], None]]:
        path = self.fresh_database()
        state = FloorState(raw_connection(path, durable=durable), self.captured[steps])

        def close() -> None:
            state.connection.close()
            shutil.rmtree(path.parent, ignore_errors=True)

        return [FloorHooks(floor=state)], lambda: state.clock.seconds, close

    def floor(self, steps: int) -> None:
        for durable, label in ((False, RAW_NORMAL), (True, RAW_FULL)):
            path = self.fresh_database()
            conn = raw_connection(path, durable=durable)
            elapsed, cpu = replay(conn, self.captured[steps])
            conn.close()
            shutil.rmtree(path.parent, ignore_errors=True)
            self.results.add(label, steps, elapsed / steps, cpu / steps)
        elapsed, cpu = serialize_cycles(self.histories[steps])
        self.results.add(SERIALIZE, steps, elapsed / steps, cpu / steps)
        self.results.add(COMMIT_FULL, steps, one_commit(self.scratch, durable=True))
        self.results.add(COMMIT_NORMAL, steps, one_commit(self.scratch, durable=False))

    def peer(self, name: str, steps: int) -> None:
        peer = self.peers[name]
        configs = [('sqlite', OA_FULL), ('sqlite-normal', OA_NORMAL)] if name == 'oa' else [('sqlite', LG)]
        for kind, label in configs:
            plain = peer.run('none', steps)
            self.results.add_own(name, steps, plain['t'] / steps)
            found = peer.run(kind, steps)
            inside = found['inside'] / steps if 'inside' in found else None
            self.results.add(
                label, steps, (found['t'] - plain['t']) / steps, (found['cpu'] - plain['cpu']) / steps, inside
            )
            note = f'{name} {kind}: synchronous={found.get("synchronous")}, journal_mode={found.get("journal_mode")}'
            if note not in self.results.notes:
                self.results.notes.append(note)


def rotated(items: Sequence[Any], by: int) -> list[Any]:
    by %= len(items)
    return [*items[by:], *items[:by]]


async def timed_run(agent: Agent[None, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the process's, all threads) of one run."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    await agent.run('go', usage_limits=UNLIMITED)
    return time.perf_counter() - start, time.process_time() - cpu


async def capture(
    scratch: Path, template: Path, steps: int, *, given_usage: bool = False
) -> tuple[list[list[Statement]], list[ModelMessage]]:
    """The SQL one run of ours issues (recorded, not timed), and the run's final history."""
    directory = scratch / f'capture-{steps}'
    directory.mkdir()
    path = directory / 'steps.db'
    shutil.copyfile(template, path)
    store = open_store(path, durable=False)
    recorder = record_store(store)
    agent = make_agent(steps, [StepPersistence(store=store, agent_name='bench')], given_usage=given_usage)
    result = await agent.run('go', usage_limits=UNLIMITED)
    store.close()
    shutil.rmtree(directory, ignore_errors=True)
    return transactions(recorder.log), result.all_messages()


# --- report ---------------------------------------------------------------------------------


def summary(values: Sequence[float] | None) -> tuple[float | None, str]:
    if not values:
        return None, '-'
    median = statistics.median(values)
    if len(values) == 1:
        return median, f'{median * 1000:.2f} ms'
    return median, f'{median * 1000:.2f} ms ({min(values) * 1000:.2f}-{max(values) * 1000:.2f})'


def derived(series: Series) -> None:
    """Rows computed per round from the measured ones (a + b + c; ours minus a)."""
    for steps in STEPS:

        def get(row: str, steps: int = steps) -> list[float]:
            return series.get((row, steps), [])

        for floor, raw in ((FLOOR_NORMAL, RAW_NORMAL), (FLOOR_FULL, RAW_FULL)):
            for a, b, c in zip(get(EMPTY), get(raw), get(SERIALIZE), strict=False):
                series.setdefault((floor, steps), []).append(a + b + c)
        for row, ours in ((OURS_MINUS_EMPTY, OURS_NORMAL), (OURS_FULL_MINUS_EMPTY, OURS_FULL)):
            for value, empty in zip(get(ours), get(EMPTY), strict=False):
                series.setdefault((row, steps), []).append(value - empty)


ROWS = (
    OURS_NORMAL,
    OURS_FULL,
    OA_FULL,
    OA_NORMAL,
    LG,
    EMPTY,
    RAW_NORMAL,
    RAW_FULL,
    SERIALIZE,
    FLOOR_NORMAL,
    FLOOR_FULL,
    COMMIT_FULL,
    COMMIT_NORMAL,
    OURS_MINUS_EMPTY,
    OURS_FULL_MINUS_EMPTY,
    FLOOR_INSIDE_NORMAL,
    FLOOR_INSIDE_FULL,
)


def table(series: Series) -> dict[tuple[str, int], float | None]:
    """Print one markdown table of `series`; return its medians."""
    medians: dict[tuple[str, int], float | None] = {}
    print('| | @100 steps | @400 steps | 400 vs 100 |')
    print('|---|---|---|---|')
    for row in ROWS:
        cells: list[str] = []
        for steps in STEPS:
            median, text = summary(series.get((row, steps)))
            medians[row, steps] = median
            cells.append(text)
        if all(cell == '-' for cell in cells):
            continue
        low, high = medians[row, 100], medians[row, 400]
        growth = f'{high / low:.2f}x' if low and high is not None and low > 0 else '-'
        print(f'| {row} | {cells[0]} | {cells[1]} | {growth} |')
    return medians


def report(results: Results, rounds: int, load: list[tuple[float, float, float]]) -> None:
    derived(results.overhead)
    derived(results.cpu)
    print()
    print(f'Overhead per step (wall clock), median of {rounds} rounds (min-max); one commit alone: per commit.')
    print()
    medians = table(results.overhead)
    print()
    own = ', '.join(
        f'{name} {summary(results.own.get((name, steps)))[1].split(" (")[0]}/step@{steps}'
        for name in ('pydantic-ai', 'oa', 'lg')
        for steps in STEPS
        if results.own.get((name, steps))
    )
    print(f'Each framework alone (median of its plain runs): {own}.')
    for note in results.notes:
        print(f'- {note}')
    print(
        '- load average (1 min) at the start of each round: '
        + ', '.join(f'{one:.1f}' for one, _, _ in load)
        + f' on {os.cpu_count()} cores'
    )
    print()
    targets(medians)
    print()
    print('The same in CPU time of the process (all its threads; waits for the disk not included):')
    print()
    table(results.cpu)
    print()
    print(
        "Time inside the persistence layer per step, median (min-max): the capability's hooks (the tool's "
        "own time left out); the SDK's session work (`oa_bench.SessionClock`)"
    )
    print()
    inside(table(results.inside), medians)


FLOOR_RATIO = 1.3
"""What the issue allows ours over the floor where a target lies below the floor itself."""


def verdict(ours: float, target: float, floor: float | None, *, with_ratio: bool = False) -> str:
    """`met` or `missed` against `target`. Where the target is below the floor inside the agent, also
    against `FLOOR_RATIO` times that floor, saying so; else ours over that floor when `with_ratio`.
    A floor at or below zero is noise, and judges nothing."""
    plain = 'met' if ours <= target else 'missed'
    if floor is None or floor <= 0:
        return plain
    ratio = ours / floor
    if target < floor:
        judged = 'met' if ratio <= FLOOR_RATIO else 'missed'
        return (
            f'{plain}; the target is below the floor inside the agent ({floor * 1000:.2f} ms), so it becomes '
            f'<= {FLOOR_RATIO}x it: ours / that floor {ratio:.2f}x, {judged}'
        )
    return f'{plain}; ours / the floor inside the agent {ratio:.2f}x' if with_ratio else plain


def inside(m: dict[tuple[str, int], float | None], overhead: dict[tuple[str, int], float | None]) -> None:
    """Ours against the session and the floor run inside the agent, each timed inside its persistence
    layer (one fsync'd commit, allowed ours at `FULL`, from the `overhead` table). Ours leaves out
    pydantic-ai's dispatch of its hooks (row (a) there); the session pays for its own hand-off to a
    worker thread. A ratio judged against its target has three decimals: these sit near 1x."""
    print()
    for steps in STEPS:
        for ours, session, commit, floor, level in (
            (OURS_NORMAL, OA_NORMAL, None, FLOOR_INSIDE_NORMAL, 'NORMAL'),
            (OURS_FULL, OA_FULL, COMMIT_FULL, FLOOR_INSIDE_FULL, 'FULL'),
        ):
            mine, theirs, least = m.get((ours, steps)), m.get((session, steps)), m.get((floor, steps))
            if mine is None or not theirs:
                continue
            if commit is None:
                print(
                    f'- {level} @{steps}: inside, ours / the session = {mine / theirs:.3f}x (target <= 1x): '
                    f'{verdict(mine, theirs, least)}'
                )
            elif (one := overhead.get((commit, steps))) is not None:
                print(
                    f"- {level} @{steps}: inside, ours / (the session + one fsync'd commit) = "
                    f'{mine / (theirs + one):.3f}x (target <= 1x): {verdict(mine, theirs + one, least)}'
                )
    for steps in STEPS:
        for ours, floor, level in (
            (OURS_NORMAL, FLOOR_INSIDE_NORMAL, 'NORMAL'),
            (OURS_FULL, FLOOR_INSIDE_FULL, 'FULL'),
        ):
            mine, least = m.get((ours, steps)), m.get((floor, steps))
            if mine is not None and least:
                print(f'- {level} @{steps}: inside the hooks, ours / the floor inside the agent = {mine / least:.2f}x')
    low, high = m.get((OURS_NORMAL, 100)), m.get((OURS_NORMAL, 400))
    if low and high is not None:
        growth = 'met' if high / low <= 1.1 else 'missed'
        floor_low, floor_high = m.get((FLOOR_INSIDE_NORMAL, 100)), m.get((FLOOR_INSIDE_NORMAL, 400))
        # The floor's writes are the same at every step: what it grows by, the process does to any work.
        floor = f'; the floor inside the agent: {floor_high / floor_low:.2f}x' if floor_low and floor_high else ''
        print(
            f'- ours NORMAL inside the hooks (no dispatch in it), 400 vs 100: {high / low:.3f}x '
            f'(target <= 1.1x): {growth}{floor}'
        )


def targets(m: dict[tuple[str, int], float | None]) -> None:
    def ms(value: float | None) -> str:
        return '-' if value is None else f'{value * 1000:.2f}'

    print('Targets (medians of this run):')
    for steps in STEPS:
        ours, session = m.get((OURS_NORMAL, steps)), m.get((OA_NORMAL, steps))
        floor = m.get((FLOOR_INSIDE_NORMAL, steps))
        if ours is not None and session is not None:
            judged = verdict(ours, session, floor, with_ratio=True)
            print(f'- NORMAL @{steps}: ours {ms(ours)} vs session {ms(session)} ms: {judged}')
        ours, session, commit = m.get((OURS_FULL, steps)), m.get((OA_FULL, steps)), m.get((COMMIT_FULL, steps))
        floor = m.get((FLOOR_INSIDE_FULL, steps))
        if ours is not None and session is not None and commit is not None:
            allowed = session + commit
            print(
                f"- FULL @{steps}: ours {ms(ours)} vs session + one fsync'd commit "
                f'{ms(session)} + {ms(commit)} = {ms(allowed)} ms: {verdict(ours, allowed, floor, with_ratio=True)}'
            )
    low, high = m.get((OURS_MINUS_EMPTY, 100)), m.get((OURS_MINUS_EMPTY, 400))
    if low and high is not None:
        growth = 'met' if high / low <= 1.1 else 'missed'
        print(f'- ours NORMAL minus dispatch, 400 vs 100: {high / low:.2f}x (target <= 1.1x): {growth}')


# --- main -----------------------------------------------------------------------------------


def start_peers(args: argparse.Namespace) -> dict[str, Peer]:
    peers: dict[str, Peer] = {}
    for name, python, script in (('oa', args.oa_python, 'oa_bench.py'), ('lg', args.lg_python, 'lg_bench.py')):
        if not python:
            print(f'{name}: no interpreter given (--{name}-python or PEERS_{name.upper()}_PYTHON): skipped')
            continue
        if not Path(python).exists():
            print(f'{name}: {python} does not exist: skipped')
            continue
        peers[name] = Peer(name, python, HERE / 'peers' / script)
    return peers


def groups_for(bench: Bench) -> list[str]:
    return ['ours', 'floor', *bench.peers]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--oa-python', default=os.environ.get('PEERS_OA_PYTHON'))
    parser.add_argument('--lg-python', default=os.environ.get('PEERS_LG_PYTHON'))
    parser.add_argument('--show-cycle', action='store_true', help='print the statements of one tool cycle')
    parser.add_argument(
        '--given-usage',
        action='store_true',
        help="the model reports its usage, so pydantic-ai's test model estimates none over the history",
    )
    args = parser.parse_args()
    check_same_hooks()
    peers = start_peers(args)
    load: list[tuple[float, float, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix='peers-bench-') as scratch_name:
            scratch = Path(scratch_name)
            template = await make_template(scratch)
            captured: dict[int, list[list[Statement]]] = {}
            histories: dict[int, list[ModelMessage]] = {}
            for steps in STEPS:
                captured[steps], histories[steps] = await capture(
                    scratch, template, steps, given_usage=args.given_usage
                )
            if args.show_cycle:
                print('\n'.join(describe_cycle(captured[100], 100)))
            bench = Bench(scratch, template, captured, histories, peers, given_usage=args.given_usage)
            for steps in STEPS:  # warm-up
                await bench.ours(steps, 0)
            bench.results = Results()
            for round_index in range(args.rounds):
                load.append(os.getloadavg())
                for steps in STEPS:
                    for group in rotated(groups_for(bench), round_index):
                        if group == 'ours':
                            await bench.ours(steps, round_index)
                        elif group == 'floor':
                            bench.floor(steps)
                        else:
                            bench.peer(group, steps)
                print(f'round {round_index + 1} of {args.rounds} done', file=sys.stderr)
            report(bench.results, args.rounds, load)
    finally:
        for peer in peers.values():
            peer.close()


if __name__ == '__main__':
    asyncio.run(main())
