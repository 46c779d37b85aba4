"""Readable text for a message history: one block per message, one line (or a few) per part.

Parts are matched by base class and `part_kind`, with a generic fallback, so a part kind added by
a newer pydantic-ai still shows up (by its kind and content) instead of breaking the command.
Binary payloads are never dumped: they show as `<media type, size, URI>`, the URI being the
content address a store externalizes them under. Every text taken from a message goes through
`_render.printable` before it is styled: a history is whatever a model or a tool wrote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pydantic_core
from pydantic_ai.messages import (
    BaseToolCallPart,
    BaseToolReturnPart,
    BinaryContent,
    FileUrl,
    ModelMessage,
    ModelRequest,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    UserPromptPart,
)

from ..media import media_uri_for
from ..store.protocol import ManagedStepStore
from ._render import Style, printable, when

PREVIEW_CHARS = 240
"""How much of a long text a part shows unless `--full` is given."""


@dataclass(frozen=True, kw_only=True)
class MediaPolicy:
    """When the store moves a payload out to its media store: at `threshold_bytes` and above.

    `None` for a store that keeps everything inline, so no URI is claimed for bytes that were
    never externalized.
    """

    threshold_bytes: int | None


def media_policy(store: ManagedStepStore) -> MediaPolicy:
    """The store's own policy: no URI is claimed for bytes a store keeps inline."""
    if store.media_store is None:
        return MediaPolicy(threshold_bytes=None)
    return MediaPolicy(threshold_bytes=store.media_threshold_bytes)


def render_messages(messages: Sequence[ModelMessage], style: Style, policy: MediaPolicy, *, full: bool) -> str:
    """Every message numbered from 1; instructions shown only where they change (pydantic-ai
    repeats them on every request, which would bury the conversation)."""
    blocks: list[str] = []
    instructions: str | None = None
    for number, message in enumerate(messages, start=1):
        blocks.append(_message(number, message, style, policy, full=full, previous_instructions=instructions))
        if isinstance(message, ModelRequest) and message.instructions:
            instructions = message.instructions
    return '\n'.join(blocks)


def _message(
    number: int,
    message: ModelMessage,
    style: Style,
    policy: MediaPolicy,
    *,
    full: bool,
    previous_instructions: str | None,
) -> str:
    lines: list[str] = []
    if isinstance(message, ModelRequest):
        heading = f'#{number} request'
        details = [when(message.timestamp)] if message.timestamp is not None else []
    else:
        heading = f'#{number} response'
        details = [printable(item) for item in (message.model_name, when(message.timestamp)) if item]
    lines.append(style(heading, 'bold') + (style('  ' + '  '.join(details), 'dim') if details else ''))
    if isinstance(message, ModelRequest) and message.instructions and message.instructions != previous_instructions:
        lines.append(_labelled('instructions', _text(message.instructions, policy, full=full), style, 'dim'))
    for part in message.parts:
        lines.append(_part(part, style, policy, full=full))
    return '\n'.join(lines)


def _part(part: object, style: Style, policy: MediaPolicy, *, full: bool) -> str:
    kind = str(getattr(part, 'part_kind', type(part).__name__))
    label = printable(kind.replace('-', ' '))
    if isinstance(part, SystemPromptPart):
        return _labelled('system', _text(part.content, policy, full=full), style, 'dim')
    if isinstance(part, UserPromptPart):
        return _labelled('user', _content(part.content, policy, full=full), style, 'cyan')
    if isinstance(part, TextPart):
        return _labelled('text', _text(part.content, policy, full=full), style, 'green')
    if isinstance(part, ThinkingPart):
        return _labelled('thinking', _text(part.content, policy, full=full), style, 'dim')
    if isinstance(part, BaseToolCallPart):
        call = _clip(f'{part.tool_name}({_arguments(part.args_as_dict())})', full=full)
        return _labelled(label, call + '  ' + style(f'id={printable(part.tool_call_id)}', 'dim'), style, 'magenta')
    if isinstance(part, BaseToolReturnPart):
        head = f'{printable(part.tool_name)}  ' + style(f'id={printable(part.tool_call_id)}', 'dim')
        return _labelled(label, _content(part.content, policy, full=full), style, 'magenta', head=head)
    # Retry prompts and part kinds this module does not know: show what they carry.
    colour = 'yellow' if 'retry' in kind else 'dim'
    tool_name = getattr(part, 'tool_name', None)
    head = None
    if isinstance(tool_name, str):
        head = f'{printable(tool_name)}  ' + style(f'id={printable(str(getattr(part, "tool_call_id", "?")))}', 'dim')
    content = getattr(part, 'content', None)
    if content is not None:
        return _labelled(label, _content(content, policy, full=full), style, colour, head=head)
    return _labelled(label, _clip(repr(part), full=full), style, colour, head=head)


def _labelled(label: str, body: str, style: Style, colour: str, *, head: str | None = None) -> str:
    """`   label        text`, with continuation lines aligned under the text.

    With a `head` (a tool name and call id), a one-line body follows it after a colon and a
    longer one starts on the next line, so numbered source lines stay aligned.
    """
    body_lines = body.split('\n')
    if head is None:
        first, rest = body_lines[0], body_lines[1:]
    elif len(body_lines) == 1:
        first, rest = f'{head}: {body_lines[0]}', []
    else:
        first, rest = head, body_lines
    indent = ' ' * 16
    lines = ['   ' + style(label.ljust(12), colour) + ' ' + first]
    lines.extend(indent + line for line in rest)
    return '\n'.join(line.rstrip() for line in lines)


def _content(content: object, policy: MediaPolicy, *, full: bool) -> str:
    if isinstance(content, str):
        return _text(content, policy, full=full)
    if isinstance(content, BinaryContent):
        return binary_label(content, policy)
    if isinstance(content, FileUrl):
        return printable(f'<{getattr(content, "kind", "url")}, {content.url}>')
    if isinstance(content, list):
        items = cast(list[object], content)
        return '\n'.join(_content(item, policy, full=full) for item in items)
    text = getattr(content, 'content', None)
    if isinstance(text, str):
        return _text(text, policy, full=full)
    return _clip(_json(content), full=full)


def binary_label(content: BinaryContent, policy: MediaPolicy) -> str:
    """`<image/png, 70,001 bytes, media+sha256://...>`, or `inline` for bytes kept in the snapshot."""
    size = len(content.data)
    where = (
        media_uri_for(content.data)
        if policy.threshold_bytes is not None and size >= policy.threshold_bytes
        else 'inline'
    )
    return printable(f'<{content.media_type}, {size:,} bytes, {where}>')


def _text(text: str, policy: MediaPolicy, *, full: bool) -> str:
    encoded = text.encode('utf-8', 'surrogatepass')
    if policy.threshold_bytes is not None and len(encoded) >= policy.threshold_bytes:
        marker = f'<text/plain, {len(encoded):,} bytes, {media_uri_for(encoded)}>'
        return marker + '\n' + _clip(text, full=full)
    return _clip(text, full=full)


def _clip(text: str, *, full: bool) -> str:
    """`text` shortened unless `full`, and made printable (newlines and tabs kept): every text ends here."""
    if full or len(text) <= PREVIEW_CHARS:
        return printable(text, multiline=True)
    return printable(text[:PREVIEW_CHARS].rstrip(), multiline=True) + f'… ({len(text):,} chars; --full shows all)'


def _arguments(args: dict[str, Any]) -> str:
    return ', '.join(f'{key}={_json(value)}' for key, value in args.items())


def _json(value: object) -> str:
    try:
        return json.dumps(pydantic_core.to_jsonable_python(value), ensure_ascii=False)
    except (TypeError, ValueError, pydantic_core.PydanticSerializationError):
        return repr(value)
