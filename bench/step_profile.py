"""Where a step of ours goes, measured inside running agents: hooks, store calls, SQL, GC.

    uv run python bench/step_profile.py                 # 100 and 400 steps, three rounds
    uv run python bench/step_profile.py --cprofile      # also cProfile runs: what grows per step

The workload is `bench/steps.py`'s (`SqliteStepStore`, `durable=False` unless `--durable`). Each
round runs, at each step count: the plain agent, the empty capability (`bench/peers.py`'s
`inside_hooks.EmptyHooks`: pydantic-ai's dispatch of our hooks), ours as shipped, and ours with perf_counter
wrappers installed by this script around the capability's hooks (time spent inside the tool and
the rest of the run left out), the store's methods, the message log, the encoders and every SQL
statement (through a recording connection). Garbage collection is timed with `gc.callbacks` in
every run. All figures are per step (per model request), medians over the rounds.

The split: pydantic-ai dispatch (empty capability minus plain), capability logic (hooks minus the
store calls they make), record building and checks, encoding/serialization, history tracking,
SQL (BEGIN / statements / COMMIT as the connection saw them), offload/locks (the backend's
`commit` minus its SQL body), GC, and what is left: the rest of the run going slower beside ours.

With `--cprofile`, one run of ours and one plain run at each step count are profiled, and the
functions whose own time per step grows the most from 100 to 400 steps are listed (ours minus
plain), which is where anything on the hot path that grows with the history shows up.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any, cast

from inside_hooks import EmptyHooks
from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import SqliteStepStore
from sqlite_floor import RecordingConnection, Statement, make_template, open_store, record_store
from steps import UNLIMITED, make_agent  # the benchmark agent, from this directory

STEPS = (100, 400)

# --- timing wrappers ------------------------------------------------------------------------


@dataclass
class Clock:
    """Seconds and calls per label, for the run being measured."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    active: bool = False

    def add(self, label: str, elapsed: float) -> None:
        if self.active:
            self.seconds[label] += elapsed
            self.calls[label] += 1

    def reset(self) -> None:
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)


CLOCK = Clock()
_patches: list[tuple[Any, str, Any]] = []


def patch(owner: Any, name: str, replacement: Any) -> None:
    _patches.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
    setattr(owner, name, replacement)


def unpatch() -> None:
    while _patches:
        owner, name, original = _patches.pop()
        setattr(owner, name, original)


def time_sync(owner: Any, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    @wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            CLOCK.add(label, time.perf_counter() - start)

    patch(owner, name, timed)


def time_async(owner: Any, name: str, label: str) -> None:
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)

    @wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            CLOCK.add(label, time.perf_counter() - start)

    patch(owner, name, timed)


def time_wrapping_hook(owner: type, name: str, label: str) -> None:
    """A `wrap_*` hook: its time minus the time of the `handler` it calls (the tool, the run)."""
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)

    @wraps(original)
    async def timed(self: Any, ctx: Any, **kwargs: Any) -> Any:
        handler: Callable[..., Awaitable[Any]] = kwargs['handler']
        inner = 0.0

        async def timed_handler(*args: Any) -> Any:
            nonlocal inner
            start = time.perf_counter()
            try:
                return await handler(*args)
            finally:
                inner += time.perf_counter() - start

        kwargs['handler'] = timed_handler
        start = time.perf_counter()
        try:
            return await original(self, ctx, **kwargs)
        finally:
            CLOCK.add(label, time.perf_counter() - start - inner)

    patch(owner, name, timed)


def module(name: str) -> Any:
    return importlib.import_module(name)


def install() -> None:
    """Wrap the capability's hooks and the store's hot path (undone by `unpatch`)."""
    for hook in ('before_run', 'after_run', 'before_model_request', 'after_model_request', 'after_node_run'):
        time_async(StepPersistence, hook, f'hook {hook}')
    time_async(StepPersistence, 'for_run', 'hook for_run')
    time_wrapping_hook(StepPersistence, 'wrap_tool_execute', 'hook wrap_tool_execute')
    time_wrapping_hook(StepPersistence, 'wrap_run', 'hook wrap_run')

    base = module('pydantic_ai_steps.store.base')
    time_async(base.StepStoreBase, 'write_records', 'store write_records')
    for checker in ('checked_run', 'checked_event', 'checked_effect', 'checked_snapshot'):
        time_sync(base, checker, 'records: checks')
    codec = module('pydantic_ai_steps.store.codec')
    for encoder in ('run', 'event', 'effect', 'snapshot'):
        time_sync(codec.Encoding, encoder, f'encode: {encoder} rows')

    message_log = module('pydantic_ai_steps.store.message_log')
    time_async(message_log.MessageLog, 'prepare', 'message log: prepare')
    time_sync(message_log.MessageLog, 'committed', 'message log: committed')
    time_sync(message_log, 'message_to_json', 'encode: message_to_json')
    time_sync(message_log, 'content_digest', 'encode: sha256 digest')
    media_puts = module('pydantic_ai_steps.store._media_puts')
    time_async(media_puts.BinaryOffload, 'offload', 'message log: media offload check')
    time_async(message_log.MessageLog, '_externalize', 'message log: media offload check')
    history = module('pydantic_ai_steps.store.history')
    time_sync(history.HistoryTracker, 'delta', 'history: tracker delta')
    time_sync(history.HistoryTracker, 'commit', 'history: tracker commit')

    validity = module('pydantic_ai_steps.capability._validity')
    time_sync(validity.ProviderValidity, 'check', 'capability: validity check')
    writers = module('pydantic_ai_steps.capability._writers')
    for builder in ('event_record', 'continuable_snapshot', 'closed_entry'):
        time_sync(writers, builder, 'records: build')
    persistence = module('pydantic_ai_steps.capability._persistence')
    time_sync(persistence.StepPersistence, '_event', 'records: build')

    backend = module('pydantic_ai_steps.store.backends.sqlite._backend')
    time_async(backend.SqliteBackend, 'commit', 'backend commit')
    time_sync(backend.SqliteBackend, '_commit', 'backend commit body')
    connection = module('pydantic_ai_steps.store.backends.sqlite._connection')
    time_sync(connection.SqliteConnection, '_waiting', 'offload: on a worker thread')


def sql_label(statement: Statement) -> str:
    words = statement.sql.split()
    head = words[0].upper()
    if head in ('BEGIN', 'COMMIT', 'ROLLBACK', 'PRAGMA'):
        return f'SQL {head}'
    if head == 'INSERT':
        table = words[words.index('INTO') + 1]
        return f'SQL INSERT {table}'
    if head == 'SELECT':
        return 'SQL SELECT ' + ('runs' if 'FROM runs' in statement.sql else words[words.index('FROM') + 1])
    return f'SQL {head} {words[1] if len(words) > 1 else ""}'


# --- garbage collection ---------------------------------------------------------------------


@dataclass
class GcClock:
    seconds: float = 0.0
    collections: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    _start: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == 'start':
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[int(info['generation'])] += 1


# --- runs -----------------------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    gc_seconds: float
    gc_collections: dict[int, int]
    clock: dict[str, float] = field(default_factory=dict[str, float])
    calls: dict[str, int] = field(default_factory=dict[str, int])


async def run_once(steps: int, capabilities: list[Any], recorder: RecordingConnection | None = None) -> Sample:
    agent = make_agent(steps, capabilities)
    gc.collect()
    gc_clock = GcClock()
    gc.callbacks.append(gc_clock)
    CLOCK.reset()
    CLOCK.active = True
    start = time.perf_counter()
    try:
        await agent.run('go', usage_limits=UNLIMITED)
    finally:
        wall = time.perf_counter() - start
        CLOCK.active = False
        gc.callbacks.remove(gc_clock)
    clock = dict(CLOCK.seconds)
    calls = dict(CLOCK.calls)
    if recorder is not None:
        for statement in recorder.log:
            label = sql_label(statement)
            clock[label] = clock.get(label, 0.0) + statement.seconds
            calls[label] = calls.get(label, 0) + 1
    return Sample(wall, gc_clock.seconds, dict(gc_clock.collections), clock, calls)


@dataclass
class Profiler:
    scratch: Path
    template: Path
    durable: bool
    samples: dict[tuple[str, int], list[Sample]] = field(default_factory=dict[tuple[str, int], list[Sample]])
    counter: int = 0

    def store(self) -> SqliteStepStore:
        self.counter += 1
        directory = self.scratch / f'run-{self.counter}'
        directory.mkdir()
        shutil.copyfile(self.template, directory / 'steps.db')
        return open_store(directory / 'steps.db', durable=self.durable)

    async def round(self, steps: int) -> None:
        self._add('plain', steps, await run_once(steps, []))
        self._add('empty', steps, await run_once(steps, [EmptyHooks()]))
        store = self.store()
        self._add('ours', steps, await run_once(steps, [StepPersistence(store=store, agent_name='bench')]))
        self._close(store)
        store = self.store()
        recorder = record_store(store)
        install()
        try:
            sample = await run_once(steps, [StepPersistence(store=store, agent_name='bench')], recorder)
        finally:
            unpatch()
        self._add('instrumented', steps, sample)
        self._close(store)

    def _add(self, kind: str, steps: int, sample: Sample) -> None:
        self.samples.setdefault((kind, steps), []).append(sample)

    @staticmethod
    def _close(store: SqliteStepStore) -> None:
        store.close()
        shutil.rmtree(Path(cast(str, store.database)).parent, ignore_errors=True)


# --- report ---------------------------------------------------------------------------------

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ('capability: validity check', ('capability: validity check',)),
    ('records: build (event dicts, records)', ('records: build',)),
    ('records: checks', ('records: checks',)),
    (
        'encode: rows (events, effects, snapshot)',
        ('encode: run rows', 'encode: event rows', 'encode: effect rows', 'encode: snapshot rows'),
    ),
    ('encode: message_to_json', ('encode: message_to_json',)),
    ('encode: sha256 digest', ('encode: sha256 digest',)),
    ('message log: media offload check', ('message log: media offload check',)),
    ('history: tracker delta + commit', ('history: tracker delta', 'history: tracker commit')),
)


def per_step(samples: list[Sample], steps: int, pick: Callable[[Sample], float]) -> float:
    return statistics.median(pick(sample) for sample in samples) / steps


def breakdown(profiler: Profiler) -> None:
    lines: list[tuple[str, dict[int, float], str]] = []

    def add(label: str, values: dict[int, float], note: str = '') -> None:
        lines.append((label, values, note))

    def med(kind: str, steps: int, pick: Callable[[Sample], float]) -> float:
        return per_step(profiler.samples[kind, steps], steps, pick)

    def clock(name: str) -> Callable[[Sample], float]:
        return lambda sample: sample.clock.get(name, 0.0)

    def clocks(names: tuple[str, ...]) -> Callable[[Sample], float]:
        return lambda sample: sum(sample.clock.get(name, 0.0) for name in names)

    def prefixed(prefix: str) -> Callable[[Sample], float]:
        return lambda sample: sum(value for key, value in sample.clock.items() if key.startswith(prefix))

    hooks = prefixed('hook ')
    sql = prefixed('SQL ')
    totals: dict[str, dict[int, float]] = defaultdict(dict)
    for steps in STEPS:
        plain = med('plain', steps, lambda s: s.wall)
        totals['ours'][steps] = med('ours', steps, lambda s: s.wall) - plain
        totals['instrumented'][steps] = med('instrumented', steps, lambda s: s.wall) - plain
        totals['dispatch'][steps] = med('empty', steps, lambda s: s.wall) - plain
        totals['hooks'][steps] = med('instrumented', steps, hooks)
        totals['store'][steps] = med('instrumented', steps, clock('store write_records'))
        totals['commit'][steps] = med('instrumented', steps, clock('backend commit'))
        totals['body'][steps] = med('instrumented', steps, clock('backend commit body'))
        totals['sql'][steps] = med('instrumented', steps, sql)
        totals['gc'][steps] = med('instrumented', steps, lambda s: s.gc_seconds) - med(
            'plain', steps, lambda s: s.gc_seconds
        )
        totals['gc empty'][steps] = med('empty', steps, lambda s: s.gc_seconds) - med(
            'plain', steps, lambda s: s.gc_seconds
        )
        totals['plain'][steps] = plain
    t = totals
    add('plain agent, its own time per step', t['plain'])
    add('ours as shipped: overhead', t['ours'])
    add('ours instrumented: overhead', t['instrumented'], 'the wrappers cost a little themselves')
    add('= pydantic-ai dispatch (empty capability)', t['dispatch'])
    add('  of which GC (empty minus plain)', t['gc empty'])
    add('+ inside our hooks (tool and run excluded)', t['hooks'])
    per_hook = sorted(
        {key for sample in profiler.samples['instrumented', 400] for key in sample.clock if key.startswith('hook ')}
    )
    for hook in per_hook:
        add(f'    {hook[5:]}', {s: med('instrumented', s, clock(hook)) for s in STEPS})
    add('  capability logic (hooks minus store calls)', {s: t['hooks'][s] - t['store'][s] for s in STEPS})
    add('  store write_records', t['store'])
    add('    outside the backend (checks, encoding, message log)', {s: t['store'][s] - t['commit'][s] for s in STEPS})
    add('    backend commit', t['commit'])
    add(
        '      offload / lock / checkpoint bookkeeping (commit minus body)',
        {s: t['commit'][s] - t['body'][s] for s in STEPS},
    )
    add('      commit body', t['body'])
    add('        SQL statements as timed by the connection', t['sql'])
    sql_labels = sorted(
        {key for sample in profiler.samples['instrumented', 400] for key in sample.clock if key.startswith('SQL ')}
    )
    for label in sql_labels:
        calls = statistics.median(sample.calls.get(label, 0) for sample in profiler.samples['instrumented', 400])
        add(
            f'          {label[4:]}',
            {s: med('instrumented', s, clock(label)) for s in STEPS},
            f'{calls / 400:.2f}/step',
        )
    add('        body minus SQL (Python between statements)', {s: t['body'][s] - t['sql'][s] for s in STEPS})
    add('  detail (also counted above):', {})
    for label, names in GROUPS:
        add(f'    {label}', {s: med('instrumented', s, clocks(names)) for s in STEPS})
    add(
        '    offload: calls run on a worker thread',
        {s: med('instrumented', s, clock('offload: on a worker thread')) for s in STEPS},
    )
    add("+ GC beyond the plain run's", t['gc'])
    add(
        '+ the rest (the run going slower beside ours)',
        {s: t['instrumented'][s] - t['dispatch'][s] - t['hooks'][s] - (t['gc'][s] - t['gc empty'][s]) for s in STEPS},
    )
    print()
    print(f'Per step, medians of {len(profiler.samples["plain", 100])} rounds (ms):')
    print()
    print('| | @100 | @400 | 400 vs 100 | |')
    print('|---|---|---|---|---|')
    for label, values, note in lines:
        if not values:
            print(f'| {label} | | | | |')
            continue
        low, high = values[100] * 1000, values[400] * 1000
        growth = f'{high / low:.2f}x' if low > 0.0005 else '-'
        print(f'| {label} | {low:.3f} | {high:.3f} | {growth} | {note} |')
    print()
    for steps in STEPS:
        for kind in ('plain', 'empty', 'ours', 'instrumented'):
            samples = profiler.samples[kind, steps]
            counts = {g: statistics.median(s.gc_collections.get(g, 0) for s in samples) for g in (0, 1, 2)}
            print(
                f'gc @{steps} {kind}: {statistics.median(s.gc_seconds for s in samples) * 1000:.1f} ms in '
                f'{counts[0]:.0f}/{counts[1]:.0f}/{counts[2]:.0f} collections (gen 0/1/2)'
            )
    calls = profiler.samples['instrumented', 400][0].calls
    print()
    print(
        'calls per step @400: '
        + ', '.join(f'{key} {value / 400:.2f}' for key, value in sorted(calls.items()) if not key.startswith('SQL '))
    )


# --- cProfile -------------------------------------------------------------------------------


def own_time(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    table: dict[str, tuple[float, int]] = {}
    raw = cast(dict[tuple[str, int, str], tuple[int, int, float, float, Any]], vars(stats)['stats'])
    for (filename, line, name), (_, calls, tottime, _, _) in raw.items():
        short = filename.split('site-packages/')[-1].split('/src/')[-1]
        table[f'{short}:{line}({name})'] = (tottime, calls)
    return table


async def profiled(profiler: Profiler, steps: int, ours: bool) -> dict[str, tuple[float, int]]:
    store = profiler.store() if ours else None
    capabilities: list[Any] = [StepPersistence(store=store, agent_name='bench')] if store is not None else []
    agent = make_agent(steps, capabilities)
    gc.collect()
    profile = cProfile.Profile()
    profile.enable()
    await agent.run('go', usage_limits=UNLIMITED)
    profile.disable()
    if store is not None:
        Profiler._close(store)  # pyright: ignore[reportPrivateUsage]
    stats = pstats.Stats(profile)
    if ours and steps == 400:
        path = profiler.scratch.parent / 'ours-400.prof'
        stats.dump_stats(path)
        print(f'cProfile of ours at 400 steps: {path}')
    return own_time(stats)


async def growth_report(profiler: Profiler) -> None:
    runs: dict[tuple[bool, int], dict[str, tuple[float, int]]] = {}
    for steps in STEPS:
        for ours in (False, True):
            runs[ours, steps] = await profiled(profiler, steps, ours)

    def extra(name: str, steps: int) -> float:
        mine = runs[True, steps].get(name, (0.0, 0))[0]
        plain = runs[False, steps].get(name, (0.0, 0))[0]
        return (mine - plain) / steps

    names = set(runs[True, 100]) | set(runs[True, 400])
    rows = sorted(names, key=lambda name: extra(name, 400) - extra(name, 100), reverse=True)
    print()
    print('cProfile, own time per step that ours adds over the plain run (µs; cProfile inflates every call):')
    print()
    print('| function | @100 | @400 | calls/step @400 |')
    print('|---|---|---|---|')
    for name in rows[:25]:
        calls = runs[True, 400].get(name, (0.0, 0))[1] / 400
        print(f'| {name} | {extra(name, 100) * 1e6:.1f} | {extra(name, 400) * 1e6:.1f} | {calls:.1f} |')
    ours_total = {steps: sum(v[0] for v in runs[True, steps].values()) / steps for steps in STEPS}
    plain_total = {steps: sum(v[0] for v in runs[False, steps].values()) / steps for steps in STEPS}
    print()
    print(
        'cProfile totals per step: '
        + ', '.join(f'@{s} plain {plain_total[s] * 1000:.2f} ms, ours {ours_total[s] * 1000:.2f} ms' for s in STEPS)
    )
    top = sorted(runs[True, 400].items(), key=lambda item: item[1][0], reverse=True)[:25]
    print()
    print('cProfile of ours at 400 steps, top own time (µs per step):')
    for name, (tottime, calls) in top:
        print(f'  {tottime / 400 * 1e6:8.1f}  {calls / 400:6.1f}/step  {name}')


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--durable', action='store_true', help='profile durable=True (synchronous=FULL)')
    parser.add_argument('--cprofile', action='store_true', help='also profile runs with cProfile')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix='step-profile-') as scratch_name:
        scratch = Path(scratch_name) / 'work'
        scratch.mkdir()
        template = await make_template(scratch)
        profiler = Profiler(scratch, template, args.durable)
        for steps in STEPS:
            await profiler.round(steps)  # warm-up
        profiler.samples.clear()
        for index in range(args.rounds):
            for steps in STEPS if index % 2 == 0 else reversed(STEPS):
                await profiler.round(steps)
            print(f'round {index + 1} of {args.rounds} done', file=sys.stderr)
        print(f'SqliteStepStore(durable={args.durable})')
        breakdown(profiler)
        if args.cprofile:
            await growth_report(profiler)


if __name__ == '__main__':
    asyncio.run(main())
