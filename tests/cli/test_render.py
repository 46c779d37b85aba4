"""Rendering pieces on their own: tables, trees, colour rules, message text, media labels."""

from __future__ import annotations

import io
import json

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from pydantic_ai_steps.cli._messages import MediaPolicy, binary_label, media_policy, render_messages
from pydantic_ai_steps.cli._render import (
    ProgressLine,
    Style,
    TreeNode,
    colour_enabled,
    json_printable,
    printable,
    size,
    table,
    terminal_safe,
    tree,
)
from pydantic_ai_steps.media import media_uri_for
from pydantic_ai_steps.step_persistence import InMemoryStepStore

PLAIN = Style(False)
COLOUR = Style(True)


class _Tty(io.StringIO):
    def __init__(self, encoding: str = 'utf-8') -> None:
        super().__init__()
        self._encoding = encoding

    def isatty(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def test_table_aligns_columns_and_has_no_trailing_spaces() -> None:
    text = table(['ID', 'STATUS'], [['a', 'completed'], ['longer-id', ('failed', 'red')]], PLAIN)
    assert text.splitlines() == ['ID         STATUS', 'a          completed', 'longer-id  failed']


def test_table_colours_only_when_enabled() -> None:
    rows = [['x', ('failed', 'red')]]
    assert '\x1b[' not in table(['A', 'B'], rows, PLAIN)
    coloured = table(['A', 'B'], rows, COLOUR)
    assert '\x1b[31mfailed\x1b[0m' in coloured
    assert '\x1b[1mA' in coloured  # bold header


def test_table_fits_a_terminal_width_by_cutting_the_widest_column() -> None:
    rows = [['short', 'x' * 80]]
    text = table(['A', 'B'], rows, PLAIN, width=40)
    assert all(len(line) <= 40 for line in text.splitlines())
    assert text.splitlines()[1].endswith('…')
    assert 'x' * 80 in table(['A', 'B'], rows, PLAIN)  # no width (a pipe): nothing is cut


def test_headerless_table() -> None:
    assert table(None, [['runs', '3'], ['media blobs', '1']], PLAIN) == 'runs         3\nmedia blobs  1'


def test_tree_uses_box_drawing_or_ascii_by_encoding() -> None:
    roots = [TreeNode('root', [TreeNode('a', [TreeNode('a1', [])]), TreeNode('b', [])])]
    assert tree(roots, _Tty('utf-8')).splitlines() == ['root', '├─ a', '│  └─ a1', '└─ b']
    assert tree(roots, _Tty('ascii')).splitlines() == ['root', '|- a', '|  `- a1', '`- b']


def test_colour_needs_a_tty_and_no_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('NO_COLOR', raising=False)
    assert colour_enabled(_Tty())
    assert not colour_enabled(io.StringIO())
    monkeypatch.setenv('NO_COLOR', '1')
    assert not colour_enabled(_Tty())
    monkeypatch.setenv('NO_COLOR', '')  # no-color.org: only a non-empty value disables
    assert colour_enabled(_Tty())


def test_size_is_exact_and_readable() -> None:
    assert size(512) == '512 B'
    assert size(110_592) == '110,592 B (108.0 KiB)'
    assert size(3 * 1024**3) == '3,221,225,472 B (3.0 GiB)'


def test_progress_draws_on_a_terminal_and_erases_itself() -> None:
    stream = _Tty()
    with ProgressLine('reading runs', stream) as progress:
        progress(1, 3)
        progress(3, 3)
    assert stream.getvalue().startswith('\rreading runs 1/3')
    assert 'reading runs 3/3' in stream.getvalue()
    assert stream.getvalue().endswith('\r\x1b[2K')


def test_progress_is_silent_off_a_terminal() -> None:
    stream = io.StringIO()
    with ProgressLine('reading runs', stream) as progress:
        progress(1, 1)
    assert stream.getvalue() == ''


def test_binary_label_names_the_uri_only_when_externalized() -> None:
    big = BinaryContent(b'\x00' * 70_000, media_type='image/png')
    small = BinaryContent(b'\x00' * 10, media_type='audio/wav')
    policy = MediaPolicy(threshold_bytes=65_536)
    assert binary_label(big, policy) == f'<image/png, 70,000 bytes, {media_uri_for(big.data)}>'
    assert binary_label(small, policy) == '<audio/wav, 10 bytes, inline>'
    assert binary_label(big, MediaPolicy(threshold_bytes=None)) == '<image/png, 70,000 bytes, inline>'


def test_media_policy_reads_the_store() -> None:
    assert media_policy(InMemoryStepStore()).threshold_bytes is None  # keeps everything inline

    class Externalizing:
        media_store = object()
        media_threshold_bytes = 1000

    assert media_policy(Externalizing()).threshold_bytes == 1000


def test_messages_render_parts_readably() -> None:
    messages = [
        ModelRequest(
            parts=[
                UserPromptPart(['look', BinaryContent(b'12345', media_type='image/jpeg'), ImageUrl('https://x/y.png')])
            ],
            instructions='Be brief.',
        ),
        ModelResponse(parts=[ToolCallPart('read', {'path': 'a.py'}, tool_call_id='c1')], model_name='m'),
        ModelRequest(
            parts=[ToolReturnPart('read', '1: first\n2: second', tool_call_id='c1')], instructions='Be brief.'
        ),
        ModelResponse(parts=[TextPart('done')]),
    ]
    text = render_messages(messages, PLAIN, MediaPolicy(threshold_bytes=65_536), full=False)
    assert '#1 request' in text
    assert text.count('instructions') == 1  # repeated instructions are not shown again
    assert '<image/jpeg, 5 bytes, inline>' in text
    assert '<image-url, https://x/y.png>' in text
    assert 'tool call    read(path="a.py")  id=c1' in text
    # A multi-line tool return starts under its header, lines aligned:
    assert 'tool return  read  id=c1\n                1: first\n                2: second' in text
    assert 'text         done' in text


def test_long_text_is_clipped_unless_full_and_large_text_names_its_uri() -> None:
    long = 'word ' * 20_000  # 100,000 bytes
    messages = [ModelResponse(parts=[TextPart(long)])]
    policy = MediaPolicy(threshold_bytes=65_536)
    clipped = render_messages(messages, PLAIN, policy, full=False)
    assert f'<text/plain, 100,000 bytes, {media_uri_for(long.encode())}>' in clipped
    assert '(100,000 chars; --full shows all)' in clipped
    assert len(clipped) < 1000
    assert long.strip() in render_messages(messages, PLAIN, policy, full=True)


# -- stored text is shown, never obeyed -------------------------------------------------------------


def test_printable_shows_controls_as_escapes_and_keeps_the_rest() -> None:
    assert printable('ok \x1b]0;title\x07 \x9b2J \u202egnp.exe \x7f é ✓') == (
        r'ok \x1b]0;title\x07 \x9b2J \u202egnp.exe \x7f é ✓'
    )
    assert printable('a\tb\nc\rd') == r'a\tb\nc\rd'  # one line: a value never breaks the layout
    assert printable('a\tb\nc\rd', multiline=True) == 'a\tb\nc\\rd'  # blocks keep newlines and tabs
    assert printable('\ud800') == r'\ud800'  # a lone surrogate would make writing to stdout fail
    assert printable('C:\\x1b') == 'C:\\x1b'  # backslashes are left alone (--json gives exact values)


BIDI_AND_SEPARATORS = [
    '\u061c',  # ALM
    '\u200e',  # LRM
    '\u200f',  # RLM
    *map(chr, range(0x202A, 0x202F)),  # LRE, RLE, PDF, LRO, RLO
    *map(chr, range(0x2066, 0x206A)),  # LRI, RLI, FSI, PDI
    '\u2028',  # line separator
    '\u2029',  # paragraph separator
]


@pytest.mark.parametrize('character', BIDI_AND_SEPARATORS, ids=lambda character: f'U+{ord(character):04X}')
def test_bidi_marks_and_separators_are_escaped_everywhere(character: str) -> None:
    """A run id that reorders or splits as it is shown would display as another one."""
    shown = f'\\u{ord(character):04x}'
    text = f'run-{character}-1'
    assert printable(text) == printable(text, multiline=True) == f'run-{shown}-1'
    assert terminal_safe(COLOUR(text, 'red')) == COLOUR(f'run-{shown}-1', 'red')
    value = {'tool': text}
    assert json_printable(json.dumps(value, ensure_ascii=False)) == f'{{"tool": "run-{shown}-1"}}'


def test_terminal_safe_keeps_only_the_colours_style_writes() -> None:
    ours = COLOUR('failed', 'red') + ' ' + COLOUR('x', 'yellow', 'bold')
    assert terminal_safe(ours) == ours
    assert terminal_safe('\x1b[8mhidden\x1b[2J\x1b]0;t\x07') == r'\x1b[8mhidden\x1b[2J\x1b]0;t\x07'


def test_json_printable_escapes_what_json_dumps_leaves_raw() -> None:
    value = {'k\u202e': 'DEL\x7f C1\x9b bidi\u2066 esc\x1b'}
    text = json_printable(json.dumps(value, ensure_ascii=False))
    assert text == '{"k\\u202e": "DEL\\u007f C1\\u009b bidi\\u2066 esc\\u001b"}'
    assert json.loads(text) == value


def test_table_escapes_cells_before_measuring_them() -> None:
    text = table(['ID', 'AGENT'], [['\x1b[2Jrun', 'a'], ['r2', ('\x9bfailed', 'red')]], COLOUR)
    lines = text.splitlines()
    assert lines[1] == r'\x1b[2Jrun  a'
    assert lines[2] == 'r2' + ' ' * 10 + '\x1b[31m' + r'\x9bfailed' + '\x1b[0m'
    assert lines[2].index('\x1b[31m') == lines[1].index('a')  # columns aligned on the escaped text


def test_messages_escape_every_stored_text_and_keep_their_colours() -> None:
    evil = '\x1b]0;t\x07'
    messages = [
        ModelRequest(parts=[UserPromptPart([f'hi {evil}\nline 2', BinaryContent(b'1', media_type=f'x/{evil}')])]),
        ModelResponse(parts=[ToolCallPart(evil, {evil: evil}, tool_call_id=evil)], model_name=evil),
        ModelRequest(parts=[ToolReturnPart(evil, evil, tool_call_id=evil)]),
    ]
    text = render_messages(messages, COLOUR, MediaPolicy(threshold_bytes=None), full=False)
    assert '\x07' not in text and '\x1b]' not in text
    shown = r'\x1b]0;t\x07'
    assert f'hi {shown}\n' in text and f'<x/{shown}, 1 bytes, inline>' in text
    assert f'{shown}({shown}="\\u001b]0;t\\u0007")' in text  # a tool call: its name, then arguments as JSON
    assert f'id={shown}' in text and '\x1b[35m' in text and '\x1b[2m' in text  # still coloured
