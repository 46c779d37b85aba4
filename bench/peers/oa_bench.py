"""The OpenAI Agents SDK on `bench/steps.py`'s workload, for `bench/peers.py`.

Runs in a virtualenv with `openai-agents` installed (not this project's). One `Runner.run` of an
`Agent` with a function tool `fetch(page)` returning 2048 characters (the same text as ours) and a
scripted `Model` that emits one function call per request until `steps - 1` calls were made, then a
text answer: `steps` model requests, like `bench/steps.py`. Tracing is disabled (no API key).

Kinds: `none` (no session), `sqlite` (a file-backed `SQLiteSession`, the SDK's own settings:
WAL, `synchronous=FULL`, one commit per item batch), `sqlite-normal` (the same with
`synchronous=NORMAL` on every connection it opens), `memory` (`SQLiteSession(':memory:')`).

    python oa_bench.py --steps 100 --reps 3          # standalone: one JSON object
    python oa_bench.py --serve                       # for bench/peers.py: JSON lines in, JSON lines out
    python oa_bench.py --count sqlite-normal 3 40 3  # for bench/instructions.py: runs only, no output

In `--serve` mode each input line is `{"kind": ..., "steps": N}` and the answer is one line with the
run's wall time `t` (seconds), its time inside the SDK's session work `inside` (`SessionClock`) and
what it stored. `OA_SYNC_NORMAL=1` makes `sqlite` mean
`sqlite-normal` (the switch of the first version of this script).
"""
# pyright: basic, reportMissingImports=false, reportMissingModuleSource=false

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_internal import session_persistence
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

set_tracing_disabled(True)

PAYLOAD = 2048
_sync_normal = os.environ.get('OA_SYNC_NORMAL') == '1'
_configure = SQLiteSession._configure_connection


def _configure_connection(conn: sqlite3.Connection) -> None:
    _configure(conn)
    if _sync_normal:
        conn.execute('PRAGMA synchronous=NORMAL')


SQLiteSession._configure_connection = staticmethod(_configure_connection)


class SessionClock:
    """Seconds a run spends in the SDK's session work, the counterpart of the time ours spends inside
    its capability's hooks.

    Timed: `prepare_input_with_session` (the history read when a run starts),
    `save_result_to_session` (a turn's new items converted, fingerprinted, deduplicated and added,
    with the commit on a worker thread), the session's own calls made outside those, and, before
    each save, the runner's pass that only a run with a session makes: from the moment the turn's
    items are taken for the session (`session_items_for_turn`) it goes over every item of the run
    so far, so it grows with the history. That stretch also holds a few list appends a run without
    a session makes too (a microsecond or two), and the run's last save takes in the final answer's
    handling since its turn. A run without a session makes none of these calls (`inside` 0).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._turn_taken: float | None = None

    def reset(self) -> None:
        self.seconds, self._turn_taken = 0.0, None

    def timed(self, function: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # a session call inside another timed one: timed with it
                return await function(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter() if self._turn_taken is None else self._turn_taken
            self._turn_taken = None
            try:
                return await function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self._depth -= 1

        return timed

    def marks_turn(self, function: Any) -> Any:
        def marked(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            self._turn_taken = time.perf_counter()
            return result

        return marked

    def install(self) -> None:
        """Wrap the session work wherever the SDK's modules bound it, and the session's calls."""
        for name, wrap in (
            ('prepare_input_with_session', self.timed),
            ('save_result_to_session', self.timed),
            ('session_items_for_turn', self.marks_turn),
        ):
            original = vars(session_persistence).get(name)
            if original is None:  # a later SDK: a part of the session's work would go untimed
                raise SystemExit(
                    f'oa_bench: agents.run_internal.session_persistence has no {name}; update SessionClock'
                )
            wrapped = wrap(original)
            for module in list(sys.modules.values()):
                if getattr(module, '__name__', '').startswith('agents') and vars(module).get(name) is original:
                    vars(module)[name] = wrapped
        for name in ('get_items', 'add_items', 'pop_item', 'clear_session'):
            setattr(SQLiteSession, name, self.timed(getattr(SQLiteSession, name)))


SESSION_CLOCK = SessionClock()
"""Installed for timed runs only: a count (`--count`) takes in none of its own code."""


@function_tool
def fetch(page: int) -> str:
    """Fetch a page."""
    return (f'page {page}: ' + 'x' * PAYLOAD)[:PAYLOAD]


def _typ(item: Any) -> Any:
    return item.get('type') if isinstance(item, dict) else getattr(item, 'type', None)


class ScriptedModel(Model):
    """A function call per request until `steps - 1` calls are in the input, then 'done'.

    Like `bench/steps.py`'s `FunctionModel` it counts prior calls by scanning the input each turn.
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        *,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
        **kw,
    ):
        calls = 0 if isinstance(input, str) else sum(1 for it in input if _typ(it) == 'function_call')
        if calls < self.steps - 1:
            out = [
                ResponseFunctionToolCall(
                    type='function_call',
                    name='fetch',
                    arguments=json.dumps({'page': calls}),
                    call_id=f'call-{calls}',
                    id=f'fc-{calls}',
                    status='completed',
                )
            ]
        else:
            out = [
                ResponseOutputMessage(
                    type='message',
                    id='msg-final',
                    role='assistant',
                    status='completed',
                    content=[ResponseOutputText(type='output_text', text='done', annotations=[])],
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *a, **kw):  # not used
        raise NotImplementedError


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


async def one_run(kind: str, steps: int) -> dict[str, Any]:
    global _sync_normal
    agent = Agent(name='bench', instructions='', model=ScriptedModel(steps), tools=[fetch])
    out: dict[str, Any] = {'kind': kind, 'steps': steps}
    root = Path(tempfile.mkdtemp(prefix='oabench-'))
    try:
        session = None
        if kind in ('sqlite', 'sqlite-normal'):
            _sync_normal = kind == 'sqlite-normal' or os.environ.get('OA_SYNC_NORMAL') == '1'
            session = SQLiteSession('c-long', db_path=str(root / 'sess.db'))
        elif kind == 'memory':
            session = SQLiteSession('c-long')
        elif kind != 'none':
            raise SystemExit(f'unknown kind {kind!r}')
        gc.collect()
        SESSION_CLOCK.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        res = await Runner.run(agent, 'go', max_turns=steps + 10, session=session)
        out['t'], out['cpu'] = time.perf_counter() - t0, time.process_time() - c0
        out['inside'] = SESSION_CLOCK.seconds
        assert res.final_output == 'done', res.final_output
        hist = res.to_input_list()
        assert sum(1 for it in hist if _typ(it) == 'function_call_output') == steps - 1
        out['hist'] = len(json.dumps(hist).encode())
        if session is not None:
            items = await session.get_items()
            out['items'] = len(items)
            if kind != 'memory':
                conn = sqlite3.connect(str(root / 'sess.db'))
                out['synchronous'] = {0: 'OFF', 1: 'NORMAL', 2: 'FULL', 3: 'EXTRA'}[
                    session._get_connection().execute('PRAGMA synchronous').fetchone()[0]
                ]
                out['journal_mode'] = conn.execute('PRAGMA journal_mode').fetchone()[0]
                conn.close()
                session.close()
                out['bytes'] = dir_bytes(root)
            else:
                session.close()
    finally:
        _sync_normal = os.environ.get('OA_SYNC_NORMAL') == '1'
        shutil.rmtree(root, ignore_errors=True)
    return out


async def counted(kind: str, runs: int, steps: int, runs_at_most: int) -> None:
    """A warm-up run, then `runs` runs of `steps`: what `bench/instructions.py` counts under valgrind
    (its difference of two counts leaves the process's start-up out).

    Each run is a conversation of its own, with a session of its own, made before the first run: as
    many in every counting process (for the most runs one counts, `runs_at_most`), so their making
    cancels out of the difference, as ours opens its store once. What a session does while a run
    uses it (its connections, its writes) is counted.
    """
    global _sync_normal
    _sync_normal = kind == 'sqlite-normal'
    if kind not in ('none', 'sqlite', 'sqlite-normal'):
        raise SystemExit(f'unknown kind {kind!r}')
    root = Path(tempfile.mkdtemp(prefix='oabench-'))
    try:
        sessions = (
            [SQLiteSession(f'c-{run}', db_path=str(root / f'sess-{run}.db')) for run in range(1 + runs_at_most)]
            if kind != 'none'
            else []
        )
        for run, steps_of_run in enumerate((3, *[steps] * runs)):
            agent = Agent(name='bench', instructions='', model=ScriptedModel(steps_of_run), tools=[fetch])
            session = sessions[run] if sessions else None
            result = await Runner.run(agent, 'go', max_turns=steps_of_run + 10, session=session)
            assert result.final_output == 'done', result.final_output
        for session in sessions:
            session.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def serve() -> None:
    await one_run('none', 5)  # warm-up: imports, first compile
    await one_run('sqlite', 5)
    print(json.dumps({'ready': True, 'framework': 'openai-agents'}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        request = json.loads(line)
        print(json.dumps(await one_run(request['kind'], int(request['steps']))), flush=True)


async def standalone(steps: int, reps: int, kinds: list[str]) -> None:
    await one_run('none', 5)
    await one_run('sqlite', 5)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rep in range(reps):
        for k in kinds if rep % 2 == 0 else list(reversed(kinds)):
            runs[k].append(await one_run(k, steps))
    base = statistics.median(r['t'] for r in runs['none'])
    res: dict[str, Any] = {
        'framework': 'openai-agents',
        'steps': steps,
        'reps': reps,
        'own_ms_per_step': round(base / steps * 1e3, 3),
        'raw_times': {k: [round(r['t'], 4) for r in v] for k, v in runs.items()},
    }
    for k in kinds:
        if k != 'none':
            t = statistics.median(r['t'] for r in runs[k])
            inside = statistics.median(r['inside'] for r in runs[k])
            res[k] = {
                'run_s': round(t, 4),
                'overhead_ms_per_step': round((t - base) / steps * 1e3, 3),
                'inside_ms_per_step': round(inside / steps * 1e3, 3),
            }
    print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=100)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--configs', default='none,sqlite')
    ap.add_argument('--serve', action='store_true')
    ap.add_argument('--count', nargs=4, metavar=('KIND', 'RUNS', 'STEPS', 'RUNS_AT_MOST'))
    a = ap.parse_args()
    if a.count:
        kind, runs, steps, runs_at_most = a.count
        asyncio.run(counted(kind, int(runs), int(steps), int(runs_at_most)))
    else:
        SESSION_CLOCK.install()
        asyncio.run(serve() if a.serve else standalone(a.steps, a.reps, a.configs.split(',')))


if __name__ == '__main__':
    main()
