"""File and SQLite step stores keeping their media on live S3 servers: snapshots restore byte-exact."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessagesTypeAdapter, ModelRequest, UserPromptPart

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.media import S3MediaStore, media_uri_for
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore, StepStore, continue_run
from pydantic_ai_steps.testing._kernel import managed
from pydantic_ai_steps.testing._support import new_run, snapshot
from tests.step_persistence.agents import call, scripted

pytestmark = [pytest.mark.server, pytest.mark.anyio]

IMAGE = os.urandom(300 * 1024)
REPORT = 'A long tool result line.\n' * 4000  # ~100 KB of text


def step_store(kind: str, root: Path, media: S3MediaStore) -> StepStore:
    if kind == 'file':
        return FileStepStore(root / 'runs', media_store=media)
    return SqliteStepStore(database=root / 'runs.db', media_store=media)


@pytest.mark.parametrize('kind', ['file', 'sqlite'])
async def test_snapshots_restore_byte_exact_with_media_on_s3(
    kind: str, tmp_path: Path, make_store: Callable[..., S3MediaStore]
) -> None:
    media = make_store()
    store = step_store(kind, tmp_path, media)
    agent = Agent(
        scripted([call('fetch_report', 'c1')], 'described'),
        capabilities=[StepPersistence(store=store, run_id=f'{kind}-on-s3')],
    )

    @agent.tool_plain
    def fetch_report() -> str:
        return REPORT

    result = await agent.run(['Describe this and fetch the report', BinaryContent(IMAGE, media_type='image/png')])
    assert await media.exists(media_uri_for(IMAGE), context=_context('image/png'))
    assert await media.exists(media_uri_for(REPORT.encode()), context=_context('text/plain'))

    reopened = step_store(kind, tmp_path, media)
    history = await continue_run(reopened, run_id=f'{kind}-on-s3')
    dump = ModelMessagesTypeAdapter.dump_json
    assert dump(history) == dump(result.all_messages())
    snapshots = await reopened.list_snapshots(run_id=f'{kind}-on-s3')  # type: ignore[attr-defined]
    assert [len(snapshot.messages) for snapshot in snapshots] == [1, 3, 4]  # the input, the tool boundary, the end
    # The tool boundary's copy predates the fields pydantic-ai stamps on its last request later,
    # so compare what the parts carry: the image bytes and the 100 KB tool result.
    assert _contents(snapshots[1].messages) == _contents(result.all_messages()[:3])
    close = getattr(reopened, 'close', None)
    if callable(close):
        close()


def _contents(messages: list[Any]) -> list[tuple[str, Any]]:
    def plain(content: Any) -> Any:
        if isinstance(content, BinaryContent):  # an image comes back as pydantic-ai's BinaryImage
            return ('binary', content.data, content.media_type)
        return [plain(item) for item in content] if isinstance(content, list) else content

    return [(part.part_kind, plain(getattr(part, 'content', None))) for message in messages for part in message.parts]


def _context(media_type: str) -> Any:
    from pydantic_ai_steps.media import MediaContext

    return MediaContext(media_type=media_type)


@pytest.mark.parametrize('kind', ['file', 'sqlite'])
async def test_garbage_collection_of_media_on_s3(
    kind: str, tmp_path: Path, make_store: Callable[..., S3MediaStore]
) -> None:
    """A step store collects the blobs it put on S3 once no run references them, and only then."""
    media = make_store()
    store = managed(step_store(kind, tmp_path, media))
    shared, own = os.urandom(100 * 1024), os.urandom(100 * 1024)

    def history(*images: bytes) -> list[Any]:
        content = ['look', *(BinaryContent(image, media_type='image/png') for image in images)]
        return [ModelRequest(parts=[UserPromptPart(content)])]

    first = await new_run(store)
    await store.save_snapshot(snapshot(first, history(shared, own)))
    second = await new_run(store)
    await store.save_snapshot(snapshot(second, history(shared)))
    assert {blob.uri async for blob in media.list_blobs()} == {media_uri_for(shared), media_uri_for(own)}
    await anyio.sleep(1.1)  # S3 keeps modification times to the second: let them fall before the cutoff
    await store.delete_run(first)
    assert (await store.collect_garbage()).blobs == []  # within the grace
    collected = await store.collect_garbage(grace=timedelta(0), writers_stopped=True)
    assert collected.blobs == [media_uri_for(own)] and collected.bytes == len(own)
    assert await media.exists(media_uri_for(own)) is False
    assert await media.get(media_uri_for(shared)) == shared
    await store.delete_run(second)
    assert (await store.collect_garbage(grace=timedelta(0), writers_stopped=True)).blobs == [media_uri_for(shared)]
    assert [blob async for blob in media.list_blobs()] == []
    close = getattr(store, 'close', None)
    if callable(close):
        close()
