"""Nothing the CLI prints from a store reaches the terminal as a raw control sequence.

A store can hold text written by anyone (a model's answer, a tool's error, a run id). Printed
raw, `ESC ] 0 ; ... BEL` retitles the window, `ESC [ 2 J` clears the screen, a bidi override
reverses what follows. Every command is run against a store full of them, into a pipe and with
colour on, and its output must hold no such character except the CLI's own colour codes.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.cli import _app

from .conftest import CliResult, open_store, run_cli, run_cli_inprocess, run_on_tty
from .hostile import EVIL, EVIL_SHOWN, hostile_run_id, populate_hostile, rename_to_hostile

OWN_COLOURS = re.compile(r'\x1b\[(?:[0-9]|3[1-6])(?:;(?:[0-9]|3[1-6]))*m')
"""The SGR sequences `_render.Style` writes (bold, dim, the colours, reset): the only escapes allowed."""
FORBIDDEN = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]')
"""C0 controls but newline and tab, DEL, C1 controls, bidi marks, embeddings, overrides and isolates, line and
paragraph separators."""


@dataclass(frozen=True)
class HostileStore:
    kind: str
    url: str
    run_id: str


@pytest.fixture(scope='module', params=['sqlite', 'file'])
def hostile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HostileStore:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f'hostile-{kind}')
    store, url = open_store(kind, root)

    async def fill() -> None:
        try:
            await populate_hostile(store, kind)
        finally:
            await store.aclose()

    anyio.run(fill)
    if kind == 'sqlite':
        rename_to_hostile(root / 'steps.db')
    return HostileStore(kind, url, hostile_run_id(kind))


def commands(run_id: str) -> dict[str, list[str]]:
    return {
        'runs': ['runs'],
        'runs --agent': ['runs', '--agent', f'agent-{EVIL}'],
        'tree': ['tree'],
        'tree RUN': ['tree', run_id],
        'events': ['events', run_id],
        'effects': ['effects', run_id],
        'effects --unresolved': ['effects', run_id, '--unresolved'],
        'snapshot': ['snapshot', run_id],
        'snapshot --full': ['snapshot', run_id, '--full'],
        'stats': ['stats'],
        'export': ['export', run_id],
        'continue': ['continue', run_id],
        **{
            f'{name} --json': [name, '--json', *rest]
            for name, rest in (
                ('runs', []),
                ('tree', []),
                ('events', [run_id]),
                ('effects', [run_id]),
                ('snapshot', [run_id]),
                ('stats', []),
            )
        },
    }


COMMANDS = list(commands('RUN'))


def assert_no_raw_control(text: str, where: str) -> None:
    rest = OWN_COLOURS.sub('', text)
    found = FORBIDDEN.search(rest)
    assert found is None, (
        f'{where}: raw {found.group()!r} at {found.start()}: {rest[max(found.start() - 60, 0) : found.end() + 20]!r}'
    )


def assert_clean(result: CliResult, where: str) -> None:
    assert result.returncode == 0, f'{where}: {result.stderr}'
    assert_no_raw_control(result.stdout, f'{where} stdout')
    assert_no_raw_control(result.stderr, f'{where} stderr')


def json_documents(name: str, stdout: str) -> list[object]:
    if name == 'export':
        return [json.loads(line) for line in stdout.splitlines()]
    return [json.loads(stdout)]


def holds(value: object, text: str) -> bool:
    """Whether a parsed JSON value has `text` in one of its strings (keys included)."""
    if isinstance(value, str):
        return text in value
    if isinstance(value, dict):
        return any(holds(key, text) or holds(item, text) for key, item in value.items())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, list):
        return any(holds(item, text) for item in value)  # pyright: ignore[reportUnknownVariableType]
    return False


@pytest.mark.parametrize('name', COMMANDS)
@pytest.mark.parametrize('colour', [False, True], ids=['pipe', 'colour'])
def test_no_raw_control_character_reaches_stdout(hostile: HostileStore, name: str, colour: bool) -> None:
    args = commands(hostile.run_id)[name]
    result = run_cli_inprocess(*args, '--store', hostile.url, tty=colour, COLUMNS='600')
    assert_clean(result, name)
    if colour and '--json' not in name and name not in ('export', 'continue', 'stats'):
        assert OWN_COLOURS.search(result.stdout), f'{name}: colour was asked for and none came'
    if name.startswith('stats'):
        return  # totals only: nothing stored is printed
    if '--json' in name or name in ('export', 'continue'):
        # Still the exact values: JSON escapes what it must, and a parser gets EVIL back.
        assert holds(json_documents(name, result.stdout), EVIL), f'{name}: the exact value did not come back'
    else:
        assert EVIL_SHOWN in result.stdout, f'{name}: the stored value is not shown in its escaped form'


def test_multi_line_text_keeps_its_newlines_and_tabs(hostile: HostileStore) -> None:
    stdout = run_cli_inprocess('snapshot', hostile.run_id, '--store', hostile.url).stdout
    assert re.search(r'first line .*\n +second\tline', stdout), stdout
    assert f'text {EVIL_SHOWN}' in stdout and f'model-{EVIL_SHOWN}' in stdout


def test_an_error_naming_a_hostile_run_is_escaped_on_stderr(hostile: HostileStore) -> None:
    result = run_cli_inprocess('events', f'missing-{EVIL}', '--store', hostile.url)
    assert result.returncode == 1
    assert_no_raw_control(result.stderr, 'stderr')
    assert f'missing-{EVIL_SHOWN}' in result.stderr  # 'no run ...', or the File store's run id rule


def test_an_unexpected_error_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever an error's text holds (a store may quote what it read), its one line on stderr is escaped."""
    _app._error(f'ValueError: bad row {EVIL}')
    captured = capsys.readouterr()
    assert captured.err == f'pydantic-ai-steps: error: ValueError: bad row {EVIL_SHOWN}\n'


@pytest.mark.parametrize('hostile', ['file'], indirect=True)  # a run id a command line can carry (no NUL)
def test_the_console_script_in_a_pipe_and_on_a_terminal(hostile: HostileStore) -> None:
    piped = run_cli('snapshot', hostile.run_id, '--store', hostile.url)
    assert_clean(CliResult(piped.returncode, piped.stdout, piped.stderr), 'piped snapshot')
    assert EVIL_SHOWN in piped.stdout
    if sys.platform == 'win32':
        return
    on_tty = run_on_tty('runs', '--store', hostile.url, columns=600)
    assert on_tty.returncode == 0, on_tty.stderr
    assert_no_raw_control(on_tty.stdout, 'runs on a terminal')
    # stderr holds the progress line, drawn and erased with the CLI's own \r and ESC [ 2 K
    assert_no_raw_control(re.sub(r'\r|\x1b\[2K', '', on_tty.stderr), 'runs on a terminal, stderr')
    assert OWN_COLOURS.search(on_tty.stdout) and EVIL_SHOWN in on_tty.stdout


def test_the_fixture_really_is_hostile(hostile: HostileStore, tmp_path: Path) -> None:
    """Guard for the tests above: the store hands back the raw characters they must not see printed."""
    store, _ = open_store(hostile.kind, Path(hostile.url.split('://', 1)[1]).parent)

    async def read() -> object:
        try:
            return await store.get_run(run_id=hostile.run_id)
        finally:
            await store.aclose()

    record = anyio.run(read)
    assert getattr(record, 'agent_name', None) == f'agent-{EVIL}'
    assert FORBIDDEN.search(EVIL) and not FORBIDDEN.search(EVIL_SHOWN)
