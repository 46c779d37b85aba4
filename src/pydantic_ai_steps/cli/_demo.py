"""`pydantic-ai-steps demo`: the seeds' story, played for real in a few seconds.

An orchestrator delegates to a `code_librarian` running in a child process. The librarian reads
source files through tools and starts a side-effecting tool (annotated with
`annotate_tool_effect`); the demo SIGKILLs the child in the middle of that tool. The
orchestrator's own tool then does what a production orchestrator would: inspect the store (run
tree, the unresolved effect and its idempotency key), check the key against the system the effect
writes to, and continue the librarian from its last complete snapshot. Every step is narrated
with the inspector command that shows it, so the demo doubles as a tour of the CLI.

Scripted `FunctionModel`s play both agents unless `--model` names a real one, so no key or
network is needed.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TextIO, cast

import anyio
import anyio.to_thread
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart

from ..step_persistence import continue_run
from ..step_persistence.recovery import inspect_recovery
from ..store.protocol import ManagedStepStore
from ..store.registry import StoreLocation
from . import _inspect
from ._commands import tree_node
from ._demo_story import (
    DEMO_METADATA,
    FOLLOW_UP,
    QUESTION,
    Outbox,
    ToolHooks,
    build_librarian,
    build_orchestrator,
    check_model,
    librarian_model,
    orchestrator_model,
)
from ._errors import CliError
from ._output import writing
from ._render import Style, terminal_safe, terminal_width, tree
from ._stores import STORE_VARIABLE, locate

PROG = 'pydantic-ai-steps'
WORKER_TIMEOUT_SECONDS = 120.0
"""Upper bound on the child process: a wedged worker must fail the demo, not hang it."""
OUTBOX_SUFFIX = '.outbox.jsonl'
OUTBOX_NAME = 'steps-demo' + OUTBOX_SUFFIX


def run_demo(*, store: str, keep: bool, model: str | None, stream: TextIO) -> int:
    """Play the story on `store`; returns the exit code."""
    location = locate(store)
    if model is not None:
        check_model(model)
    demo = _Demo(location, model=model, out=_Narrator(stream))
    anyio.run(demo.play, keep)
    return 0


def outbox_for(location: StoreLocation) -> Outbox:
    """The demo's issue tracker, kept with the store: beside a SQLite file (`steps-demo.db` ->
    `steps-demo.outbox.jsonl`), inside a File store's directory (which ignores files that are not
    run folders, and `--store .` must not write outside `.`), in the current directory for a
    server's store."""
    if location.scheme.scheme == 'sqlite':
        path = Path(location.target).resolve()
        return Outbox(path.with_name(path.stem + OUTBOX_SUFFIX))
    if location.scheme.scheme == 'file':
        return Outbox(Path(location.target).resolve() / OUTBOX_NAME)
    return Outbox(Path(OUTBOX_NAME).resolve())


class _Narrator:
    """Numbered plain-English steps, each followed by the commands that show what it describes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.style = Style.for_stream(stream)
        self.width = min(terminal_width(stream) or 100, 100)
        self._number = 0
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        """Write `text` and a newline, escaped as `Output.line` escapes it: the demo shows what a
        model (`--model`) answered and paths the user gave."""
        with self._lock, writing('stdout'):
            self.stream.write(terminal_safe(text) + '\n')
            self.stream.flush()

    def line(self, text: str = '') -> None:
        self._write(text)

    def step(self, text: str) -> None:
        self._number += 1
        label = f'{self._number}. '
        body = textwrap.fill(text, self.width, initial_indent=label, subsequent_indent=' ' * len(label))
        self._write('\n' + self.style(label, 'bold') + body[len(label) :])

    def detail(self, text: str) -> None:
        self._write(textwrap.fill(text, self.width, initial_indent='   - ', subsequent_indent='     '))

    def block(self, text: str) -> None:
        self._write(textwrap.indent(text, '     '))

    def command(self, arguments: str, note: str = '') -> None:
        shown = self.style(f'$ {PROG} {arguments}', 'cyan')
        self._write(f'   {shown}' + (f'   {self.style("# " + note, "dim")}' if note else ''))


@dataclass
class _WorkerOutcome:
    pid: int
    returncode: int
    killed_during: str | None
    """The idempotency key of the side effect in flight when the process was killed."""
    output: str | None


class _Demo:
    def __init__(self, location: StoreLocation, *, model: str | None, out: _Narrator) -> None:
        self.location = location
        self.model = model
        self.out = out
        self.outbox = outbox_for(location)
        session = secrets.token_hex(4)
        self.orchestrator_run_id = f'orchestrator-{session}'
        self.orchestrator_conversation = f'demo-{session}-orchestrator'
        self.librarian_conversation = f'demo-{session}-librarian'
        self.store: ManagedStepStore | None = None

    def cmd(self, arguments: str, note: str = '') -> None:
        self.out.command(f'{arguments} --store {self.location.url}', note)

    async def play(self, keep: bool) -> None:
        started = time.monotonic()
        self.store = self.location.open()
        try:
            note = await self._prepare_store(keep)
            await self._tell(note)
        finally:
            await self.store.aclose()  # closing also checkpoints SQLite's write-ahead log
        self.out.line(f'\nDone in {time.monotonic() - started:.1f} s. Run `{PROG} --help` for every command.')

    async def _tell(self, note: str) -> None:
        out = self.out
        out.line(out.style(f'{PROG} demo', 'bold') + ': StepPersistence through a crash, with no API key')
        out.line(f'store:  {self.location.url} ({note})')
        out.line(f'models: {self.model or "scripted FunctionModels (no network)"}')
        out.line(f'issue tracker stand-in (where the side effect lands): {self.outbox.path}')

        orchestrator = build_orchestrator(
            self._store,
            orchestrator_model(self.model),
            run_id=self.orchestrator_run_id,
            ask_librarian=self._ask_librarian,
        )
        result = await orchestrator.run(QUESTION, conversation_id=self.orchestrator_conversation)

        out.step(f'The orchestrator got the librarian\'s answer and finished its run: "{result.output}"')
        out.line('   The run tree now (the killed run stays unfinished: the store never rewrites history):')
        await self._print_tree()
        self.cmd('tree')
        self.cmd('runs')
        self.cmd('stats')

    async def _prepare_store(self, keep: bool) -> str:
        """Remove the runs the demo wrote last time unless `--keep`; never anything else.

        The demo deletes only runs it can read and that carry its own mark (`written_by`), through
        the store like any application would; a store holding any other run, or a run record the
        demo cannot read (whose mark it cannot see), is refused, and the directory or file the
        store lives in is never removed. Its issue tracker likewise: removed or appended to only if
        every line of it is the demo's.
        """
        store = self._store
        probe = await store.probe()
        if not probe.readable:
            raise CliError(f'refusing to use {self.location.url}: it cannot be read ({probe.detail})')
        if probe.exists and not probe.step_store:
            raise CliError(f'refusing to use {self.location.url}: it is not a step store ({probe.detail})')
        if self.outbox.foreign():
            local = self.location.scheme.scheme in ('sqlite', 'file')
            elsewhere = 'choose another --store' if local else 'run the demo from another directory'
            raise CliError(
                f'refusing to use {self.outbox.path}: the demo keeps its issue tracker there and did not write '
                f'that file; move the file away, or {elsewhere}'
            )
        if not probe.exists:
            self.outbox.remove()
            return 'new'
        if keep:
            return 'kept: --keep adds to the runs already there'
        runs = await store.list_runs()
        foreign = [run for run in runs if run.metadata.get('written_by') != DEMO_METADATA['written_by']]
        if foreign:
            raise CliError(
                f'refusing to reset {self.location.url}: it holds {len(foreign)} run(s) the demo did not write '
                f'(such as {foreign[0].run_id!r}); pass --keep to add to it, or choose another --store'
            )
        unreadable = await store.list_unreadable_runs()
        if unreadable:
            raise CliError(
                f'refusing to reset {self.location.url}: it holds {len(unreadable)} run record(s) the demo cannot '
                f'read, so it cannot tell whether it wrote them (first: {unreadable[0]}); pass --keep to add to it, or '
                'choose another --store'
            )
        self.outbox.remove()
        if not runs:
            return 'empty'
        for run in runs:
            await store.delete_run(run.run_id)
        await store.collect_garbage(grace=timedelta(0), writers_stopped=True)
        return f'reset: deleted the {len(runs)} runs of the previous demo; --keep keeps them'

    @property
    def _store(self) -> ManagedStepStore:
        assert self.store is not None, 'the store opens before the orchestrator runs'
        return self.store

    async def _print_tree(self) -> None:
        roots = await _inspect.run_tree(self._store, root_run_id=self.orchestrator_run_id)
        self.out.block(tree([tree_node(root, self.out.style) for root in roots], self.out.stream))

    async def _ask_librarian(self, question: str) -> str:
        """The orchestrator's delegation tool: run the librarian elsewhere, recover it if it dies."""
        out, store = self.out, self._store
        out.step(
            f'The orchestrator (run {self.orchestrator_run_id}) was asked "{QUESTION}". Its model called '
            'ask_librarian, a tool that delegates the question to a code_librarian agent.'
        )
        self.cmd(f'events {self.orchestrator_run_id}')

        out.step(
            'ask_librarian started the librarian in a child process that writes to the same store, passing '
            f'parent_run_id={self.orchestrator_run_id} explicitly (context variables do not cross processes). '
            'The librarian read the installed pydantic-ai source through its tools:'
        )
        outcome = await anyio.to_thread.run_sync(self._run_worker, question)
        crashed = (await store.list_runs(conversation_id=self.librarian_conversation))[-1].run_id
        self.cmd(f'events {crashed}')
        if outcome.killed_during is None:
            out.step(f'The librarian (run {crashed}) finished before its side effect started; nothing to recover.')
            return outcome.output or ''

        signal = 'SIGKILL, exit code -9' if outcome.returncode == -9 else f'exit code {outcome.returncode}'
        out.step(
            f"While post_finding was in flight, the demo killed the librarian's process (pid {outcome.pid}, "
            f'{signal}). Nothing could write a closing event or end the tool call: this is what a crash, an '
            'out-of-memory kill or a redeploy leaves behind. The run tree at this moment (the orchestrator is '
            'unfinished too, and its open tool effect is the ask_librarian call it is still inside):'
        )
        await self._print_tree()
        self.cmd('tree')

        inspection = await inspect_recovery(store=store, run_id=crashed)
        out.step(
            f'inspect_recovery on {crashed}: the ledger holds a tool call that started and never ended, so its '
            'side effect is unknown after the crash: the comment may or may not have been posted.'
        )
        for effect in inspection.unresolved:
            out.detail(
                f'{effect.tool_name} (call {effect.tool_call_id}): idempotency key {effect.idempotency_key!r}, '
                f'"{effect.effect_summary}"'
            )
        self.cmd(f'effects {crashed} --unresolved')

        keys = [effect.idempotency_key for effect in inspection.unresolved if effect.idempotency_key]
        posted = [key for key in keys if self.outbox.has(key)]
        if posted:
            decision = (
                f'found {posted[0]!r} there: a comment with this key was already posted (by an earlier run: '
                '--keep kept the tracker too). Continuing is still safe because post_finding checks the key '
                'before posting, so it will not post twice.'
            )
        else:
            decision = (
                'no comment carries that key: the kill landed before the post, so redoing post_finding is safe. '
                '(Had it been unsafe to repeat, fork_run would start a fresh branch from the same snapshot.)'
            )
        out.step(f'The orchestrator looked the key up in the issue tracker ({self.outbox.path.name}): {decision}')
        for effect in inspection.unresolved:
            await store.resolve_tool_effect(
                run_id=crashed,
                tool_call_id=effect.tool_call_id,
                outcome='done' if effect.idempotency_key in posted else 'not_done',
                by='orchestrator',
                note=f'checked {self.outbox.path.name} for its idempotency key',
            )
        out.detail(
            'It recorded what it found on the ledger entry (resolve_tool_effect), so the crashed run no longer '
            'reports it as unknown; the entry itself still says started, as the crash left it.'
        )
        self.cmd(f'effects {crashed}', 'the RESOLVED column; by hand: effects resolve RUN CALL --not-done')

        settled = inspection.settled
        if settled is None:
            raise CliError(f'run {crashed} left no complete snapshot to continue from')
        tools = _tool_names(settled.messages)
        out.step(
            f'The last complete snapshot of {crashed} was taken at step {settled.step_index}: '
            f'{len(settled.messages)} messages, every tool call answered ({", ".join(tools)}). The unsettled '
            'post_finding call is not in it, so continuing from it cannot resend a half-made call.'
        )
        self.cmd(f'snapshot {crashed}')
        self.cmd(f'continue {crashed}', 'the same history as JSON, ready for message_history=')

        said: list[str] = []
        hooks = ToolHooks(say=said.append, before_side_effect=_no_wait)
        librarian = build_librarian(store, librarian_model(self.model), hooks, self.outbox)
        history = await continue_run(store, run_id=crashed)
        result = await librarian.run(FOLLOW_UP, message_history=history, conversation_id=self.librarian_conversation)
        continued = (await store.list_runs(conversation_id=self.librarian_conversation))[-1]
        called = [
            event.tool_name
            for event in await store.list_events(run_id=continued.run_id)
            if event.kind == 'tool_call_started' and event.tool_name
        ]
        out.step(
            f'continue_run({crashed}) gave that history to a new librarian run in this process: '
            f'{continued.run_id}, in the same conversation ({self.librarian_conversation}), its parent '
            f"{continued.parent_run_id} filled in automatically because it ran inside the orchestrator's tool. "
            f'It called only {", ".join(called) or "no tools"}; the earlier reads came from the snapshot:'
        )
        for text in said:
            out.detail(text)
        self.cmd(f'runs --conversation {self.librarian_conversation}')
        self.cmd(f'events {continued.run_id}')
        return result.output

    def _run_worker(self, question: str) -> _WorkerOutcome:
        """Start the librarian's process, relay what it says, SIGKILL it when its side effect starts."""
        command = [
            sys.executable,
            '-m',
            'pydantic_ai_steps.cli._demo_worker',
            '--outbox',
            str(self.outbox.path),
            '--parent-run-id',
            self.orchestrator_run_id,
            '--conversation',
            self.librarian_conversation,
            '--question',
            question,
        ]
        if self.model is not None:
            command += ['--model', self.model]
        with tempfile.TemporaryFile('w+', encoding='utf-8') as errors:
            # The store's URL goes in the environment, not in argv: a server URL may carry a password.
            environment = {**os.environ, STORE_VARIABLE: self.location.target}
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, text=True, encoding='utf-8', env=environment
            )
            watchdog = threading.Timer(WORKER_TIMEOUT_SECONDS, process.kill)
            watchdog.start()
            killed_during: str | None = None
            output: str | None = None
            try:
                assert process.stdout is not None
                for line in process.stdout:
                    message = _parse(line)
                    if 'say' in message:
                        self.out.detail(str(message['say']))
                    elif 'side_effect_started' in message:
                        process.kill()  # SIGKILL on POSIX: no handler, no cleanup, no closing event
                        killed_during = str(message['side_effect_started'])
                        break
                    elif 'finished' in message:
                        output = str(message['finished'])
                returncode = process.wait()
            finally:
                watchdog.cancel()
                if process.poll() is None:
                    process.kill()
                    process.wait()
                if process.stdout is not None:
                    process.stdout.close()
            if killed_during is None and output is None:
                errors.seek(0)
                lines = [line for line in errors.read().splitlines() if line.strip()]
                reason = lines[-1] if lines else 'no output'
                raise CliError(f'the librarian process failed (exit code {returncode}): {reason}')
        return _WorkerOutcome(process.pid, returncode, killed_during, output)


async def _no_wait(key: str) -> None:
    del key


def _parse(line: str) -> dict[str, object]:
    """A worker report; a stray non-JSON line (a library printing) is relayed as text."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return {'say': line.rstrip()}
    return cast(dict[str, object], value) if isinstance(value, dict) else {'say': line.rstrip()}


def _tool_names(messages: Sequence[ModelMessage]) -> list[str]:
    names: list[str] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            names.extend(part.tool_name for part in message.parts if isinstance(part, ToolReturnPart))
    return list(dict.fromkeys(names))
