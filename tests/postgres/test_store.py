"""`open_step_store('postgresql://...')`, `from_spec(backend='postgres')`, and the constructor's checks."""

from __future__ import annotations

import pytest

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.step_persistence import PostgresStepStore, RunRecord, open_step_store
from pydantic_ai_steps.store.backends.postgres import split_location

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
