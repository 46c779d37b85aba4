"""Step-store benchmark: what persistence costs an agent, per backend, in one run.

    uv run python bench/steps.py            # the full table (a few minutes)
    uv run python bench/steps.py --quick    # smaller workloads, for a smoke test

Workloads (the same for every store):

- *Per-step overhead*: an agent on a `FunctionModel` that calls a tool returning 2 KB, for 100
  and for 400 steps, timed with and without `StepPersistence`. Runs alternate (plain, then each
  store) and the median of the repeats is used, so machine noise hits every column alike.
  Overhead is the median over repeats of `(persisted - plain) / steps`, each persisted run paired
  with the plain run just before it (so slow drift of the machine cancels out), shown in ms and
  as a share of the plain agent's own time per step. Every timed run has a store of its own,
  opened by an untimed two-step run first, so opening it (a pool, the schema) is not timed.
- *Stored bytes*: what one 100-step run left in a store of its own, over the JSON size of its
  final history (`all_messages_json()`).
- *Short runs*: many two-step runs (one tool call, then the answer), persisted time over plain.
- *list_runs*: median latency of `list_runs(conversation_id=...)` with 10,000 runs registered in
  100 conversations.

If `pydantic_ai_harness` (the upstream package) is importable, its stores are measured on the
same workloads and printed beside ours. With `TEST_POSTGRES_DSN` set (`scripts/services.sh start`
exports it), so are the PostgreSQL stores (ours, and upstream's when it is installed), each run
under a table prefix of its own, stored bytes being `pg_total_relation_size` of its tables, beside
the *postgres floor*: at each point where ours writes, one autocommit statement inserting rows of
the sizes ours writes (`inside_hooks.PostgresFloorHooks`), inside the same running agents.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import importlib.util
import inspect
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

import pg_bench  # PostgreSQL helpers, from this directory
from inside_hooks import PostgresFloorHooks
from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import FileStepStore, InMemoryStepStore, RunRecord, SqliteStepStore

PAYLOAD = 2048
UNLIMITED = UsageLimits(request_limit=None)
TARGETS = {
    'overhead_100': 0.10,
    'growth': 1.5,
    'stored': 3.0,
    'short': 1.2,
    'list_ms': 5.0,
}


# --- the agent --------------------------------------------------------------------------------


def page_of_text(page: int) -> str:
    """The benchmark's tool result: 2 KB of text."""
    return (f'page {page}: ' + 'x' * PAYLOAD)[:PAYLOAD]


def make_agent(
    steps: int, capabilities: list[Any], *, given_usage: bool = False, result: Callable[[int], Any] = page_of_text
) -> Agent[None, str]:
    """`steps` model requests: `steps - 1` tool calls (`result(page)` each, 2 KB of text unless
    given), then a text answer.

    `FunctionModel` estimates the usage of a response that carries none by splitting every message
    of the history (pydantic-ai's own time per step grows with it); `given_usage` has the model
    report a usage instead, as a real model does and as the peers' scripted models do.
    """
    usage = RequestUsage(input_tokens=1, output_tokens=1) if given_usage else RequestUsage()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        done = sum(1 for message in messages if isinstance(message, ModelResponse))
        if done < steps - 1:
            return ModelResponse(
                parts=[ToolCallPart('fetch', {'page': done}, tool_call_id=f'call-{done}')], usage=replace(usage)
            )
        return ModelResponse(parts=[TextPart('done')], usage=replace(usage))

    agent = Agent(FunctionModel(model), capabilities=capabilities)

    @agent.tool_plain
    async def fetch(page: int) -> Any:  # pyright: ignore[reportUnusedFunction]
        return result(page)

    return agent


async def timed(agent: Agent[None, str], **kwargs: Any) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    result = await agent.run('go', usage_limits=UNLIMITED, **kwargs)
    elapsed = time.perf_counter() - start
    return elapsed, len(result.all_messages_json())


# --- backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    label: str
    capability: Callable[[Any], Any]
    """Builds the capability around a store."""
    make: Callable[[Path], Any]
    """Builds a store under a scratch directory."""
    size: Callable[[Path, Any], Any]
    """Bytes the store holds (None: not measurable, e.g. in memory); may be awaitable."""
    close: Callable[[Any], Any] = lambda store: None
    """Releases the store; may be awaitable."""
    floor: bool = False
    """Not a store: the floor, measured in the per-step runs only."""
    results: dict[str, float | None] = field(default_factory=dict[str, 'float | None'])


def workspace(scratch: Path, backend: Backend, workload: str) -> Path:
    """A fresh directory for one store of `backend` in one workload."""
    directory = scratch / f'{backend.label}-{workload}'.replace(' ', '_')
    directory.mkdir()
    return directory


def tree_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def close_sqlite(store: Any) -> None:
    close = getattr(store, 'close', None)
    if callable(close):
        close()


async def settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def postgres_backend(label: str, capability: Callable[[Any], Any], build: Callable[[str, str], Any]) -> Backend:
    """A PostgreSQL store under a fresh prefix per store built; `build(url, prefix)` makes it."""
    url = pg_bench.dsn()
    assert url is not None
    built: dict[int, tuple[str, Any]] = {}

    def make(directory: Path) -> Any:
        del directory
        prefix = pg_bench.fresh_prefix('bench')
        store, closer = build(url, prefix)
        built[id(store)] = (prefix, closer)
        return store

    async def size(directory: Path, store: Any) -> int:
        del directory
        return await pg_bench.prefix_bytes(url, built[id(store)][0])

    async def close(store: Any) -> None:
        prefix, closer = built.pop(id(store))
        await closer()
        await pg_bench.drop_prefix(url, prefix)

    return Backend(label, capability, make, size, close)


def our_backends() -> list[Backend]:
    def capability(store: Any) -> Any:
        return StepPersistence(store=store, agent_name='bench')

    return [
        Backend('memory', capability, lambda d: InMemoryStepStore(), lambda d, s: None),
        Backend('file', capability, lambda d: FileStepStore(d / 'steps'), lambda d, s: tree_size(d / 'steps')),
        Backend(
            'sqlite',
            capability,
            lambda d: SqliteStepStore(database=d / 'steps.db'),
            lambda d, s: (close_sqlite(s), tree_size(d))[1],
            close_sqlite,
        ),
        *(
            [postgres_backend('postgres', capability, _our_postgres), postgres_floor()]
            if pg_bench.dsn() is not None and importlib.util.find_spec('asyncpg') is not None
            else []
        ),
    ]


def postgres_floor() -> Backend:
    """Two one-statement transactions per tool cycle at ours' write points, rows of ours' sizes."""
    url = pg_bench.dsn()
    assert url is not None

    def make(directory: Path) -> Any:
        del directory
        return pg_bench.Floor(url, pg_bench.fresh_prefix('floor'))

    async def close(floor: Any) -> None:
        await floor.close()
        await pg_bench.drop_prefix(url, floor.table.removesuffix('_floor'))

    return Backend(
        'postgres floor', lambda floor: PostgresFloorHooks(postgres=floor), make, lambda d, s: None, close, floor=True
    )


def _our_postgres(url: str, prefix: str) -> tuple[Any, Callable[[], Any]]:
    from pydantic_ai_steps.step_persistence import PostgresStepStore

    store = PostgresStepStore(dsn=url, table=prefix)
    return store, store.aclose


def harness_backends() -> list[Backend]:
    """The upstream package's stores, if it is installed (never required)."""
    try:
        persistence = importlib.import_module('pydantic_ai_harness.step_persistence')
    except ImportError:
        return []

    def capability(store: Any) -> Any:
        return persistence.StepPersistence(store=store, agent_name='bench')

    def harness_postgres(url: str, prefix: str) -> tuple[Any, Callable[[], Any]]:
        pool = pg_bench.LazyPool(url)
        return persistence.PostgresStepStore(pool, table=prefix), pool.close

    def db_size(directory: Path, store: Any) -> int:
        del store
        return tree_size(directory)

    return [
        Backend('harness memory', capability, lambda d: persistence.InMemoryStepStore(), lambda d, s: None),
        Backend(
            'harness file',
            capability,
            lambda d: persistence.FileStepStore(d / 'steps'),
            lambda d, s: tree_size(d / 'steps'),
        ),
        Backend('harness sqlite', capability, lambda d: persistence.SqliteStepStore(database=d / 'steps.db'), db_size),
        *([postgres_backend('harness postgres', capability, harness_postgres)] if pg_bench.dsn() is not None else []),
    ]


# --- workloads --------------------------------------------------------------------------------


async def per_step(backends: list[Backend], steps: int, repeats: int, scratch: Path) -> float:
    """Fill `overhead_<steps>` (seconds per step) for every backend; return the plain agent's time per step.

    Each timed run gets a store of its own that one two-step run opened first (untimed), so what
    is timed is the steady state: a first run on a fresh location would also time opening it
    (a connection pool, the schema's creation), once per store, spread over the run's steps.
    """
    plain = make_agent(steps, [])
    await timed(plain)  # warm-up
    plain_times: list[float] = []
    extra: dict[str, list[float]] = {backend.label: [] for backend in backends}
    for repeat in range(repeats):
        plain_time = (await timed(plain))[0]
        plain_times.append(plain_time)
        for backend in backends:
            directory = workspace(scratch, backend, f'{steps}-{repeat}')
            store = backend.make(directory)
            await timed(make_agent(2, [backend.capability(store)]))  # opens the store
            elapsed, _ = await timed(make_agent(steps, [backend.capability(store)]))
            extra[backend.label].append(elapsed - plain_time)
            await settled(backend.close(store))
            shutil.rmtree(directory, ignore_errors=True)
    agent_step = statistics.median(plain_times) / steps
    for backend in backends:
        backend.results[f'overhead_{steps}'] = statistics.median(extra[backend.label]) / steps
    return agent_step


async def stored_bytes(backends: list[Backend], steps: int, scratch: Path) -> None:
    """Fill `stored`: what one `steps`-step run leaves in a store of its own, over its final history's JSON."""
    for backend in backends:
        if backend.floor:
            continue
        directory = workspace(scratch, backend, 'stored')
        store = backend.make(directory)
        _, history_bytes = await timed(make_agent(steps, [backend.capability(store)]))
        stored = await settled(backend.size(directory, store))
        backend.results['stored'] = None if stored is None else stored / history_bytes
        await settled(backend.close(store))
        shutil.rmtree(directory, ignore_errors=True)


async def short_runs(backends: list[Backend], runs: int, scratch: Path) -> float:
    """Fill `short` (persisted time over plain) for two-step runs; return the plain run time."""
    plain = make_agent(2, [])
    for _ in range(10):
        await timed(plain)
    agents: dict[str, tuple[Agent[None, str], Any]] = {}
    for backend in backends:
        directory = workspace(scratch, backend, 'short')
        store = backend.make(directory)
        agents[backend.label] = (make_agent(2, [backend.capability(store)]), store)
        for _ in range(10):
            await timed(agents[backend.label][0])
    plain_times: list[float] = []
    times: dict[str, list[float]] = {backend.label: [] for backend in backends}
    for _ in range(runs):
        start = time.perf_counter()
        await plain.run('go', usage_limits=UNLIMITED)
        plain_times.append(time.perf_counter() - start)
        for backend in backends:
            agent = agents[backend.label][0]
            start = time.perf_counter()
            await agent.run('go', usage_limits=UNLIMITED)
            times[backend.label].append(time.perf_counter() - start)
    baseline = statistics.median(plain_times)
    for backend in backends:
        backend.results['short'] = statistics.median(times[backend.label]) / baseline
        await settled(backend.close(agents[backend.label][1]))
    return baseline


async def list_runs_latency(
    backends: list[Backend], runs: int, conversations: int, queries: int, scratch: Path
) -> None:
    for backend in backends:
        if backend.floor:
            continue
        directory = workspace(scratch, backend, 'lineage')
        store = backend.make(directory)
        record_type = _record_type(backend)
        for index in range(runs):
            await store.register_run(
                record_type(run_id=f'run-{index}', conversation_id=f'conv-{index % conversations}')
            )
        rng = random.Random(7)
        samples: list[float] = []
        budget = time.perf_counter() + 30.0  # a store that scans every run could take hours
        for _ in range(queries):
            conversation = f'conv-{rng.randrange(conversations)}'
            start = time.perf_counter()
            found = await store.list_runs(conversation_id=conversation)
            samples.append(time.perf_counter() - start)
            assert len(found) == runs // conversations, (backend.label, len(found))
            if time.perf_counter() > budget:
                break
        backend.results['list_ms'] = statistics.median(samples) * 1000
        await settled(backend.close(store))
        shutil.rmtree(directory, ignore_errors=True)


def _record_type(backend: Backend) -> Any:
    if backend.label.startswith('harness'):
        return importlib.import_module('pydantic_ai_harness.step_persistence').RunRecord
    return RunRecord


# --- report -----------------------------------------------------------------------------------


def report(backends: list[Backend], agent_step: dict[int, float], short_baseline: float, list_runs: int) -> None:
    def ms(value: float | None) -> str:
        return '-' if value is None else f'{value * 1000:.2f}'

    def ratio(value: float | None, digits: int = 2) -> str:
        return '-' if value is None else f'{value:.{digits}f}x'

    def pct(value: float | None, base: float) -> str:
        return '-' if value is None else f'{value / base * 100:.1f}%'

    header = (
        'store',
        'ovh/step@100',
        '% of agent',
        'ovh/step@400',
        '% of agent',
        '400 vs 100',
        'stored/history',
        '2-step run',
        f'list_runs({list_runs:,})',
    )
    rows: list[tuple[str, ...]] = [header]
    for backend in backends:
        r = backend.results
        o100, o400 = r.get('overhead_100'), r.get('overhead_400')
        growth = o400 / o100 if o100 and o400 is not None and o100 > 0 else None
        list_ms = r.get('list_ms')
        rows.append(
            (
                backend.label,
                f'{ms(o100)} ms',
                pct(o100, agent_step[100]),
                f'{ms(o400)} ms',
                pct(o400, agent_step[400]),
                ratio(growth),
                ratio(r.get('stored')),
                ratio(r.get('short')),
                '-' if list_ms is None else f'{list_ms:.2f} ms',
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print()
    print(
        f'agent alone: {agent_step[100] * 1000:.2f} ms/step at 100 steps, {agent_step[400] * 1000:.2f} ms/step at 400; '
        f'two-step run {short_baseline * 1000:.2f} ms'
    )
    for index, row in enumerate(rows):
        print('  '.join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)))
        if index == 0:
            print('  '.join('-' * width for width in widths))
    print(
        f'targets (file, sqlite): ovh@100 <= {TARGETS["overhead_100"]:.0%} of agent, '
        f'400 vs 100 <= {TARGETS["growth"]}x, stored <= {TARGETS["stored"]}x, '
        f'2-step <= {TARGETS["short"]}x, list_runs <= {TARGETS["list_ms"]} ms'
    )
    for backend in backends:
        if backend.label not in ('file', 'sqlite', 'postgres'):
            continue
        r = backend.results
        misses: list[str] = []
        o100, o400 = r.get('overhead_100'), r.get('overhead_400')
        if o100 is not None and o100 / agent_step[100] > TARGETS['overhead_100']:
            misses.append('overhead@100')
        if o100 and o400 is not None and o100 > 0 and o400 / o100 > TARGETS['growth']:
            misses.append('400 vs 100')
        if (stored := r.get('stored')) is not None and stored > TARGETS['stored']:
            misses.append('stored bytes')
        if (short := r.get('short')) is not None and short > TARGETS['short']:
            misses.append('2-step run')
        if (list_ms := r.get('list_ms')) is not None and list_ms > TARGETS['list_ms']:
            misses.append('list_runs')
        print(f'  {backend.label}: {"all targets met" if not misses else "missed: " + ", ".join(misses)}')
    comparisons(backends)


def comparisons(backends: list[Backend]) -> None:
    """Overhead per step against a store's floor and against upstream's store of the same kind."""
    by_label = {backend.label: backend.results for backend in backends}
    for backend in backends:
        if backend.floor or backend.label.startswith('harness'):
            continue
        floor, upstream = by_label.get(f'{backend.label} floor'), by_label.get(f'harness {backend.label}')
        for wording, numerator, denominator in (
            ('ours / its floor', backend.results, floor),
            ('upstream / ours', upstream, backend.results),
            # The most any store could win against upstream: one that cost exactly the floor.
            ('upstream / the floor', upstream, floor),
        ):
            if numerator is None or denominator is None:
                continue
            cells: list[str] = []
            for steps in (100, 400):
                above, below = numerator.get(f'overhead_{steps}'), denominator.get(f'overhead_{steps}')
                if above and below:
                    cells.append(f'{above / below:.2f}x at {steps} steps')
            if cells:
                print(f'  {backend.label}, {wording}: {", ".join(cells)}')


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or '').splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='small workloads, for a smoke test')
    parser.add_argument('--only', help="comma-separated store labels to measure, e.g. 'postgres,harness postgres'")
    args = parser.parse_args()
    repeats_100, repeats_400, short_count, list_count = (1, 1, 20, 1000) if args.quick else (5, 5, 200, 10_000)
    steps_long = 120 if args.quick else 400
    backends = our_backends() + harness_backends()
    if args.only:
        wanted = {label.strip() for label in args.only.split(',')}
        backends = [backend for backend in backends if backend.label in wanted]
    if not any(backend.label.startswith('harness') for backend in backends):
        print('pydantic_ai_harness is not installed: measuring this package only', file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix='steps-bench-') as scratch_name:
        scratch = Path(scratch_name)
        await stored_bytes(backends, 100, scratch)
        agent_step = {100: await per_step(backends, 100, repeats_100, scratch)}
        agent_step[400] = await per_step(backends, steps_long, repeats_400, scratch)
        for backend in backends:
            backend.results['overhead_400'] = backend.results.pop(f'overhead_{steps_long}', None)
        short_baseline = await short_runs(backends, short_count, scratch)
        await list_runs_latency(backends, list_count, 100, 200, scratch)
    report(backends, agent_step, short_baseline, list_count)


if __name__ == '__main__':
    asyncio.run(main())
