"""Write `upstream_fixture.sql`: what the upstream package's `PostgresStepStore` (pydantic-ai-harness
0.62.0) leaves in a database, for `test_upstream.py` to read through this package's store.

Run it in a virtual environment of its own, against the test server (`scripts/services.sh start`):

    python3 -m venv /tmp/harness-venv
    /tmp/harness-venv/bin/pip install pydantic-ai-harness==0.62.0 asyncpg
    source .steps-services/env
    /tmp/harness-venv/bin/python tests/postgres/make_upstream_fixture.py        # writes the fixture
    /tmp/harness-venv/bin/python tests/postgres/make_upstream_fixture.py --read PREFIX
        # what upstream reads from a prefix this package has migrated (prints a report)

The package is used only through its public API. The tables are named `upstream_fx_*`; the test
loads the dump under a fresh prefix of its own. Timestamps are fixed, so the dump only changes when
upstream's layout does.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg  # pyright: ignore[reportMissingTypeStubs]
from pydantic_ai.messages import (  # pyright: ignore[reportMissingImports]
    BinaryContent,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai_harness.step_persistence import (  # pyright: ignore[reportMissingImports]
    ContinuableSnapshot,
    PostgresStepStore,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
)

PREFIX = 'upstream_fx'
OUT = Path(__file__).with_name('upstream_fixture.sql')
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
IMAGE = bytes(range(256)) * 8  # 2,048 bytes: above the store's 1 KiB threshold here, so it goes to the media table


def history(steps: int) -> list[object]:
    messages: list[object] = [ModelRequest(parts=[UserPromptPart('find the docs', timestamp=T0)])]
    for step in range(steps):
        call = f'c{step + 1}'
        messages.append(ModelResponse(parts=[ToolCallPart('search', {'page': step}, tool_call_id=call)], timestamp=T0))
        messages.append(
            ModelRequest(parts=[ToolReturnPart('search', f'result {step}', tool_call_id=call, timestamp=T0)])
        )
    return messages


async def write(dsn: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            for row in await conn.fetch(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'upstream\\_fx\\_%'"
            ):
                await conn.execute(f'DROP TABLE {row[0]}')
        store = PostgresStepStore(pool, table=PREFIX, media_threshold_bytes=1024)
        at = lambda seconds: T0 + timedelta(seconds=seconds)  # noqa: E731
        await store.register_run(
            RunRecord(
                run_id='up-1',
                conversation_id='conv-up',
                agent_name='librarian',
                metadata={'team': 'docs'},
                started_at=at(0),
                registration_id='reg-1',
            )
        )
        await store.register_run(
            RunRecord(run_id='up-2', parent_run_id='up-1', agent_name='helper', started_at=at(1), conversation_id='c2')
        )
        for index, (kind, step, call) in enumerate(
            [('run_started', 0, None), ('tool_call_started', 1, 'c1'), ('tool_call_completed', 1, 'c1')]
        ):
            await store.append_event(
                StepEvent(
                    run_id='up-1',
                    kind=kind,
                    step_index=step,
                    timestamp=at(2 + index),
                    tool_call_id=call,
                    tool_name='search' if call else None,
                    idempotency_key=f'{index}:{step}:{kind}:{call or ""}',
                )
            )
        await store.record_tool_effect(
            ToolEffectRecord(
                tool_call_id='c1',
                tool_name='search',
                run_id='up-1',
                status='completed',
                started_at=at(3),
                ended_at=at(4),
                idempotency_key='search::1',
                effect_summary='read page 0',
            )
        )
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id='up-1', step_index=1, messages=history(1), timestamp=at(5), idempotency_key='0:1:complete'
            )
        )
        await store.save_snapshot(
            ContinuableSnapshot(run_id='up-1', step_index=2, messages=history(2), timestamp=at(6))
        )
        await store.append_event(StepEvent(run_id='up-1', kind='run_completed', step_index=2, timestamp=at(7)))
        await store.record_tool_effect(
            ToolEffectRecord(tool_call_id='x1', tool_name='post', run_id='up-2', status='started', started_at=at(8))
        )
        with_image = [
            ModelRequest(parts=[UserPromptPart(['look', BinaryContent(IMAGE, media_type='image/png')], timestamp=T0)]),
            ModelResponse(parts=[TextPart('a gradient')], timestamp=T0),
        ]
        await store.save_snapshot(
            ContinuableSnapshot(run_id='up-2', step_index=1, messages=with_image, timestamp=at(9), state='interrupted')
        )
    finally:
        await pool.close()


def dump(dsn: str) -> None:
    pg_dump = Path(os.environ.get('TEST_POSTGRES_BIN', '/usr/lib/postgresql/15/bin')) / 'pg_dump'
    text = subprocess.run(
        [str(pg_dump), '--inserts', '--no-owner', '--no-privileges', '--no-comments', '-t', f'{PREFIX}_*', dsn],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kept = [
        line
        for line in text.splitlines()
        if not line.startswith(('SET ', 'SELECT pg_catalog.set_config', '--', '\\')) and line.strip()
    ]
    body = re.sub(r'\bpublic\.', '', '\n'.join(kept))
    header = (
        '-- Written by tests/postgres/make_upstream_fixture.py with pydantic-ai-harness 0.62.0 (pg_dump --inserts):\n'
        '-- the tables its PostgresStepStore(pool, table="upstream_fx") created and the rows it wrote.\n'
    )
    OUT.write_text(header + body + '\n', encoding='utf-8')


async def read(dsn: str, prefix: str) -> None:
    """What upstream reads from a prefix this package has migrated and written to."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        store = PostgresStepStore(pool, table=prefix)
        checks = {
            'get_run': lambda: store.get_run(run_id='up-1'),
            'list_runs': lambda: store.list_runs(conversation_id='conv-up'),
            'list_events': lambda: store.list_events(run_id='up-1'),
            'get_tool_effect': lambda: store.get_tool_effect(run_id='up-1', tool_call_id='c1'),
            'latest_snapshot': lambda: store.latest_snapshot(run_id='up-1'),
            'register_run': lambda: store.register_run(RunRecord(run_id='up-after')),
        }
        for name, call in checks.items():
            try:
                result = await call()
                print(f'{name}: ok ({type(result).__name__})')
            except Exception as error:  # a report of what fails
                print(f'{name}: {type(error).__name__}: {str(error)[:160]}')
    finally:
        await pool.close()


if __name__ == '__main__':
    url = os.environ['TEST_POSTGRES_DSN']
    if len(sys.argv) == 3 and sys.argv[1] == '--read':
        asyncio.run(read(url, sys.argv[2]))
    else:
        asyncio.run(write(url))
        dump(url)
        print(f'wrote {OUT}')
