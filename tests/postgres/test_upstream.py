"""A database the upstream package's `PostgresStepStore` wrote (`upstream_fixture.sql`, made by
`make_upstream_fixture.py` with pydantic-ai-harness 0.62.0) opens and reads through this package's
store: before it is migrated (a read creates nothing), and after this store's first write migrated it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, ToolReturnPart, UserPromptPart

from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord, StepEvent
from pydantic_ai_steps.testing._support import snapshot, tool_cycle

pytestmark = [pytest.mark.server, pytest.mark.anyio]

FIXTURE = Path(__file__).with_name('upstream_fixture.sql')
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
IMAGE = bytes(range(256)) * 8


@pytest.fixture
async def upstream(dsn: str, prefix: str, anyio_backend: str) -> AsyncIterator[PostgresStepStore]:
    """The fixture loaded under this test's prefix, and our store over it."""
    import asyncpg

    del anyio_backend
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(FIXTURE.read_text(encoding='utf-8').replace('upstream_fx_', f'{prefix}_'))
    finally:
        await conn.close()
    store = PostgresStepStore(dsn=dsn, table=prefix)
    yield store
    await store.aclose()


async def tables(dsn: str, prefix: str) -> set[str]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE $1", f'{prefix}_%')
        return {row[0][len(prefix) + 1 :] for row in rows}
    finally:
        await conn.close()


async def check_upstream_rows(store: PostgresStepStore, *, migrated: bool) -> None:
    run = await store.get_run(run_id='up-1')
    assert run is not None
    assert (run.conversation_id, run.agent_name, run.metadata, run.started_at) == (
        'conv-up',
        'librarian',
        {'team': 'docs'},
        T0,
    )
    assert run.registration_id == 'reg-1'
    # Status comes from the closing event; the migration writes it into the run's row.
    assert run.status == ('completed' if migrated else 'unfinished')
    assert [r.run_id for r in await store.list_runs(conversation_id='conv-up')] == ['up-1']
    assert [r.run_id for r in await store.list_runs(parent_run_id='up-1')] == ['up-2']
    assert [r.run_id for r in await store.list_runs(started_after=T0.replace(second=1), newest_first=True)][
        -1
    ] == 'up-2'
    events = await store.list_events(run_id='up-1')
    assert [e.kind for e in events] == ['run_started', 'tool_call_started', 'tool_call_completed', 'run_completed']
    assert events[1].tool_call_id == 'c1' and events[0].idempotency_key == '0:0:run_started:'
    effect = await store.get_tool_effect(run_id='up-1', tool_call_id='c1')
    assert effect is not None and (effect.status, effect.effect_summary) == ('completed', 'read page 0')
    assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id='up-2')] == ['x1']
    # Upstream's message_refs snapshots, their texts in its content-addressed messages table.
    snapshots = await store.list_snapshots(run_id='up-1')
    assert [s.step_index for s in snapshots] == [1, 2]
    latest = snapshots[-1]
    assert len(latest.messages) == 5 and latest.idempotency_key is None
    returns = [
        p.content
        for m in latest.messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    assert returns == ['result 0', 'result 1']
    assert snapshots[0].idempotency_key == '0:1:complete'
    # Its media markers restore from its media table.
    frontier = await store.latest_snapshot(run_id='up-2', include_interrupted=True)
    assert frontier is not None and frontier.state == 'interrupted'
    prompt = frontier.messages[0]
    assert isinstance(prompt, ModelRequest) and isinstance(prompt.parts[0], UserPromptPart)
    image = prompt.parts[0].content[1]
    assert isinstance(image, BinaryContent) and image.data == IMAGE and image.media_type == 'image/png'
    assert await store.latest_snapshot(run_id='up-2') is None


async def test_an_upstream_database_reads_before_and_after_this_store_migrates_it(
    upstream: PostgresStepStore, dsn: str, prefix: str
) -> None:
    before = await tables(dsn, prefix)
    await check_upstream_rows(upstream, migrated=False)
    assert await tables(dsn, prefix) == before, 'a read created or changed tables'
    assert (await upstream.probe()).step_store

    # The first write migrates in place; upstream's rows still read, and a new run lives beside them.
    await upstream.register_run(RunRecord(run_id='ours', conversation_id='conv-ours', started_at=T0.replace(hour=13)))
    await upstream.append_event(StepEvent(run_id='ours', kind='run_started', step_index=0, idempotency_key='k0'))
    await upstream.save_snapshot(snapshot('ours', tool_cycle(), idempotency_key='0:1:complete'))
    assert {'schema_version', 'message_log', 'messages'} <= await tables(dsn, prefix)
    reopened = PostgresStepStore(dsn=dsn, table=prefix)
    try:
        await check_upstream_rows(reopened, migrated=True)
        assert [r.run_id for r in await reopened.list_runs(newest_first=True)] == ['ours', 'up-2', 'up-1']
        latest = await reopened.latest_snapshot(run_id='ours')
        assert latest is not None and len(latest.messages) == 3
        # An upstream run continues here: its key claims are the same table's.
        await reopened.save_snapshot(snapshot('up-1', tool_cycle('c9'), step_index=3, idempotency_key='0:1:complete'))
        assert [s.step_index for s in await reopened.list_snapshots(run_id='up-1')] == [1, 2]
        await reopened.save_snapshot(snapshot('up-1', tool_cycle('c9'), step_index=3))
        assert [s.step_index for s in await reopened.list_snapshots(run_id='up-1')] == [1, 2, 3]
        assert await reopened.delete_run('up-2') == ['up-2']
        assert await reopened.get_run(run_id='up-2') is None
    finally:
        await reopened.aclose()
