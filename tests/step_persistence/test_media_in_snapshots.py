"""Step stores move large payloads into their media store and put them back on read."""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessagesTypeAdapter

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.media import DiskMediaStore, SqliteMediaStore, media_uri_for
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore, StepStore

from .agents import scripted

pytestmark = pytest.mark.anyio

IMAGE = hashlib.sha256(b'seed').digest() * (256 * 1024 // 32)  # 256 KiB, incompressible-looking
BIG_TEXT = 'Ünïcode line of a long prompt.\n' * (70 * 1024 // 30)  # > 70 KiB of UTF-8

StoreMaker = Callable[[Path], StepStore]
STORES: dict[str, StoreMaker] = {
    'file': lambda root: FileStepStore(root / 'runs'),
    'sqlite': lambda root: SqliteStepStore(database=root / 'runs.db'),
}


def stored_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob('*') if path.is_file())


def snapshot_text(root: Path) -> str:
    """Everything the store keeps outside its media store, as text."""
    runs = root / 'runs'
    if runs.exists():
        parts = [p.read_text(errors='replace') for p in runs.rglob('*.json*') if 'media' not in p.parts]
        return '\n'.join(parts)
    with closing(sqlite3.connect(root / 'runs.db')) as db:
        rows = db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('media', 'media_chunks')"
        ).fetchall()
        return '\n'.join(str(db.execute(f'SELECT * FROM "{name}"').fetchall()) for (name,) in rows)


def media_blobs(root: Path) -> int:
    if (root / 'runs').exists():
        return len(list((root / 'runs' / 'media').glob('*.bin')))
    with closing(sqlite3.connect(root / 'runs.db')) as db:
        return db.execute('SELECT COUNT(*) FROM media').fetchone()[0]


async def run_agent(store: StepStore, prompt: Any) -> str:
    """Run an agent persisting to `store` under a fresh run id; return that id.

    Not `id(prompt)`: a prompt list freed after one run can give the next one the same address.
    """
    run_id = f'viewer-{uuid.uuid4().hex[:12]}'
    agent = Agent(scripted('seen'), capabilities=[StepPersistence(store=store, run_id=run_id)])
    await agent.run(prompt)
    return run_id


@pytest.mark.parametrize('kind', STORES)
async def test_same_image_in_three_runs_is_stored_once_and_restored_exactly(kind: str, tmp_path: Path) -> None:
    store = STORES[kind](tmp_path)
    image = BinaryContent(IMAGE, media_type='image/png')
    prompts = [[f'Describe image {index}', image] for index in range(3)]
    for prompt in prompts:
        await run_agent(store, prompt)
    assert media_blobs(tmp_path) == 1
    close = getattr(store, 'close', None)
    if callable(close):
        close()  # checkpoints SQLite's write-ahead log into the database file
    assert stored_bytes(tmp_path) < 2 * len(IMAGE)
    reopened = STORES[kind](tmp_path)
    for record in await reopened.list_runs():
        snapshot = await reopened.latest_snapshot(run_id=record.run_id)
        assert snapshot is not None
        content = snapshot.messages[0].parts[0].content  # type: ignore[union-attr]
        restored = content[1]
        assert isinstance(restored, BinaryContent)
        assert restored.data == IMAGE
        assert restored.media_type == 'image/png'


@pytest.mark.parametrize('kind', STORES)
async def test_large_text_prompt_leaves_the_snapshot_files(kind: str, tmp_path: Path) -> None:
    store = STORES[kind](tmp_path)
    run_id = await run_agent(store, BIG_TEXT)
    text = snapshot_text(tmp_path)
    assert 'Ünïcode line of a long prompt' not in text
    assert media_uri_for(BIG_TEXT.encode()) in text
    snapshot = await STORES[kind](tmp_path).latest_snapshot(run_id=run_id)
    assert snapshot is not None
    assert snapshot.messages[0].parts[0].content == BIG_TEXT  # type: ignore[union-attr]


@pytest.mark.parametrize('kind', STORES)
async def test_media_store_none_keeps_bytes_inline(kind: str, tmp_path: Path) -> None:
    store: StepStore
    if kind == 'file':
        store = FileStepStore(tmp_path / 'runs', media_store=None)
    else:
        store = SqliteStepStore(database=tmp_path / 'runs.db', media_store=None)
    run_id = await run_agent(store, BIG_TEXT)
    assert 'Ünïcode line of a long prompt' in snapshot_text(tmp_path)
    snapshot = await store.latest_snapshot(run_id=run_id)
    assert snapshot is not None and snapshot.messages[0].parts[0].content == BIG_TEXT  # type: ignore[union-attr]


@pytest.mark.parametrize('kind', STORES)
async def test_any_media_store_and_threshold_can_be_passed(kind: str, tmp_path: Path) -> None:
    media = DiskMediaStore(tmp_path / 'elsewhere')
    store: StepStore
    if kind == 'file':
        store = FileStepStore(tmp_path / 'runs', media_store=media, media_threshold_bytes=1024)
    else:
        store = SqliteStepStore(database=tmp_path / 'runs.db', media_store=media, media_threshold_bytes=1024)
    prompt = 'p' * 2048
    run_id = await run_agent(store, prompt)
    assert await media.exists(media_uri_for(prompt.encode()))
    snapshot = await store.latest_snapshot(run_id=run_id)
    assert snapshot is not None
    assert ModelMessagesTypeAdapter.dump_json(snapshot.messages).count(b'p' * 2048) == 1


def test_bad_threshold_is_rejected(tmp_path: Path) -> None:
    for bad in (0, -1, 'big', 1.5):
        with pytest.raises(ValueError, match='media_threshold_bytes'):
            FileStepStore(tmp_path / 'runs', media_threshold_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match='media_threshold_bytes'):
            SqliteStepStore(database=tmp_path / 'runs.db', media_threshold_bytes=bad)  # type: ignore[arg-type]


class CountingMedia(DiskMediaStore):
    puts = 0

    async def put(self, data: bytes, **options: Any) -> str:
        self.puts += 1
        return await super().put(data, **options)


@pytest.mark.parametrize('kind', STORES)
async def test_bytes_this_process_stored_are_not_sent_again(kind: str, tmp_path: Path) -> None:
    """An image sent in every run reaches the media store once per process; another image does too."""
    media = CountingMedia(tmp_path / 'media')
    store = (
        FileStepStore(tmp_path / 'runs', media_store=media)
        if kind == 'file'
        else SqliteStepStore(database=tmp_path / 'runs.db', media_store=media)
    )
    image = BinaryContent(IMAGE, media_type='image/png')
    other = BinaryContent(IMAGE[::-1], media_type='image/png')
    for index in range(3):
        await run_agent(store, [f'Describe image {index}', image])
    await run_agent(store, ['Describe the other', other])
    assert media.puts == 2
    # A fresh process (store) puts again: what it knows is only what it stored itself.
    fresh_media = CountingMedia(tmp_path / 'media')
    fresh = (
        FileStepStore(tmp_path / 'runs', media_store=fresh_media)
        if kind == 'file'
        else SqliteStepStore(database=tmp_path / 'runs.db', media_store=fresh_media)
    )
    run_id = await run_agent(fresh, ['Once more', image])
    assert fresh_media.puts == 1
    snapshot = await fresh.latest_snapshot(run_id=run_id)
    assert snapshot is not None
    assert snapshot.messages[0].parts[0].content[1].data == IMAGE  # type: ignore[union-attr, index]


async def test_a_binary_is_hashed_once_while_it_holds_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Histories carry the same `BinaryContent` objects from run to run; their bytes are hashed once."""
    import gc

    from pydantic_ai_steps.store import _hashing as _message_log

    hashed: list[int] = []
    real_sha256 = hashlib.sha256

    def counting_sha256(data: bytes = b'', **options: Any) -> Any:
        hashed.append(len(data))
        return real_sha256(data, **options)

    monkeypatch.setattr(_message_log.hashlib, 'sha256', counting_sha256)
    memo = _message_log.HashedBinaries()  # pyright: ignore[reportPrivateUsage]
    image = BinaryContent(IMAGE, media_type='image/png')
    first = await memo.digest_and_identifier(image)
    assert first == (real_sha256(IMAGE).digest(), image.identifier)
    assert await memo.digest_and_identifier(image) == first and hashed == [len(IMAGE)]

    image.data = IMAGE[::-1]  # new bytes on the same object: hashed again
    assert await memo.digest_and_identifier(image) == (real_sha256(IMAGE[::-1]).digest(), image.identifier)
    assert len(hashed) == 2

    named = BinaryContent(IMAGE, media_type='image/png', identifier='chart-1')
    assert (await memo.digest_and_identifier(named))[1] == 'chart-1'

    del image, named
    gc.collect()
    assert memo._entries == {}  # pyright: ignore[reportPrivateUsage]  # the memo holds its objects weakly


async def test_a_large_binary_is_hashed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both hashes of a payload of a MiB or more run on worker threads, so other runs keep going."""
    import threading

    from pydantic_ai_steps.store import _hashing as _message_log

    threads: list[int] = []
    real_sha256 = hashlib.sha256

    def recording_sha256(data: bytes = b'', **options: Any) -> Any:
        threads.append(threading.get_ident())
        return real_sha256(data, **options)

    monkeypatch.setattr(_message_log.hashlib, 'sha256', recording_sha256)
    memo = _message_log.HashedBinaries()  # pyright: ignore[reportPrivateUsage]
    large = BinaryContent(IMAGE * (_message_log.OFF_LOOP_HASH_BYTES // len(IMAGE)), media_type='image/png')
    small = BinaryContent(IMAGE, media_type='image/png')
    loop_thread = threading.get_ident()

    assert await memo.digest_and_identifier(large) == (real_sha256(large.data).digest(), large.identifier)
    assert len(threads) == 1 and threads[0] != loop_thread
    assert await memo.digest_and_identifier(small) == (real_sha256(IMAGE).digest(), small.identifier)
    assert threads[1] == loop_thread  # below the size, hashing on the loop is cheaper than a hand-off
    named = BinaryContent(large.data, media_type='image/png', identifier='scan-7')
    assert await memo.digest_and_identifier(named) == (real_sha256(large.data).digest(), 'scan-7')


@pytest.mark.parametrize('durable', [False, True])
def test_the_default_media_store_is_as_durable_as_its_step_store(tmp_path: Path, durable: bool) -> None:
    on_files = FileStepStore(tmp_path / 'runs', durable=durable).media_store
    in_sqlite = SqliteStepStore(database=tmp_path / 'runs.db', durable=durable)
    assert isinstance(on_files, DiskMediaStore) and on_files.durable is durable
    assert isinstance(in_sqlite.media_store, SqliteMediaStore) and in_sqlite.media_store.durable is durable
    in_sqlite.close()


@pytest.mark.parametrize('kind', STORES)
async def test_a_tampered_media_blob_is_never_restored_into_a_snapshot(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = STORES[kind](tmp_path)
    run_id = await run_agent(store, ['Describe this', BinaryContent(IMAGE, media_type='image/png')])
    close = getattr(store, 'close', None)
    if callable(close):
        close()
    tampered = IMAGE[:100] + b'X' + IMAGE[101:]
    digest = media_uri_for(IMAGE)[-64:]
    if kind == 'file':
        (tmp_path / 'runs' / 'media' / f'{digest}.bin').write_bytes(tampered)
    else:
        with closing(sqlite3.connect(tmp_path / 'runs.db')) as db, db:
            db.execute('UPDATE media SET bytes = ? WHERE sha256 = ?', (tampered, digest))
    reopened = STORES[kind](tmp_path)
    # Every snapshot of the run carries the image: each reads as damaged (skipped with a warning).
    assert await reopened.latest_snapshot(run_id=run_id) is None
    assert 'skipping unreadable' in caplog.text and 'is damaged' in caplog.text


class UnreachableMedia(DiskMediaStore):
    """A media store whose server stops answering reads once `down` is set."""

    down = False

    async def get(self, uri: str, **options: Any) -> bytes:
        if self.down:
            raise ConnectionError('media server unreachable')
        return await super().get(uri, **options)


@pytest.mark.parametrize('kind', STORES)
async def test_a_media_store_that_cannot_be_reached_fails_the_read_not_the_snapshot(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a record at fault is skipped: an outage taken for damage would hand back an older
    snapshot (one from before a long tool result) as the run's newest, to continue from."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

    from pydantic_ai_steps.step_persistence import ContinuableSnapshot, RunRecord

    media = UnreachableMedia(tmp_path / 'media')
    store = (
        FileStepStore(tmp_path / 'runs', media_store=media)
        if kind == 'file'
        else SqliteStepStore(database=tmp_path / 'runs.db', media_store=media)
    )
    asked = [ModelRequest(parts=[UserPromptPart('fetch it')]), ModelResponse(parts=[ToolCallPart('fetch', {})])]
    fetched = [
        *asked,
        ModelRequest(parts=[ToolReturnPart('fetch', BIG_TEXT, tool_call_id=asked[1].parts[0].tool_call_id)]),
    ]  # type: ignore[union-attr]
    await store.write_records(run=RunRecord(run_id='r'))
    await store.write_records(snapshot=ContinuableSnapshot(run_id='r', step_index=1, messages=asked))
    await store.write_records(snapshot=ContinuableSnapshot(run_id='r', step_index=2, messages=fetched))
    media.down = True
    with pytest.raises(ConnectionError, match='unreachable'):
        await store.latest_snapshot(run_id='r')
    assert 'skipping unreadable' not in caplog.text
    media.down = False
    latest = await store.latest_snapshot(run_id='r')
    assert latest is not None and latest.step_index == 2 and len(latest.messages) == 3


@pytest.mark.parametrize('kind', ['sqlite', 'file'])
async def test_a_value_spelled_like_a_marker_reads_as_written_whatever_media_store_the_reader_has(
    kind: str, tmp_path: Path
) -> None:
    """A store keeping payloads inline still wraps a caller's marker-shaped value, so opening the same
    location with the default media store (as `open_step_store` and the inspector do) reads it as written."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

    from pydantic_ai_steps.step_persistence import ContinuableSnapshot, RunRecord, open_step_store

    echoed = {
        '__harness_external_media__': True,
        '__harness_external_uri__': 'media+sha256://' + '0' * 64,
        'note': 'a tool echoing a stored record',
    }
    history = [
        ModelRequest(parts=[UserPromptPart('show it')]),
        ModelResponse(parts=[ToolCallPart('show', {}, tool_call_id='c1')]),
        ModelRequest(parts=[ToolReturnPart('show', echoed, tool_call_id='c1')]),
    ]
    location = tmp_path / ('runs.db' if kind == 'sqlite' else 'runs')
    inline: StepStore = (
        SqliteStepStore(database=location, media_store=None)
        if kind == 'sqlite'
        else FileStepStore(location, media_store=None)
    )
    await inline.write_records(run=RunRecord(run_id='r'))
    await inline.write_records(snapshot=ContinuableSnapshot(run_id='r', step_index=1, messages=history))
    expected = ModelMessagesTypeAdapter.dump_json(history)
    for reader in (inline, open_step_store(f'sqlite:///{location}' if kind == 'sqlite' else f'file://{location}')):
        latest = await reader.latest_snapshot(run_id='r')
        assert latest is not None and ModelMessagesTypeAdapter.dump_json(latest.messages) == expected
        await reader.aclose()
