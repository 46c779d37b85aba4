"""MongoStepStore under real agents: from_spec, the stamping trap, media in snapshots."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelRequest, ToolReturnPart, UserPromptPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import InMemoryStepStore, MongoStepStore, continue_run
from pydantic_ai_steps.testing.step_store import dump

from ..step_persistence.agents import call, scripted
from ..step_persistence.test_stores_with_agents import Tee

pytestmark = pytest.mark.anyio


async def test_from_spec_builds_a_mongodb_store(url: str, database_name: str) -> None:
    capability = StepPersistence.from_spec(
        backend='mongodb', db_url=url, database=database_name, max_snapshots_per_run=2, agent_name='spec'
    )
    store = capability.store
    assert isinstance(store, MongoStepStore) and store.max_snapshots_per_run == 2
    agent = Agent(
        scripted([call('lookup', 'c1', q='a')], [call('lookup', 'c2', q='b')], 'done'), capabilities=[capability]
    )

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return q

    async with store:
        await agent.run('hi')
        (record,) = await store.list_runs()
        assert record.agent_name == 'spec' and record.status == 'completed'
        assert len(await continue_run(store, run_id=record.run_id)) == 6
        assert len(await store.list_snapshots(run_id=record.run_id, include_interrupted=True)) <= 3
    with pytest.raises(ValueError, match=r"backend='mongodb' needs db_url="):
        StepPersistence.from_spec(backend='mongodb', database=database_name)


async def test_snapshots_keep_what_the_boundary_saw_not_what_was_stamped_later(url: str, database_name: str) -> None:
    witness = InMemoryStepStore()
    async with MongoStepStore(db_url=url, database=database_name) as store:
        agent = Agent(
            scripted([call('lookup', 'c1', q='a')], [call('lookup', 'c2', q='b')], 'done'),
            instructions='be brief',
            capabilities=[StepPersistence(store=Tee(store, witness), run_id='stamped')],  # type: ignore[arg-type]
        )

        @agent.tool_plain
        def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'found {q}'

        await agent.run('hi', conversation_id='conv')
    async with MongoStepStore(db_url=url, database=database_name) as reader:
        saved = await reader.list_snapshots(run_id='stamped', include_interrupted=True)
    expected = await witness.list_snapshots(run_id='stamped', include_interrupted=True)
    assert len(saved) == len(expected) == 4  # the input, two tool boundaries, the end
    assert [dump(s.messages) for s in saved] == [dump(s.messages) for s in expected]
    first_pending = saved[1].messages[2]
    assert isinstance(first_pending, ModelRequest) and isinstance(first_pending.parts[0], ToolReturnPart)
    assert first_pending.timestamp is None and first_pending.instructions is None


async def test_an_image_goes_to_the_media_store_on_the_same_database_and_comes_back(
    url: str, database_name: str
) -> None:
    image = BinaryContent(bytes(range(256)) * 400, media_type='image/png')  # 102,400 bytes
    async with MongoStepStore(db_url=url, database=database_name) as store:
        agent = Agent(scripted('seen'), capabilities=[StepPersistence(store=store, run_id='eyes')])
        await agent.run(['what is this?', image])
        media = store.media_store
        assert isinstance(media, MongoMediaStore) and media.database == database_name
        assert [blob.size async for blob in media.list_blobs()] == [len(image.data)]
        latest = await store.latest_snapshot(run_id='eyes')
        assert latest is not None
        prompt = latest.messages[0]
        assert isinstance(prompt, ModelRequest) and isinstance(prompt.parts[0], UserPromptPart)
        restored = prompt.parts[0].content[1]  # type: ignore[index]
        assert isinstance(restored, BinaryContent) and restored.data == image.data
