"""`open_step_store('postgresql://...')`, `from_spec(backend='postgres')`, the constructor's checks, and migrating
version-1 and version-2 databases."""

from __future__ import annotations

import copy
import pickle
import traceback
from dataclasses import replace

import asyncpg
import pytest

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps._errors import StoreUnavailableError
from pydantic_ai_steps.media import PostgresMediaStore
from pydantic_ai_steps.step_persistence import (
    InvalidRecordError,
    PostgresStepStore,
    RunRecord,
    ToolEffectRecord,
    open_step_store,
)
from pydantic_ai_steps.store.backends.postgres import split_location
from pydantic_ai_steps.store.backends.postgres._schema import (
    COMMIT_PARAMETERS,
    SCHEMA_VERSION,
    _commit_function,  # pyright: ignore[reportPrivateUsage]
)
from pydantic_ai_steps.store.codec import EFFECT_FIELDS, RESOLUTION_FIELDS
from pydantic_ai_steps.testing.step_store import T0

pytestmark = pytest.mark.server


def test_the_url_names_the_prefix_and_keeps_the_drivers_parameters() -> None:
    assert split_location('postgresql://u:pw@h:5/db?table=steps&sslmode=disable') == (
        'postgresql://u:pw@h:5/db?sslmode=disable',
        'steps',
    )
    assert split_location('postgres://h/db') == ('postgres://h/db', None)


def test_exactly_one_of_a_pool_or_a_dsn() -> None:
    with pytest.raises(ValueError, match='exactly one of a pool'):
        PostgresStepStore()
    with pytest.raises(ValueError, match='exactly one of a pool'):
        PostgresStepStore(object(), dsn='postgresql://h/db')
    with pytest.raises(TypeError, match='acquire'):
        PostgresStepStore(object())
    for bad in ('Steps', 'a-b', 'x' * 41, '1abc', ''):
        with pytest.raises(ValueError, match='invalid table name'):
            PostgresStepStore(dsn='postgresql://h/db', table=bad)
    with pytest.raises(ValueError, match='acquire_timeout'):
        PostgresStepStore(dsn='postgresql://h/db', acquire_timeout=0)
    assert 'pw' not in repr(PostgresStepStore(dsn='postgresql://u:pw@h/db'))


def test_no_pickle_or_copy_holds_the_password() -> None:
    """A DSN's password must not reach a pickle (a task queue's payload, a cache): both stores refuse."""
    for store in (
        PostgresStepStore(dsn='postgresql://u:s3cret@127.0.0.1:1/db'),
        PostgresMediaStore(dsn='postgresql://u@127.0.0.1:1/db?password=s3cret'),
        StepPersistence.from_spec(backend='postgres', dsn='postgresql://u:s3cret@127.0.0.1:1/db'),
    ):
        for attempt in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match='cannot be pickled or copied'):
                attempt(store)


@pytest.mark.anyio
async def test_an_unreachable_server_is_store_unavailable_without_the_password(anyio_backend: str) -> None:
    del anyio_backend
    store = PostgresStepStore(dsn='postgresql://app:s3cret@127.0.0.1:1/db')  # nothing listens on port 1
    with pytest.raises(StoreUnavailableError, match='could not be reached: ConnectionRefusedError') as refused:
        await store.list_runs()
    assert 's3cret' not in str(refused.value) and isinstance(refused.value.__cause__, ConnectionRefusedError)
    # The driver's error is kept, without the driver's frames, whose locals hold the DSN.
    shown = traceback.TracebackException.from_exception(refused.value, capture_locals=True)
    assert 's3cret' not in ''.join(shown.format())
    await store.aclose()


@pytest.mark.anyio
async def test_open_step_store_and_from_spec(dsn: str, prefix: str, anyio_backend: str) -> None:
    del anyio_backend
    store = open_step_store(f'{dsn}?table={prefix}', max_snapshots_per_run=3)
    assert isinstance(store, PostgresStepStore) and store.table == prefix and store.max_snapshots_per_run == 3
    await store.register_run(RunRecord(run_id='via-url'))
    await store.aclose()
    capability = StepPersistence.from_spec(backend='postgres', dsn=dsn, table=prefix, agent_name='spec')
    spec_store = capability.store
    assert isinstance(spec_store, PostgresStepStore)
    assert await spec_store.get_run(run_id='via-url') is not None
    await spec_store.aclose()
    with pytest.raises(ValueError, match='dsn='):
        StepPersistence.from_spec(backend='postgres')


def started_effect() -> ToolEffectRecord:
    """The ledger entry the migration tests write: call `c1` of run `r`, started."""
    return ToolEffectRecord(tool_call_id='c1', tool_name='post', run_id='r', status='started', started_at=T0)


@pytest.mark.anyio
async def test_a_version_1_database_gets_the_commit_that_keeps_a_resolution(
    dsn: str, prefix: str, anyio_backend: str
) -> None:
    """Version 1's commit function let a late ledger write clear a resolution; the first write migrates it away."""
    del anyio_backend
    async with PostgresStepStore(dsn=dsn, table=prefix) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
    kept = ', '.join(f'{name} = EXCLUDED.{name}' for name in EFFECT_FIELDS[2:] if name not in RESOLUTION_FIELDS)
    cleared = ', '.join(f'{name} = EXCLUDED.{name}' for name in EFFECT_FIELDS[2:])
    version_1 = _commit_function(prefix).replace(kept, cleared)
    assert version_1 != _commit_function(prefix)
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(version_1)
        await admin.execute(f'UPDATE {prefix}_schema_version SET version = 1')
        async with PostgresStepStore(dsn=dsn, table=prefix) as store:
            started = started_effect()
            await store.record_tool_effect(started)
            await store.resolve_tool_effect(run_id='r', tool_call_id='c1', outcome='not_done', by='ops')
            await store.record_tool_effect(replace(started, status='completed', ended_at=T0))
            late = await store.get_tool_effect(run_id='r', tool_call_id='c1')
        assert late is not None and (late.status, late.resolution, late.resolved_by) == ('completed', 'not_done', 'ops')
        assert await admin.fetchval(f'SELECT max(version) FROM {prefix}_schema_version') == SCHEMA_VERSION
    finally:
        await admin.close()


@pytest.mark.anyio
async def test_a_version_2_database_keeps_its_commit_function_for_the_processes_still_calling_it(
    dsn: str, prefix: str, anyio_backend: str
) -> None:
    """Version 2's `{t}_commit` took one array per effect and event column; a process of that release that
    opened the store before the migration still calls it by that signature."""
    del anyio_backend
    async with PostgresStepStore(dsn=dsn, table=prefix) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
    kinds = [kind for _, kind in COMMIT_PARAMETERS]
    rows_at = [name for name, _ in COMMIT_PARAMETERS].index('f_rows')
    effect_arrays = ['text[]'] * 4 + ['timestamptz[]'] * 2 + ['text[]'] * 4 + ['timestamptz[]', 'text[]']
    event_arrays = ['text[]', 'text[]', 'integer[]', 'timestamptz[]'] + ['text[]'] * 9
    version_2 = [*kinds[:rows_at], *effect_arrays, *event_arrays, *kinds[rows_at + 2 :]]
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(
            f'CREATE FUNCTION {prefix}_commit({", ".join(version_2)}) RETURNS integer LANGUAGE sql AS $$ SELECT 2 $$'
        )
        await admin.execute(f'UPDATE {prefix}_schema_version SET version = 2')
        async with PostgresStepStore(dsn=dsn, table=prefix) as store:
            started = started_effect()
            await store.record_tool_effect(started)
            assert await store.get_tool_effect(run_id='r', tool_call_id='c1') is not None
        assert await admin.fetchval(f'SELECT max(version) FROM {prefix}_schema_version') == SCHEMA_VERSION == 3
        nulls = ', '.join(f'NULL::{kind}' for kind in version_2)
        assert await admin.fetchval(f'SELECT {prefix}_commit({nulls})') == 2
    finally:
        await admin.close()


@pytest.mark.anyio
async def test_a_nul_character_postgresql_cannot_hold_is_a_clear_error_and_nothing_is_stored(
    dsn: str, prefix: str, anyio_backend: str
) -> None:
    del anyio_backend
    async with PostgresStepStore(dsn=dsn, table=prefix) as store:
        with pytest.raises(InvalidRecordError, match=r"run 'r'.*NUL character \(U\+0000\).*nothing of the write"):
            await store.register_run(RunRecord(run_id='r', started_at=T0, run_metadata={'page': 'a\x00b'}))
        assert await store.get_run(run_id='r') is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ('summary', 'refusal'),
    [
        ('secret-\x00', r"run 'r'.*NUL character \(U\+0000\).*nothing of the write"),
        ('secret-\ud800', r'ToolEffectRecord\.effect_summary is not valid Unicode text: a lone surrogate'),
    ],
    ids=['nul', 'lone surrogate'],
)
async def test_a_text_postgresql_cannot_take_is_a_clear_error_that_does_not_echo_it(
    dsn: str, prefix: str, summary: str, refusal: str, anyio_backend: str
) -> None:
    del anyio_backend
    async with PostgresStepStore(dsn=dsn, table=prefix) as store:
        await store.register_run(RunRecord(run_id='r', started_at=T0))
        effect = replace(started_effect(), effect_summary=summary)
        with pytest.raises(InvalidRecordError, match=refusal) as raised:
            await store.record_tool_effect(effect)
        assert 'secret' not in str(raised.value)
        assert await store.get_tool_effect(run_id='r', tool_call_id='c1') is None
        await store.record_tool_effect(replace(effect, effect_summary='x'))  # the store carries on
        assert await store.get_tool_effect(run_id='r', tool_call_id='c1') is not None
