"""LangGraph on `bench/steps.py`'s workload, for `bench/peers.py`.

Runs in a virtualenv with `langgraph` and `langgraph-checkpoint-sqlite` installed (not this
project's). One `ainvoke` of a prebuilt ReAct agent (`create_react_agent`) driven by a scripted chat
model that calls `fetch(page)` (2048 characters, the same text as ours) until `steps - 1` calls
were made, then answers: `steps` model requests, like `bench/steps.py`.

Kinds: `none` (no checkpointer), `memory` (`InMemorySaver`), `sqlite` (`AsyncSqliteSaver` on a
file, LangGraph's default `durability="async"`), `sqlite-sync` (`durability="sync"`: each
checkpoint committed before the next step starts).

    python lg_bench.py --steps 100 --reps 3          # standalone: one JSON object
    python lg_bench.py --serve                       # for bench/peers.py: JSON lines in, JSON lines out
"""
# pyright: basic, reportMissingImports=false, reportMissingModuleSource=false

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, messages_to_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

warnings.filterwarnings('ignore')
from langgraph.prebuilt import create_react_agent  # noqa: E402

PAYLOAD = 2048


@tool
def fetch(page: int) -> str:
    """Fetch a page."""
    return (f'page {page}: ' + 'x' * PAYLOAD)[:PAYLOAD]


class ScriptedChatModel(BaseChatModel):
    """One tool call per turn until `steps - 1` calls were made, then 'done'.

    Like `bench/steps.py`'s `FunctionModel` it counts prior tool calls by scanning the history each turn.
    """

    steps: int

    @property
    def _llm_type(self) -> str:
        return 'scripted'

    def bind_tools(self, tools: Any, **kwargs: Any):  # type: ignore[override]
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        calls = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
        if calls < self.steps - 1:
            msg = AIMessage(content='', tool_calls=[{'name': 'fetch', 'args': {'page': calls}, 'id': f'call-{calls}'}])
        else:
            msg = AIMessage(content='done')
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return self._reply(messages)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


async def one_run(kind: str, steps: int) -> dict[str, Any]:
    base_kind, _, mode = kind.partition('-')
    model = ScriptedChatModel(steps=steps)
    cfg: dict[str, Any] = {'recursion_limit': 4 * steps + 20, 'configurable': {'thread_id': 'c-long'}}
    inp = {'messages': [('user', 'go')]}
    kw: dict[str, Any] = {'durability': mode} if mode else {}
    out: dict[str, Any] = {'kind': kind, 'steps': steps}
    if base_kind == 'none':
        agent = create_react_agent(model, [fetch])
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        res = await agent.ainvoke(inp, cfg, **kw)
        out['t'], out['cpu'] = time.perf_counter() - t0, time.process_time() - c0
    elif base_kind == 'memory':
        from langgraph.checkpoint.memory import InMemorySaver

        agent = create_react_agent(model, [fetch], checkpointer=InMemorySaver())
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        res = await agent.ainvoke(inp, cfg, **kw)
        out['t'], out['cpu'] = time.perf_counter() - t0, time.process_time() - c0
    elif base_kind == 'sqlite':
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        root = Path(tempfile.mkdtemp(prefix='lgbench-'))
        try:
            async with AsyncSqliteSaver.from_conn_string(str(root / 'cp.db')) as saver:
                agent = create_react_agent(model, [fetch], checkpointer=saver)
                gc.collect()
                t0, c0 = time.perf_counter(), time.process_time()
                res = await agent.ainvoke(inp, cfg, **kw)
                out['t'], out['cpu'] = time.perf_counter() - t0, time.process_time() - c0
                async with saver.conn.execute('select count(*) from checkpoints') as cur:
                    out['checkpoints'] = (await cur.fetchone())[0]
                async with saver.conn.execute('PRAGMA synchronous') as cur:
                    out['synchronous'] = {0: 'OFF', 1: 'NORMAL', 2: 'FULL', 3: 'EXTRA'}[(await cur.fetchone())[0]]
                async with saver.conn.execute('PRAGMA journal_mode') as cur:
                    out['journal_mode'] = (await cur.fetchone())[0]
            out['bytes'] = dir_bytes(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    else:
        raise SystemExit(f'unknown kind {kind!r}')
    assert res['messages'][-1].content == 'done', res['messages'][-1]
    assert sum(isinstance(m, ToolMessage) for m in res['messages']) == steps - 1
    out['hist'] = len(json.dumps(messages_to_dict(res['messages'])).encode())
    return out


async def serve() -> None:
    await one_run('none', 5)  # warm-up: imports, first compile
    await one_run('sqlite', 5)
    print(json.dumps({'ready': True, 'framework': 'langgraph'}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        request = json.loads(line)
        print(json.dumps(await one_run(request['kind'], int(request['steps']))), flush=True)


async def standalone(steps: int, reps: int, kinds: list[str]) -> None:
    await one_run('none', 5)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rep in range(reps):
        for k in kinds if rep % 2 == 0 else list(reversed(kinds)):
            runs[k].append(await one_run(k, steps))
    base = statistics.median(r['t'] for r in runs['none'])
    res: dict[str, Any] = {
        'framework': 'langgraph',
        'steps': steps,
        'reps': reps,
        'own_ms_per_step': round(base / steps * 1e3, 3),
        'raw_times': {k: [round(r['t'], 4) for r in v] for k, v in runs.items()},
    }
    for k in kinds:
        if k != 'none':
            t = statistics.median(r['t'] for r in runs[k])
            res[k] = {'run_s': round(t, 4), 'overhead_ms_per_step': round((t - base) / steps * 1e3, 3)}
    print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=100)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--configs', default='none,sqlite')
    ap.add_argument('--serve', action='store_true')
    a = ap.parse_args()
    if a.serve:
        asyncio.run(serve())
    else:
        asyncio.run(standalone(a.steps, a.reps, a.configs.split(',')))


if __name__ == '__main__':
    main()
