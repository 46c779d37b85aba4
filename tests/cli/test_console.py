"""Every inspector command against real SQLite and File stores: run in-process through `main`, and
as the real console script where the process is what is tested (PATH, `python -m`, exit status,
terminals, broken pipes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_steps import StepPersistence
from pydantic_ai_steps.media import media_uri_for
from pydantic_ai_steps.step_persistence import ContinuableSnapshot, RunRecord, StepStore, fork_run, run_record_for

from .conftest import PopulatedStore, open_store, run_cli, run_cli_inprocess, run_on_tty
from .populate import BIG_IMAGE, BIG_TEXT, SMALL_IMAGE

ANSI = '\x1b['
posix_only = pytest.mark.skipif(sys.platform == 'win32', reason='pseudo-terminals are POSIX')
sqlite_only = pytest.mark.parametrize('populated', ['sqlite'], indirect=True)
"""For behaviour that does not depend on the backend (or needs a real process): one store kind is enough."""


def ok(*args: str) -> str:
    result = run_cli_inprocess(*args)
    assert result.returncode == 0, result.stderr
    assert ANSI not in result.stdout  # a pipe never gets colour
    return result.stdout


def test_console_script_is_installed() -> None:
    # The environment running the tests comes first: `scripts/test` runs a second venv (the 2.62
    # floor) whose bin directory is not on PATH.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get('PATH', '')])
    script = shutil.which('pydantic-ai-steps', path=search)
    assert script is not None, 'the pydantic-ai-steps console script is not installed'
    result = subprocess.run([script, '--help'], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    for command in ('demo', 'runs', 'tree', 'events', 'effects', 'snapshot', 'stats', 'export', 'continue'):
        assert command in result.stdout
    for status in ('completed', 'failed', 'unfinished'):
        assert re.search(rf'^  {status} ', result.stdout, re.MULTILINE), f'{status} is not explained in --help'


def test_runs_table(populated: PopulatedStore) -> None:
    lines = ok('runs', '--store', populated.url).splitlines()
    assert lines[0].split() == ['RUN', 'AGENT', 'CONVERSATION', 'PARENT', 'STARTED', '(UTC)', 'STATUS', 'STEPS']
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    runs = populated.runs
    assert rows[runs.orchestrator][1:4] == ['orchestrator', 'conv-orch', '-']
    assert rows[runs.librarian][1:4] == ['code_librarian', 'conv-libr', runs.orchestrator]
    assert rows[runs.orchestrator][-2:] == ['completed', '2']
    assert rows[runs.failed][-2:] == ['failed', '1']
    assert rows[runs.crashed][-2:] == ['unfinished', '1']
    assert lines[1].startswith(runs.crashed)  # oldest first: its started_at is the earliest
    assert len(lines) == 6


def test_runs_filters_and_json(populated: PopulatedStore) -> None:
    runs = populated.runs
    store = ('--store', populated.url)
    by_conversation = json.loads(ok('runs', '--conversation', 'conv-libr', '--json', *store))
    assert [run['run_id'] for run in by_conversation] == [runs.librarian]
    by_parent = json.loads(ok('runs', '--parent', runs.orchestrator, '--json', *store))
    assert [run['run_id'] for run in by_parent] == [runs.librarian]
    (crashed,) = json.loads(ok('runs', '--agent', 'deployer', '--json', *store))
    assert crashed['status'] == 'unfinished'
    assert (crashed['steps'], crashed['unresolved_effects'], crashed['events']) == (1, 1, 4)
    (failed,) = json.loads(ok('runs', '--agent', 'flaky', '--json', *store))
    assert 'disk full' in failed['error']
    assert ok('runs', '--agent', 'nobody', *store) == 'no runs match\n'
    for empty in ('--agent', '--conversation', '--parent'):  # an empty filter matches nothing; the store has runs
        assert ok('runs', empty, '', *store) == 'no runs match\n'
    everything = json.loads(ok('runs', '--json', *store))
    started = [run['started_at'] for run in everything]
    assert started == sorted(started)


def test_tree(populated: PopulatedStore) -> None:
    runs = populated.runs
    lines = ok('tree', '--store', populated.url).splitlines()
    (orchestrator_line,) = [index for index, line in enumerate(lines) if line.startswith(runs.orchestrator)]
    child = lines[orchestrator_line + 1]
    assert child.startswith(('└─ ' + runs.librarian, '`- ' + runs.librarian))
    assert '[code_librarian]  completed  2 steps  conversation conv-libr' in child
    (crashed,) = [line for line in lines if line.startswith(runs.crashed)]
    assert 'unfinished' in crashed and '1 unresolved tool effect' in crashed

    only = ok('tree', runs.orchestrator, '--store', populated.url).splitlines()
    assert len(only) == 2 and only[0].startswith(runs.orchestrator)

    (root,) = json.loads(ok('tree', runs.orchestrator, '--json', '--store', populated.url))
    assert root['status'] == 'completed'
    assert [child['run_id'] for child in root['children']] == [runs.librarian]
    assert root['children'][0]['children'] == []


def test_tree_shows_the_run_a_fork_branched_from(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart('answered')])

    async def fork() -> tuple[str, str, int | None]:
        try:
            agent = Agent(FunctionModel(answer), capabilities=[StepPersistence(store=store, agent_name='support')])
            first = await run_record_for(store, await agent.run('question', conversation_id='support-conv'))
            assert first is not None
            settled = await store.latest_snapshot(run_id=first.run_id)
            branch = await fork_run(store, run_id=first.run_id, new_conversation=True)
            forked = await run_record_for(store, await agent.run('what if?', message_history=branch))
            assert forked is not None and settled is not None
            return first.run_id, forked.run_id, settled.seq
        finally:
            await store.aclose()

    origin, forked, seq = anyio.run(fork)
    (line,) = [line for line in ok('tree', '--store', url).splitlines() if forked in line]
    assert f'forked from {origin} (snapshot {seq})' in line and 'continued from' not in line


def test_events(populated: PopulatedStore) -> None:
    runs = populated.runs
    lines = ok('events', runs.crashed, '--store', populated.url).splitlines()
    assert lines[0].split()[:5] == ['#', 'TIME', '(UTC)', 'STEP', 'KIND']
    assert lines[-2].split()[4:7] == ['tool_call_started', 'deploy', 'call-deploy']
    assert lines[-1].startswith('the log ends with tool_call_started: no closing event, so the run is unfinished')

    failed = ok('events', runs.failed, '--store', populated.url)
    assert 'tool_call_failed' in failed and 'disk full' in failed
    assert failed.splitlines()[-1].split()[4] == 'run_failed'

    events = json.loads(ok('events', runs.orchestrator, '--json', '--store', populated.url))
    assert events[0]['kind'] == 'run_started'
    assert events[-1]['kind'] == 'run_completed'
    assert {event['tool_name'] for event in events if event['tool_name']} == {'delegate'}


def test_effects(populated: PopulatedStore) -> None:
    runs = populated.runs
    table = ok('effects', runs.crashed, '--store', populated.url)
    header, row, note = table.splitlines()
    assert header.split()[:3] == ['TOOL', 'CALL', 'TOOL']
    assert row.split()[:3] == ['call-deploy', 'deploy', 'started']
    assert 'deploy::service-a::v2' in row and 'deploy service-a v2 to production' in row
    assert note.startswith('started with no end: if the run is dead, the side effect may or may not have happened')

    (unresolved,) = json.loads(ok('effects', runs.crashed, '--unresolved', '--json', '--store', populated.url))
    assert unresolved['idempotency_key'] == 'deploy::service-a::v2'
    assert unresolved['unresolved'] is True

    ledger = json.loads(ok('effects', runs.orchestrator, '--json', '--store', populated.url))
    assert [(effect['tool_name'], effect['status'], effect['unresolved']) for effect in ledger] == [
        ('delegate', 'completed', False)
    ]
    assert ok('effects', runs.orchestrator, '--unresolved', '--store', populated.url) == (
        f'run {runs.orchestrator} has no unresolved tool effects\n'
    )


def test_snapshot_renders_messages_and_media(populated: PopulatedStore) -> None:
    text = ok('snapshot', populated.runs.media, '--store', populated.url)
    assert text.splitlines()[0] == 'run media-1  snapshot at step 2  complete  2026-01-02 03:04:05.000 UTC  4 messages'
    assert f'<image/png, {len(BIG_IMAGE):,} bytes, {media_uri_for(BIG_IMAGE)}>' in text
    assert f'<image/png, {len(SMALL_IMAGE):,} bytes, inline>' in text
    assert f'<text/plain, {len(BIG_TEXT):,} bytes, {media_uri_for(BIG_TEXT.encode())}>' in text
    assert 'chars; --full shows all)' in text
    assert 'text         two images and a long log' in text
    full = ok('snapshot', populated.runs.media, '--full', '--store', populated.url)
    assert full.count('line of a long log') == BIG_TEXT.count('line of a long log')


def test_snapshot_json_round_trips_the_history(populated: PopulatedStore) -> None:
    data = json.loads(ok('snapshot', populated.runs.media, '--json', '--store', populated.url))
    assert (data['run_id'], data['state'], data['step_index']) == ('media-1', 'complete', 2)
    messages = ModelMessagesTypeAdapter.validate_python(data['messages'])
    prompt = messages[0].parts[0]
    assert isinstance(prompt, UserPromptPart) and isinstance(prompt.content, list)
    images = [item for item in prompt.content if isinstance(item, BinaryContent)]
    assert [image.data for image in images] == [BIG_IMAGE, SMALL_IMAGE]


def test_snapshot_state_choice(populated: PopulatedStore) -> None:
    runs = populated.runs
    settled = ok('snapshot', runs.crashed, '--store', populated.url)
    assert 'complete' in settled.splitlines()[0] and '1 message' in settled.splitlines()[0]
    assert 'deploy(' not in settled
    frontier = ok('snapshot', runs.crashed, '--include-interrupted', '--store', populated.url)
    assert 'interrupted' in frontier.splitlines()[0]
    assert 'tool call    deploy(version="v2")  id=call-deploy' in frontier


def test_stats(populated: PopulatedStore) -> None:
    stats = json.loads(ok('stats', '--json', '--store', populated.url))
    assert stats['store'] == populated.url
    assert (stats['runs'], stats['interrupted_snapshots'], stats['unresolved_effects']) == (5, 2, 1)
    assert stats['snapshots'] >= 6
    assert stats['events'] == sum(
        len(json.loads(ok('events', run_id, '--json', '--store', populated.url)))
        for run_id in vars(populated.runs).values()
    )
    assert stats['media_blobs'] == 2  # the big image and the big text; the small image stays inline
    table = ok('stats', '--store', populated.url)
    if populated.kind == 'postgres':  # what the server keeps for the prefix's tables
        assert stats['bytes'] > 0 and f'bytes on disk       {stats["bytes"]:,} B' in table
    else:
        on_disk = sum(path.stat().st_size for path in populated.root.rglob('*') if path.is_file())
        assert stats['bytes'] == on_disk
        assert f'bytes on disk       {on_disk:,} B' in table
    assert 'media blobs         2' in table


def test_export_jsonl(populated: PopulatedStore, tmp_path: Path) -> None:
    runs = populated.runs
    lines = [
        json.loads(line)
        for line in ok('export', runs.crashed, '--format', 'jsonl', '--store', populated.url).splitlines()
    ]
    kinds = [line['type'] for line in lines]
    assert kinds == ['run'] + ['event'] * 4 + ['tool_effect'] + ['snapshot'] * 2
    assert lines[0]['agent_name'] == 'deployer'
    assert [snapshot['state'] for snapshot in lines[-2:]] == ['complete', 'interrupted']
    assert lines[5]['idempotency_key'] == 'deploy::service-a::v2'

    target = tmp_path / 'orch.jsonl'
    result = run_cli_inprocess('export', runs.orchestrator, '-o', str(target), '--store', populated.url)
    assert result.returncode == 0 and result.stdout == ''
    assert result.stderr == f'exported run {runs.orchestrator} to {target}\n'
    exported = [json.loads(line) for line in target.read_text().splitlines()]
    assert exported[0] == {'type': 'run', **exported[0]} and exported[0]['run_id'] == runs.orchestrator
    assert exported[-1]['type'] == 'snapshot'


def test_continue_prints_a_history_ready_for_message_history(populated: PopulatedStore) -> None:
    runs = populated.runs
    history = ModelMessagesTypeAdapter.validate_json(ok('continue', runs.librarian, '--store', populated.url))
    store, _ = open_store(populated.kind, populated.root)

    async def latest() -> ContinuableSnapshot | None:
        try:
            return await store.latest_snapshot(run_id=runs.librarian)
        finally:
            await store.aclose()

    snapshot = anyio.run(latest)
    assert snapshot is not None
    assert ModelMessagesTypeAdapter.dump_json(history) == ModelMessagesTypeAdapter.dump_json(snapshot.messages)

    settled = ModelMessagesTypeAdapter.validate_json(ok('continue', runs.crashed, '--store', populated.url))
    frontier = ModelMessagesTypeAdapter.validate_json(
        ok('continue', runs.crashed, '--include-interrupted', '--store', populated.url)
    )
    assert (len(settled), len(frontier)) == (1, 2)


@sqlite_only
@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['events', 'nope'], "no run 'nope' in {url} (`pydantic-ai-steps runs --store {url}` lists them)"),
        (['snapshot', 'nope'], "no run 'nope' in {url}"),
        (['continue', 'nope'], "no run 'nope' in {url}"),
        (['tree', 'nope'], "no run 'nope' in {url}"),
        (['effects', 'nope'], "no run 'nope' in {url}"),
        (['export', 'nope'], "no run 'nope' in {url}"),
    ],
)
def test_unknown_run_is_one_line(populated: PopulatedStore, args: list[str], message: str) -> None:
    result = run_cli_inprocess(*args, '--store', populated.url)
    assert result.returncode == 1
    assert result.stdout == ''
    assert result.stderr.startswith('pydantic-ai-steps: error: ' + message.format(url=populated.url))
    assert result.stderr.count('\n') == 1


async def register_and_close(store: StepStore, record: RunRecord) -> None:
    try:
        await store.register_run(record)
    finally:
        await store.aclose()


def test_no_snapshot_is_one_line(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    anyio.run(register_and_close, store, RunRecord(run_id='bare'))
    for command in ('snapshot', 'continue'):
        result = run_cli_inprocess(command, 'bare', '--store', url)
        assert result.returncode == 1
        assert result.stderr.count('\n') == 1
        assert 'no continuable complete snapshot' in result.stderr or 'has no complete snapshot' in result.stderr
        assert '--include-interrupted also considers interrupted ones' in result.stderr


@pytest.mark.parametrize(
    ('store', 'message'),
    [
        ('sqlite:///{tmp}/missing.db', 'no store at sqlite:///{tmp}/missing.db ({tmp}/missing.db does not exist)'),
        ('file://{tmp}/missing', 'no store at file://{tmp}/missing ({tmp}/missing does not exist)'),
        ('{tmp}/missing', "no store at '{tmp}/missing'; a bare path must end in .db"),
        ('sqlite://host/x.db', "bad SQLite store URL 'sqlite://host/x.db'"),
        (
            'redis://localhost/x',
            "unknown store scheme 'redis:' in 'redis://localhost/x'; known schemes: sqlite:, file:, memory:",
        ),
        ('{tmp}/notes.txt', "'{tmp}/notes.txt' is neither a SQLite database nor a directory"),
    ],
)
def test_store_errors_are_one_line(tmp_path: Path, store: str, message: str) -> None:
    (tmp_path / 'notes.txt').write_text('not a store')
    result = run_cli_inprocess('runs', '--store', store.format(tmp=tmp_path))
    assert result.returncode == 1
    assert result.stdout == ''
    assert result.stderr.startswith('pydantic-ai-steps: error: ' + message.format(tmp=tmp_path))
    assert result.stderr.count('\n') == 1
    assert not (tmp_path / 'missing.db').exists() and not (tmp_path / 'missing').exists()


def test_missing_store_option_and_bad_arguments() -> None:
    # A real `python -m pydantic_ai_steps.cli`: main's return value must become the exit status.
    result = run_cli('runs')
    assert (result.returncode, result.stderr) == (
        1,
        'pydantic-ai-steps: error: no store given: pass --store URL (for example --store sqlite:///steps-demo.db) '
        'or set PYDANTIC_AI_STEPS_STORE\n',
    )
    usage = run_cli_inprocess('export', 'x', '--format', 'csv', '--store', 'x.db')
    assert usage.returncode == 2
    assert "invalid choice: 'csv'" in usage.stderr


@sqlite_only
def test_pipe_is_plain_and_a_terminal_is_coloured(populated: PopulatedStore) -> None:
    piped = run_cli_inprocess('tree', '--store', populated.url)
    assert piped.returncode == 0 and ANSI not in piped.stdout
    if sys.platform == 'win32':
        return
    coloured = run_on_tty('tree', '--store', populated.url)
    assert coloured.returncode == 0
    assert '\x1b[32mcompleted\x1b[0m' in coloured.stdout
    assert '\x1b[33munfinished\x1b[0m' in coloured.stdout
    assert re.sub(r'\x1b\[[0-9;]*m', '', coloured.stdout).strip() == piped.stdout.strip()
    plain = run_on_tty('tree', '--store', populated.url, NO_COLOR='1')
    assert plain.returncode == 0 and ANSI not in plain.stdout
    assert plain.stdout.strip() == piped.stdout.strip()


@sqlite_only
@posix_only
def test_a_terminal_table_fits_its_width(populated: PopulatedStore) -> None:
    narrow = run_on_tty('runs', '--store', populated.url, columns=80, NO_COLOR='1')
    assert narrow.returncode == 0
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines())
    assert 'unfinished' in narrow.stdout  # short columns are not the ones cut
    assert '…' in narrow.stdout


@sqlite_only
@posix_only
def test_long_reads_show_progress_on_a_terminal_only(populated: PopulatedStore) -> None:
    on_tty = run_on_tty('stats', '--store', populated.url)
    assert on_tty.returncode == 0
    assert 'reading runs 1/5' in on_tty.stderr or 'reading runs 5/5' in on_tty.stderr
    assert on_tty.stderr.endswith('\r\x1b[2K')  # erased when done
    assert 'reading runs' not in on_tty.stdout
    piped = run_cli_inprocess('stats', '--store', populated.url)
    assert piped.stderr == ''


@sqlite_only
@posix_only
def test_broken_pipe_is_quiet(populated: PopulatedStore) -> None:
    """`pydantic-ai-steps export ... | head -n 1`: the reader leaving early is not an error."""
    reader = subprocess.Popen(['head', '-n', '1'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    writer = subprocess.Popen(
        [sys.executable, '-m', 'pydantic_ai_steps.cli', 'export', populated.runs.media, '--store', populated.url],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
    )
    assert reader.stdin is not None
    reader.stdin.close()
    _, errors = writer.communicate(timeout=120)
    assert reader.stdout is not None
    with reader.stdout:
        first = reader.stdout.read()
    reader.wait(timeout=120)
    assert json.loads(first)['type'] == 'run'
    assert writer.returncode in (0, 141)
    assert b'Traceback' not in errors and b'Error' not in errors
