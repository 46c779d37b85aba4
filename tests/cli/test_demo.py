"""`pydantic-ai-steps demo` end to end, then every command it suggests, run as it prints them.

The demo's own child process, the one it SIGKILLs, is always real. The newcomer's demo runs once,
as the README spells it (`python -m pydantic_ai_steps demo`, a real process), and the tests of
this module share it; other demos and the commands it suggests run in-process through `main`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sqlite3
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, ToolCallPart

from .conftest import CliResult, open_store, populate_and_close, run_cli, run_cli_inprocess

KEY = 'issue-42::finding::ThinkingPartDelta'
ANSI = '\x1b['
COMMAND = re.compile(r'^\s+\$ pydantic-ai-steps (?P<args>.+?)(?:\s+# .*)?$')


@dataclass(frozen=True)
class DemoRun:
    cwd: Path
    output: str
    orchestrator: str
    crashed: str
    continued: str

    def commands(self) -> list[list[str]]:
        return [shlex.split(match['args']) for line in self.output.splitlines() if (match := COMMAND.match(line))]

    def run(self, args: list[str]) -> str:
        result = run_cli_inprocess(*args, cwd=self.cwd)
        assert result.returncode == 0, f'{args}: {result.stderr}'
        return result.stdout


def play(cwd: Path, *args: str) -> str:
    result = run_cli_inprocess('demo', *args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ''
    return result.stdout


def parse(cwd: Path, output: str) -> DemoRun:
    flat = ' '.join(output.split())  # the narration wraps lines
    orchestrator = re.search(r'The orchestrator \(run (orchestrator-[0-9a-f]{8})\)', flat)
    crashed = re.search(r'inspect_recovery on (code_librarian-[0-9a-f]{8})', flat)
    continued = re.search(r'in this process: (code_librarian-[0-9a-f]{8})', flat)
    assert orchestrator and crashed and continued, output
    return DemoRun(cwd, output, orchestrator[1], crashed[1], continued[1])


@pytest.fixture(scope='module')
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The README's command (`python3 -m pydantic_ai_steps demo`) as a newcomer runs it: no options,
    in an empty directory."""
    cwd = tmp_path_factory.mktemp('demo')
    result = run_cli('demo', cwd=cwd, module='pydantic_ai_steps')  # as the README spells it
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ''
    return parse(cwd, result.stdout)


def test_the_story_is_told_in_numbered_steps(demo: DemoRun) -> None:
    out = demo.output
    assert out.startswith('pydantic-ai-steps demo: StepPersistence through a crash, with no API key\n')
    assert 'store:  sqlite:///steps-demo.db (new)' in out
    assert (demo.cwd / 'steps-demo.db').is_file()
    steps = [int(number) for number in re.findall(r'^(\d+)\. ', out, re.MULTILINE)]
    assert steps == list(range(1, 9))
    flat = ' '.join(out.split())
    assert "find_symbol('ThinkingPartDelta') -> pydantic_ai/messages.py:" in flat
    assert 'post_finding(issue=42) started' in flat
    assert f"idempotency key '{KEY}'" in flat
    assert 'It called only post_finding; the earlier reads came from the snapshot' in flat
    assert re.search(r'Done in \d+\.\d s\.', out)
    assert ANSI not in out


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_the_kill_was_a_real_sigkill(demo: DemoRun) -> None:
    flat = ' '.join(demo.output.split())
    match = re.search(r'killed the librarian\'s process \(pid (\d+), SIGKILL, exit code -9\)', flat)
    assert match, flat
    with pytest.raises(ProcessLookupError):
        os.kill(int(match[1]), 0)  # gone (and reaped), not merely paused


def test_the_side_effect_happened_exactly_once(demo: DemoRun) -> None:
    outbox = demo.cwd / 'steps-demo.outbox.jsonl'
    (comment,) = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert comment['idempotency_key'] == KEY
    assert 'allows a callable' in comment['comment']
    assert comment['written_by'] == 'pydantic-ai-steps demo'  # how a later reset knows the file is its own
    if sys.platform != 'win32':
        assert stat.S_IMODE(outbox.stat().st_mode) == 0o600


def test_every_suggested_command_runs(demo: DemoRun) -> None:
    commands = demo.commands()
    assert {args[0] for args in commands} == {'events', 'tree', 'effects', 'snapshot', 'continue', 'runs', 'stats'}
    for args in commands:
        assert args[-2:] == ['--store', 'sqlite:///steps-demo.db']
        demo.run(args)


def test_tree_shows_what_the_demo_said(demo: DemoRun) -> None:
    lines = demo.run(['tree', '--store', 'sqlite:///steps-demo.db']).splitlines()
    assert lines[0].startswith(f'{demo.orchestrator}  [orchestrator]  completed')
    (crashed,) = [line for line in lines if line[3:].startswith(demo.crashed)]
    assert 'unfinished' in crashed and 'unresolved' not in crashed  # checked, and recorded as checked
    (continued,) = [line for line in lines if demo.continued in line]
    assert 'completed' in continued and f'continued from {demo.crashed}' in continued
    assert [line[:3] for line in lines[1:]] == ['├─ ', '└─ ']


def test_effects_show_the_unresolved_key(demo: DemoRun) -> None:
    assert (
        json.loads(demo.run(['effects', demo.crashed, '--unresolved', '--json', '--store', 'sqlite:///steps-demo.db']))
        == []
    )
    (effect,) = [
        effect
        for effect in json.loads(demo.run(['effects', demo.crashed, '--json', '--store', 'sqlite:///steps-demo.db']))
        if effect['status'] == 'started'
    ]
    assert (effect['tool_name'], effect['status'], effect['idempotency_key']) == ('post_finding', 'started', KEY)
    assert (effect['resolution'], effect['resolved_by']) == ('not_done', 'orchestrator')
    assert f"idempotency key '{KEY}'" in ' '.join(demo.output.split())
    assert effect['tool_call_id'] in demo.output


def test_events_end_mid_tool_for_the_killed_run(demo: DemoRun) -> None:
    events = json.loads(demo.run(['events', demo.crashed, '--json', '--store', 'sqlite:///steps-demo.db']))
    assert (events[-1]['kind'], events[-1]['tool_name']) == ('tool_call_started', 'post_finding')
    assert [event['tool_name'] for event in events if event['kind'] == 'tool_call_completed'] == [
        'find_symbol',
        'read_file',
    ]
    continued = json.loads(demo.run(['events', demo.continued, '--json', '--store', 'sqlite:///steps-demo.db']))
    assert [event['tool_name'] for event in continued if event['kind'] == 'tool_call_started'] == ['post_finding']
    assert continued[-1]['kind'] == 'run_completed'


def test_snapshot_and_continue_match_the_narration(demo: DemoRun) -> None:
    flat = ' '.join(demo.output.split())
    narrated = re.search(
        r'taken at step (\d+): (\d+) messages, every tool call answered \(find_symbol, read_file\)', flat
    )
    assert narrated, flat
    text = demo.run(['snapshot', demo.crashed, '--store', 'sqlite:///steps-demo.db'])
    assert text.splitlines()[0].startswith(f'run {demo.crashed}  snapshot at step {narrated[1]}  complete')
    assert f'{narrated[2]} messages' in text.splitlines()[0]
    assert 'find_symbol(name="ThinkingPartDelta")' in text and 'class ThinkingPartDelta' in text
    assert 'tool call    post_finding' not in text
    history = ModelMessagesTypeAdapter.validate_json(
        demo.run(['continue', demo.crashed, '--store', 'sqlite:///steps-demo.db'])
    )
    assert len(history) == int(narrated[2])
    calls = [
        part.tool_name
        for message in history
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    ]
    assert calls == ['find_symbol', 'read_file']


def test_runs_by_conversation_shows_both_turns(demo: DemoRun) -> None:
    conversation = re.search(r'runs --conversation (\S+)', demo.output)
    assert conversation
    runs = json.loads(
        demo.run(['runs', '--conversation', conversation[1], '--json', '--store', 'sqlite:///steps-demo.db'])
    )
    assert [(run['run_id'], run['status'], run['parent_run_id']) for run in runs] == [
        (demo.crashed, 'unfinished', demo.orchestrator),
        (demo.continued, 'completed', demo.orchestrator),
    ]


def test_stats_after_the_demo(demo: DemoRun) -> None:
    stats = json.loads(demo.run(['stats', '--json', '--store', 'sqlite:///steps-demo.db']))
    assert (stats['runs'], stats['unresolved_effects']) == (3, 0)  # the demo recorded what it checked
    assert stats['bytes'] > 0


README = Path(__file__).parents[2] / 'README.md'
README_RUN, README_CALL = 'code_librarian-2365db30', 'pyd_ai_a759bc53f1484796ac5012d5a26bb69a'
"""The ids of a demo play that the README's commands show: a play draws its own."""


def readme_commands() -> list[list[str]]:
    """The README's example commands for a demo store (the block that resolves a call), as argument lists."""
    blocks = re.findall(r'```bash\n(.*?)```', README.read_text(), flags=re.DOTALL)
    (block,) = [block for block in blocks if 'effects resolve' in block]
    return [shlex.split(line, comments=True) for line in block.replace('\\\n', ' ').splitlines()]


def test_the_readme_commands_work_on_the_demo_store(tmp_path: Path) -> None:
    """Run as the README writes them (with this play's ids), after a demo of their own: one resolves again."""
    demo = parse(tmp_path, play(tmp_path))
    (call,) = [
        effect['tool_call_id']
        for effect in json.loads(demo.run(['effects', demo.crashed, '--json', '--store', 'sqlite:///steps-demo.db']))
        if effect['status'] == 'started'
    ]
    ids = {README_RUN: demo.crashed, README_CALL: call}
    env: dict[str, str | None] = {}
    commands = readme_commands()
    assert any(words[1:3] == ['effects', 'resolve'] for words in commands)
    for words in commands:
        if words[0] == 'export':
            name, value = words[1].split('=', 1)
            env[name] = value
            continue
        assert words[0] == 'pydantic-ai-steps'
        args = [ids.get(word, word) for word in words[1:]]
        result = run_cli_inprocess(*args, cwd=tmp_path, **env)
        assert result.returncode == 0, f'{args}: {result.stderr}'
        if args[:2] == ['effects', 'resolve']:
            without = run_cli_inprocess(*[arg for arg in args if arg != '--replace'], cwd=tmp_path, **env)
            assert without.returncode == 1 and 'is already resolved' in without.stderr
    (effect,) = [
        effect
        for effect in json.loads(demo.run(['effects', demo.crashed, '--json', '--store', 'sqlite:///steps-demo.db']))
        if effect['status'] == 'started'
    ]
    assert (effect['resolution'], effect['resolution_note']) == (
        'not_done',
        'checked the tracker again: no comment carries the key',
    )


def test_reset_keep_and_a_file_store(tmp_path: Path) -> None:
    """On a File store: a second demo with --keep adds runs and does not post twice; a third resets."""
    store = f'file://{tmp_path}/demo-store'
    first = play(tmp_path, '--store', store)
    assert f'store:  {store} (new)' in first
    assert f'--store {store}' in first

    kept = play(tmp_path, '--store', store, '--keep')
    assert 'kept: --keep adds to the runs already there' in kept
    flat = ' '.join(kept.split())
    assert f"found '{KEY}' there: a comment with this key was already posted" in flat
    assert 'the tracker already has a comment with key' in flat
    outbox = tmp_path / 'demo-store' / 'steps-demo.outbox.jsonl'  # inside the store's directory
    assert len(outbox.read_text().splitlines()) == 1  # still one comment
    assert len(json.loads(run_cli_inprocess('runs', '--json', '--store', store).stdout)) == 6

    outbox.write_text(outbox.read_text() * 2)  # two comments, both the demo's: the reset removes them
    reset = play(tmp_path, '--store', store)
    assert 'reset: deleted the 6 runs of the previous demo; --keep keeps them' in reset
    assert len(json.loads(run_cli_inprocess('runs', '--json', '--store', store).stdout)) == 3
    assert len(outbox.read_text().splitlines()) == 1  # this play's comment alone
    assert sorted(path.name for path in tmp_path.iterdir()) == ['demo-store']


@pytest.mark.skipif(sys.platform == 'win32', reason='POSIX file modes')
def test_store_dot_keeps_the_tracker_inside_it(tmp_path: Path) -> None:
    """`--store .`: the tracker goes in `.`, not beside it in the parent, and is owner-only."""
    here = tmp_path / 'here'
    here.mkdir()
    output = play(here, '--store', '.')
    outbox = here / 'steps-demo.outbox.jsonl'
    assert f'where the side effect lands): {outbox}' in output
    assert stat.S_IMODE(outbox.stat().st_mode) == 0o600
    assert sorted(path.name for path in tmp_path.iterdir()) == ['here']


def refused_for_the_tracker(result: CliResult, outbox: Path) -> None:
    assert result.returncode == 1
    assert result.stderr == (
        f'pydantic-ai-steps: error: refusing to use {outbox}: the demo keeps its issue tracker there and did '
        'not write that file; move the file away, or choose another --store\n'
    )


@pytest.mark.parametrize(
    'content',
    [
        'my precious notes\n',
        '',
        '{"idempotency_key": "issue-42::finding::ThinkingPartDelta", "issue": 42, "comment": "mine"}\n',
    ],
    ids=['notes', 'empty', 'unmarked-json'],
)
def test_a_new_store_leaves_a_file_it_did_not_write_alone(tmp_path: Path, content: str) -> None:
    outbox = tmp_path / 'steps-demo.outbox.jsonl'
    outbox.write_text(content)
    refused_for_the_tracker(run_cli_inprocess('demo', cwd=tmp_path), outbox)
    assert outbox.read_text() == content
    assert sorted(path.name for path in tmp_path.iterdir()) == ['steps-demo.outbox.jsonl']  # no store either


@pytest.mark.parametrize('keep', [False, True], ids=['reset', 'keep'])
def test_an_existing_store_leaves_a_file_it_did_not_write_alone(tmp_path: Path, keep: bool) -> None:
    """Neither a reset (which would delete the tracker and the runs) nor --keep (which appends) starts."""
    play(tmp_path, '--store', 'steps-demo.db')
    outbox = tmp_path / 'steps-demo.outbox.jsonl'
    mine = outbox.read_text()
    outbox.write_text(mine + 'and a line of my own\n')
    result = run_cli_inprocess('demo', *(['--keep'] if keep else []), cwd=tmp_path)
    refused_for_the_tracker(result, outbox)
    assert outbox.read_text() == mine + 'and a line of my own\n'
    runs = json.loads(run_cli_inprocess('runs', '--json', '--store', 'steps-demo.db', cwd=tmp_path).stdout)
    assert len(runs) == 3


@pytest.mark.skipif(sys.platform == 'win32', reason='symbolic links')
def test_a_link_in_the_trackers_place_is_not_followed(tmp_path: Path) -> None:
    notes = tmp_path / 'notes.txt'
    notes.write_text('my precious notes\n')
    outbox = tmp_path / 'steps-demo.outbox.jsonl'
    outbox.symlink_to(notes)
    refused_for_the_tracker(run_cli_inprocess('demo', cwd=tmp_path), outbox)
    assert outbox.is_symlink() and notes.read_text() == 'my precious notes\n'


def test_the_demo_never_resets_a_store_it_did_not_write(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    anyio.run(populate_and_close, store)
    result = run_cli_inprocess('demo', '--store', url, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f'pydantic-ai-steps: error: refusing to reset {url}: it holds 5 run(s) the demo')
    assert result.stderr.count('\n') == 1
    assert len(json.loads(run_cli_inprocess('runs', '--json', '--store', url).stdout)) == 5


@pytest.mark.parametrize('kind', ['sqlite', 'file'])
def test_a_run_record_the_demo_cannot_read_is_not_its_own(tmp_path: Path, kind: str) -> None:
    """A run it cannot read may not be the demo's: it refuses to reset, and deletes nothing."""
    if kind == 'sqlite':
        url, outbox = 'sqlite:///steps-demo.db', tmp_path / 'steps-demo.outbox.jsonl'
        play(tmp_path, '--store', url)
        with contextlib.closing(sqlite3.connect(tmp_path / 'steps-demo.db')) as conn, conn:
            conn.execute(
                "INSERT INTO runs (run_id, metadata, started_at) VALUES ('foreign-1', 'not json{', '2024-01-01')"
            )
        unreadable = "run 'foreign-1': run record metadata is not valid JSON"
    else:
        url, outbox = f'file://{tmp_path}/store', tmp_path / 'store' / 'steps-demo.outbox.jsonl'
        play(tmp_path, '--store', url)
        (tmp_path / 'store' / 'foreign-1').mkdir()
        (tmp_path / 'store' / 'foreign-1' / 'run.json').write_text('not json{')
        unreadable = f'run record {tmp_path}/store/foreign-1/run.json: not valid JSON'
    tracker = outbox.read_text()
    result = run_cli_inprocess('demo', '--store', url, cwd=tmp_path)
    assert result.returncode == 1
    *warnings, error = result.stderr.splitlines()
    assert warnings and all(line.startswith('skipping unreadable run record') for line in warnings)
    assert error.startswith(
        f'pydantic-ai-steps: error: refusing to reset {url}: it holds 1 run record(s) the demo cannot read, so it '
        f'cannot tell whether it wrote them (first: {unreadable}'
    )
    assert error.endswith('); pass --keep to add to it, or choose another --store')
    assert len(json.loads(run_cli_inprocess('runs', '--json', '--store', url, cwd=tmp_path).stdout)) == 3
    assert outbox.read_text() == tracker


def test_model_without_its_key_is_one_line(tmp_path: Path) -> None:
    result = run_cli_inprocess('demo', '--model', 'openai:gpt-5', cwd=tmp_path, OPENAI_API_KEY=None)
    assert result.returncode == 1
    assert result.stderr == (
        'pydantic-ai-steps: error: --model openai:gpt-5 needs OPENAI_API_KEY set; '
        'without --model the demo uses scripted models\n'
    )
    assert not (tmp_path / 'steps-demo.db').exists()


@pytest.mark.server
def test_the_demo_and_every_command_it_suggests_on_postgres(tmp_path: Path) -> None:
    """`--store postgresql://...`: the story, the SIGKILLed child writing to the server, every command shown."""
    from tests.conftest import require_env
    from tests.postgres.conftest import drop_prefix

    dsn = require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']
    prefix = f't_demo_{os.getpid()}'
    store = f'{dsn}?table={prefix}'
    try:
        first = parse(tmp_path, play(tmp_path, '--store', store))
        assert f'store:  {store} (new)' in first.output
        commands = first.commands()
        assert commands and all(args[-2:] == ['--store', store] for args in commands)
        for args in commands:
            first.run(args)
        assert json.loads(first.run(['effects', first.crashed, '--unresolved', '--json', '--store', store])) == []
        effects = json.loads(first.run(['effects', first.crashed, '--json', '--store', store]))
        (checked,) = [effect for effect in effects if effect['status'] == 'started']
        assert (checked['idempotency_key'], checked['resolution']) == (KEY, 'not_done')  # the demo checked it
        kept = play(tmp_path, '--store', store, '--keep')
        assert 'the tracker already has a comment with key' in ' '.join(kept.split())
        assert len((tmp_path / 'steps-demo.outbox.jsonl').read_text().splitlines()) == 1  # posted once
        assert len(json.loads(first.run(['runs', '--json', '--store', store]))) == 6
    finally:
        drop_prefix(dsn, prefix)


def test_the_demo_prints_paths_with_control_characters_escaped(tmp_path: Path) -> None:
    result = run_cli_inprocess('demo', '--store', str(tmp_path / 'steps\x1b]0;pwned\x07.db'), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '\x1b' not in result.stdout and '\x07' not in result.stdout
    assert 'steps\\x1b]0;pwned\\x07.outbox.jsonl' in result.stdout  # the issue tracker beside the store
