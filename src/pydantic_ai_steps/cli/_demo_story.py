"""The demo's cast: an orchestrator, a `code_librarian`, their tools and their scripted models.

Shared by the demo (parent process) and its worker (the child process the demo kills), so the
librarian that crashes and the librarian that continues are the same agent with the same tools.

The librarian investigates the pydantic-ai source installed next to this package (real files,
read through tools), and its side-effecting tool posts a comment to an "issue tracker": a JSON
lines file beside the store, the demo's stand-in for GitHub. The scripted models decide what to
call from the history they are given, so a continued run picks up where the snapshot left off.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pydantic_ai
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ..step_persistence import StepPersistence, StepStore, annotate_tool_effect
from ._errors import CliError

QUESTION = 'Find ThinkingPartDelta and confirm the callable allowance'
FOLLOW_UP = 'Continue the investigation from where you stopped and post the finding.'
SYMBOL = 'ThinkingPartDelta'
ISSUE = 42
DEMO_METADATA = {'written_by': 'pydantic-ai-steps demo'}
"""Tags every demo run, so a reset can prove a store holds nothing but demo runs."""

SOURCE_ROOT = Path(pydantic_ai.__file__).resolve().parent.parent
"""The directory holding the installed `pydantic_ai` package: the librarian's codebase."""

LIBRARIAN_INSTRUCTIONS = (
    'You are a code librarian. Use find_symbol to locate a symbol, read_file to read around it, then '
    f'post_finding(issue={ISSUE}, ...) with what you found, then answer in one sentence.'
)
ORCHESTRATOR_INSTRUCTIONS = 'Delegate code questions to ask_librarian and report its answer.'

PROVIDER_KEYS = {
    'openai': ('OPENAI_API_KEY',),
    'anthropic': ('ANTHROPIC_API_KEY',),
    'google-gla': ('GOOGLE_API_KEY', 'GEMINI_API_KEY'),
    'gemini': ('GOOGLE_API_KEY', 'GEMINI_API_KEY'),
    'groq': ('GROQ_API_KEY',),
    'mistral': ('MISTRAL_API_KEY',),
    'cohere': ('CO_API_KEY',),
    'deepseek': ('DEEPSEEK_API_KEY',),
    'openrouter': ('OPENROUTER_API_KEY',),
    'grok': ('XAI_API_KEY',),
    'xai': ('XAI_API_KEY',),
}
"""Providers whose key `--model` checks up front, to fail with one line instead of mid-story."""


def check_model(name: str) -> None:
    """Fail early and clearly when `--model` cannot work here (no key, provider not installed).

    Not exercised by the tests: no API keys exist where they run. The path is kept minimal for
    that reason: check the key, build the model once, and hand the name to pydantic-ai.
    """
    provider = name.split(':', 1)[0] if ':' in name else ''
    keys = PROVIDER_KEYS.get(provider)
    if keys is not None and not any(os.environ.get(key) for key in keys):
        raise CliError(f'--model {name} needs {" or ".join(keys)} set; without --model the demo uses scripted models')
    from pydantic_ai.models import infer_model

    try:
        infer_model(name)
    except (ImportError, ValueError) as error:
        raise CliError(f'--model {name}: {" ".join(str(error).split())}') from None


# --- the issue tracker the side-effecting tool writes to -------------------------------------


@dataclass(frozen=True)
class Outbox:
    """Comments "posted" to the tracker: one JSON line each, keyed by idempotency key.

    Every line carries the demo's mark, so the demo can tell its own tracker from a file of the
    same name that it must not touch. The file is owner-only (0o600) like the store's own files.
    """

    path: Path

    def has(self, key: str) -> bool:
        return any(entry.get('idempotency_key') == key for entry in self.entries())

    def entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text(encoding='utf-8').splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def post(self, key: str, issue: int, text: str) -> None:
        entry = {**DEMO_METADATA, 'idempotency_key': key, 'issue': issue, 'comment': text}
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0)
        fd = os.open(self.path, flags, 0o600)
        with os.fdopen(fd, 'a', encoding='utf-8') as handle:
            handle.write(json.dumps(entry) + '\n')

    def foreign(self) -> bool:
        """Whether something the demo did not write is at `path` (absent is not foreign).

        Only a regular file whose every line is a comment with the demo's mark is the demo's;
        anything else (another file, a link, a directory, an empty file) is left alone.
        """
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot look: not known to be the demo's
        if not stat.S_ISREG(info.st_mode):
            return True
        try:
            lines = [line for line in self.path.read_text(encoding='utf-8').splitlines() if line.strip()]
        except (OSError, ValueError):
            return True
        return not lines or not all(_marked(line) for line in lines)

    def remove(self) -> None:
        """Delete the demo's own tracker; the caller checked `foreign()` first."""
        self.path.unlink(missing_ok=True)


def _marked(line: str) -> bool:
    """A line the demo wrote: a JSON object carrying its mark."""
    try:
        entry: object = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and cast(dict[str, object], entry).get('written_by') == DEMO_METADATA['written_by']


def idempotency_key(issue: int, symbol: str) -> str:
    """The same question posted to the same issue is the same effect, whichever run posts it."""
    return f'issue-{issue}::finding::{symbol}'


# --- the librarian's tools --------------------------------------------------------------------


@dataclass(frozen=True)
class ToolHooks:
    """How tool activity reaches the narrator, and what happens just before the side effect.

    The worker's `before_side_effect` tells the parent the effect is in flight and then stalls
    like a slow network call, which is where the parent's SIGKILL lands.
    """

    say: Callable[[str], None]
    before_side_effect: Callable[[str], Awaitable[None]]


def find_symbol(name: str) -> str:
    """`path:line` of the first `class NAME` / `def NAME` in the installed pydantic_ai package."""
    pattern = re.compile(rf'^\s*(?:class|def|async def)\s+{re.escape(name)}\b')
    package = SOURCE_ROOT / 'pydantic_ai'
    for path in sorted(package.rglob('*.py')):
        with path.open(encoding='utf-8', errors='replace') as handle:
            for number, line in enumerate(handle, start=1):
                if pattern.match(line):
                    return f'{path.relative_to(SOURCE_ROOT).as_posix()}:{number}'
    return f'{name} not found'


def read_file(path: str, start_line: int, end_line: int) -> str:
    """Numbered lines `start_line..end_line` of a file under the source root (no escaping it)."""
    target = (SOURCE_ROOT / path).resolve()
    if SOURCE_ROOT not in target.parents or not target.is_file():
        return f'no such file: {path}'
    lines = target.read_text(encoding='utf-8', errors='replace').splitlines()
    start, end = max(start_line, 1), min(end_line, len(lines))
    return '\n'.join(f'{number}: {lines[number - 1]}' for number in range(start, end + 1))


def build_librarian(
    store: StepStore, model: Model | str, hooks: ToolHooks, outbox: Outbox, *, parent_run_id: str | None = None
) -> Agent[None, str]:
    librarian = Agent[None, str](
        model,
        deps_type=type(None),
        name='code_librarian',
        instructions=LIBRARIAN_INSTRUCTIONS,
        capabilities=[
            StepPersistence(
                store=store, agent_name='code_librarian', parent_run_id=parent_run_id, metadata=dict(DEMO_METADATA)
            )
        ],
    )

    @librarian.tool_plain(name='find_symbol')
    def _find_symbol(name: str) -> str:
        """Locate the definition of a class or function in the codebase."""
        found = find_symbol(name)
        hooks.say(f'find_symbol({name!r}) -> {found}')
        return found

    @librarian.tool_plain(name='read_file')
    def _read_file(path: str, start_line: int, end_line: int) -> str:
        """Read numbered lines of a source file."""
        text = read_file(path, start_line, end_line)
        hooks.say(f'read_file({path!r}, lines {start_line}-{end_line}) -> {len(text.splitlines())} lines')
        return text

    @librarian.tool(name='post_finding')
    async def _post_finding(ctx: RunContext[None], issue: int, symbol: str, finding: str) -> str:
        """Post a finding as a comment on an issue (a side effect: do it once)."""
        key = idempotency_key(issue, symbol)
        await annotate_tool_effect(
            store, ctx, idempotency_key=key, effect_summary=f'comment on issue #{issue} about {symbol}'
        )
        hooks.say(f'post_finding(issue={issue}) started: posting a comment, idempotency key {key!r}')
        await hooks.before_side_effect(key)
        if outbox.has(key):  # the idempotent part: a retried call must not post twice
            hooks.say(f'post_finding: the tracker already has a comment with key {key!r}; not posting again')
            return f'already posted on issue #{issue}'
        outbox.post(key, issue, finding)
        hooks.say(f'post_finding: comment posted on issue #{issue}')
        return f'posted on issue #{issue}'

    return librarian


def build_orchestrator(
    store: StepStore, model: Model | str, *, run_id: str, ask_librarian: Callable[[str], Awaitable[str]]
) -> Agent[None, str]:
    orchestrator = Agent[None, str](
        model,
        deps_type=type(None),
        name='orchestrator',
        instructions=ORCHESTRATOR_INSTRUCTIONS,
        capabilities=[
            StepPersistence(store=store, agent_name='orchestrator', run_id=run_id, metadata=dict(DEMO_METADATA))
        ],
    )

    @orchestrator.tool_plain(name='ask_librarian')
    async def _ask_librarian(question: str) -> str:
        """Delegate a question about the codebase to the code librarian."""
        return await ask_librarian(question)

    return orchestrator


# --- the scripted models ------------------------------------------------------------------------


def _returns(messages: list[ModelMessage]) -> dict[str, str]:
    """The latest return of each tool in the history, by tool name."""
    found: dict[str, str] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found[part.tool_name] = part.model_response_str()
    return found


def _call(tool: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, args)])


def librarian_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """find_symbol, then read_file around it, then post_finding, then answer.

    It reads the tool results it was given (the location, the source lines), so its finding is
    about the real installed code, and a continued run resumes at the first step not yet done.
    """
    del info
    done = _returns(messages)
    if 'find_symbol' not in done:
        return _call('find_symbol', name=SYMBOL)
    location = done['find_symbol']
    path, _, line = location.rpartition(':')
    if 'read_file' not in done:
        start = int(line) if line.isdigit() else 1
        return _call('read_file', path=path, start_line=start, end_line=start + 30)
    if 'post_finding' not in done:
        return _call('post_finding', issue=ISSUE, symbol=SYMBOL, finding=_finding(location, done['read_file']))
    return ModelResponse(parts=[TextPart(f'{_finding(location, done["read_file"])} ({done["post_finding"]}).')])


def _finding(location: str, source: str) -> str:
    evidence = next((line for line in source.splitlines() if 'callable' in line.lower()), None)
    if evidence is None:
        return f'{SYMBOL} is defined at {location}; no callable allowance found near it'
    number, _, text = evidence.partition(': ')
    return f'{SYMBOL} is defined at {location}; line {number} allows a callable: "{text.strip()}"'


def orchestrator_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask the librarian the user's question, then relay the answer."""
    del info
    done = _returns(messages)
    if 'ask_librarian' not in done:
        prompt = next(
            (
                part.content
                for message in messages
                if isinstance(message, ModelRequest)
                for part in message.parts
                if isinstance(part, UserPromptPart) and isinstance(part.content, str)
            ),
            QUESTION,
        )
        return _call('ask_librarian', question=prompt)
    return ModelResponse(parts=[TextPart(f'The code librarian reports: {done["ask_librarian"]}')])


def librarian_model(name: str | None) -> Model | str:
    return name if name is not None else FunctionModel(librarian_script, model_name='scripted-librarian')


def orchestrator_model(name: str | None) -> Model | str:
    return name if name is not None else FunctionModel(orchestrator_script, model_name='scripted-orchestrator')
