"""The inspector commands: read a store, print a table, a tree, text or JSON.

Each command is an async function of the parsed arguments and an `Output`. Reading lives in
`_inspect`, drawing in `_render` and `_messages`; this module only joins them, so every command
has the same shape: resolve the store, read, print.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import getpass
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Generator
from typing import Any, TextIO

from pydantic_ai.messages import ModelMessagesTypeAdapter

from .._errors import EffectAlreadyResolvedError
from ..step_persistence import ContinuableSnapshot, ToolEffectRecord, continue_run
from ..store.codec import effect_dict, event_dict, run_dict
from ..store.registry import StoreLocation
from . import _inspect
from ._errors import CliError
from ._messages import media_policy, render_messages
from ._output import Output, unwritable, writing
from ._render import (
    STATUS_COLOURS,
    Cell,
    ProgressLine,
    Style,
    TreeNode,
    json_printable,
    printable,
    size,
    table,
    tree,
    when,
)
from ._stores import media_blob_count


def summary_dict(summary: _inspect.RunSummary) -> dict[str, Any]:
    return {
        **run_dict(summary.record),
        'status': summary.status,
        'steps': summary.steps,
        'events': summary.events,
        'unresolved_effects': summary.unresolved_effects,
        'error': summary.error,
    }


def snapshot_dict(snapshot: ContinuableSnapshot) -> dict[str, Any]:
    return {
        'run_id': snapshot.run_id,
        'step_index': snapshot.step_index,
        'state': snapshot.state,
        'timestamp': snapshot.timestamp.isoformat(),
        'conversation_id': snapshot.conversation_id,
        'parent_run_id': snapshot.parent_run_id,
        'agent_name': snapshot.agent_name,
        'messages': ModelMessagesTypeAdapter.dump_python(snapshot.messages, mode='json'),
    }


def _status(status: str) -> Cell:
    return (status, STATUS_COLOURS.get(status, ''))


async def cmd_runs(args: argparse.Namespace, out: Output) -> None:
    """Table of runs, oldest first, so the newest is the last line (as `list_runs(...)[-1]`)."""
    _, store = await out.open_store(args)
    with ProgressLine('reading runs') as progress:
        summaries = await _inspect.list_summaries(
            store,
            conversation_id=args.conversation,
            parent_run_id=args.parent,
            agent_name=args.agent,
            status=args.status,
            limit=args.limit,
            progress=progress,
        )
    if args.json:
        out.json([summary_dict(summary) for summary in summaries])
        return
    if not summaries:
        filters = (args.conversation, args.parent, args.agent, args.status, args.limit)
        filtered = any(value is not None for value in filters)  # `--agent ''` filters too: it matches nothing
        out.line('no runs match' if filtered else 'the store has no runs')
        return
    rows: list[list[Cell]] = [
        [
            summary.record.run_id,
            summary.record.agent_name or '-',
            summary.record.conversation_id or '-',
            summary.record.parent_run_id or '-',
            when(summary.record.started_at),
            _status(summary.status),
            str(summary.steps),
        ]
        for summary in summaries
    ]
    headers = ['RUN', 'AGENT', 'CONVERSATION', 'PARENT', 'STARTED (UTC)', 'STATUS', 'STEPS']
    out.line(table(headers, rows, out.style, width=out.width))


async def cmd_tree(args: argparse.Namespace, out: Output) -> None:
    """Runs under the runs that delegated them (`parent_run_id`), with status and open effects."""
    location, store = await out.open_store(args)
    root = None
    if args.run is not None:
        root, _ = await _inspect.resolve_run(store, args.run, location.url)
    with ProgressLine('reading runs') as progress:
        roots = await _inspect.run_tree(store, root_run_id=root, progress=progress)
    if args.json:
        out.json([_tree_dict(root) for root in roots])
        return
    if not roots:
        out.line('the store has no runs')
        return
    out.line(tree([tree_node(root, out.style) for root in roots], out.stream))


def _tree_dict(summary: _inspect.RunSummary) -> dict[str, Any]:
    return {**summary_dict(summary), 'children': [_tree_dict(child) for child in summary.children]}


def tree_node(summary: _inspect.RunSummary, style: Style) -> TreeNode:
    record = summary.record
    parts = [
        style(printable(record.run_id), 'bold'),
        style(f'[{printable(record.agent_name)}]', 'cyan') if record.agent_name else '',
        style(summary.status, STATUS_COLOURS[summary.status]),
        f'{summary.steps} step' + ('' if summary.steps == 1 else 's'),
    ]
    if record.conversation_id:
        parts.append(style(f'conversation {printable(record.conversation_id)}', 'dim'))
    for kind, origin in (('continued from', record.continued_from), ('forked from', record.forked_from)):
        if origin is not None:
            parts.append(style(f'{kind} {printable(origin.run_id)} (snapshot {origin.seq})', 'magenta'))
    if summary.unresolved_effects:
        count = summary.unresolved_effects
        parts.append(style(f'{count} unresolved tool effect' + ('' if count == 1 else 's'), 'yellow', 'bold'))
    label = '  '.join(part for part in parts if part)
    return TreeNode(label, [tree_node(child, style) for child in summary.children])


async def cmd_events(args: argparse.Namespace, out: Output) -> None:
    """A run's event log in append order, with each call's arguments and the delegates it started."""
    _, store, run_id = await out.open_run(args)
    events = await store.list_events(run_id=run_id)
    children: dict[str, list[str]] = {}
    for child in await store.list_runs(parent_run_id=run_id):
        if child.parent_tool_call_id is not None:
            children.setdefault(child.parent_tool_call_id, []).append(child.run_id)
    if args.json:
        out.json(
            [{**event_dict(event), 'child_run_ids': children.get(event.tool_call_id or '', [])} for event in events]
        )
        return
    if not events:
        out.line(f'run {printable(run_id)} has no events')
        return
    rows: list[list[Cell]] = []
    for index, event in enumerate(events, start=1):
        colour = 'red' if event.kind.endswith('_failed') else 'green' if event.kind.endswith('_completed') else ''
        started = event.kind == 'tool_call_started'
        rows.append(
            [
                str(index),
                when(event.timestamp),
                str(event.step_index),
                (event.kind, colour),
                event.tool_name or '',
                event.tool_call_id or '',
                event.tool_args or '' if started else '',
                ', '.join(children.get(event.tool_call_id or '', [])) if started else '',
                (event.error or '', 'red'),
            ]
        )
    headers = ['#', 'TIME (UTC)', 'STEP', 'KIND', 'TOOL', 'TOOL CALL', 'ARGUMENTS', 'DELEGATED TO', 'ERROR']
    out.line(table(headers, rows, out.style, width=out.width))
    last = events[-1].kind
    if last not in ('run_completed', 'run_failed'):
        out.line(
            out.style(f'the log ends with {printable(last)}: no closing event, so the run is unfinished', 'yellow')
            + ' (still running, or its process died)'
        )


async def cmd_effects(args: argparse.Namespace, out: Output) -> None:
    """The tool side-effect ledger of a run; `started` entries are the ones recovery must decide.

    `effects resolve RUN CALL --done|--not-done [--note TEXT]` records what checking such a call found;
    `effects --run RUN` shows the ledger of RUN whatever it is called (a run named `resolve`).
    """
    target: list[str] = args.target
    if args.named_run is not None:
        if target:
            raise CliError(f'effects --run RUN takes no other RUN, got {" ".join(target)!r}')
        target = [args.named_run]
    elif target[:1] == ['resolve']:
        await _resolve_effect(args, out, target[1:])
        return
    if len(target) != 1:
        got = f'got {" ".join(target)!r}' if target else 'got none'
        raise CliError(f'effects takes one RUN (or: resolve RUN CALL), {got}')
    if args.done or args.not_done or args.note is not None or args.by is not None or args.replace:
        raise CliError('--done, --not-done, --note, --by and --replace go with `effects resolve RUN CALL`')
    args.run = target[0]
    _, store, run_id = await out.open_run(args)
    effects = await _inspect.tool_effects(store, run_id, unresolved_only=args.unresolved)
    if args.json:
        out.json([{**effect_dict(effect), 'unresolved': effect.unresolved} for effect in effects])
        return
    if not effects:
        out.line(
            f'run {printable(run_id)} has no ' + ('unresolved tool effects' if args.unresolved else 'tool effects')
        )
        return
    rows: list[list[Cell]] = [
        [
            effect.tool_call_id,
            effect.tool_name,
            _status(effect.status),
            when(effect.started_at),
            when(effect.ended_at),
            effect.idempotency_key or '-',
            effect.effect_summary or '-',
            _resolution(effect),
        ]
        for effect in effects
    ]
    headers = ['TOOL CALL', 'TOOL', 'STATUS', 'STARTED (UTC)', 'ENDED (UTC)', 'IDEMPOTENCY KEY', 'SUMMARY', 'RESOLVED']
    out.line(table(headers, rows, out.style, width=out.width))
    if any(effect.unresolved for effect in effects):
        out.line(
            out.style('started', 'yellow')
            + ' with no end: if the run is dead, the side effect may or may not have happened'
            ' (unknown after crash). Check its idempotency key against the system it writes to before redoing it,'
            ' then record what you found: `effects resolve RUN CALL --done|--not-done`.'
        )


def _resolution(effect: ToolEffectRecord) -> Cell:
    if effect.resolution is None:
        return '-'
    text = f'{effect.resolution.replace("_", " ")} ({effect.resolved_by or "?"}, {when(effect.resolved_at)})'
    if effect.resolution_note:
        text += f': {effect.resolution_note}'
    return (text, 'green')


async def _resolve_effect(args: argparse.Namespace, out: Output, target: list[str]) -> None:
    if len(target) != 2:
        got = f'got {" ".join(target)!r}' if target else 'got nothing after it'
        raise CliError(f'effects resolve takes RUN CALL, {got} (a run named resolve: effects --run resolve)')
    if not (args.done or args.not_done):
        raise CliError('effects resolve needs --done (the effect happened) or --not-done (it did not)')
    by = _user() if args.by is None else args.by
    if not by.strip():  # `--by "$CHECKER"` with the variable unset
        raise CliError(f'--by {by!r} names no one: give who checked, or leave out --by for the user running this')
    args.run = target[0]
    _, store, run_id = await out.open_run(args)
    outcome = 'done' if args.done else 'not_done'
    try:
        record = await store.resolve_tool_effect(
            run_id=run_id, tool_call_id=target[1], outcome=outcome, by=by, note=args.note, replace=args.replace
        )
    except EffectAlreadyResolvedError as error:
        raise CliError(f'{error.found}; pass --replace to overwrite it') from None
    except (LookupError, ValueError) as error:
        raise CliError(str(error).strip('"')) from None
    if args.json:
        out.json(effect_dict(record))
        return
    out.line(f'{printable(record.tool_call_id)} of run {printable(run_id)}: resolved {_resolution(record)[0]}')


def _user() -> str:
    """The user running this, the default of `--by`: a process whose uid has no name (a container's)
    is told to give one, not shown pwd's error."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # pwd's KeyError; Python 3.13 raises OSError
        raise CliError('no user name for this process to record as who resolved the call: pass --by WHO') from None


async def cmd_snapshot(args: argparse.Namespace, out: Output) -> None:
    """The newest continuable snapshot of a run, messages rendered for reading."""
    _, store, run_id = await out.open_run(args)
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=args.include_interrupted)
    if snapshot is None:
        hint = '' if args.include_interrupted else ' (--include-interrupted also considers interrupted ones)'
        kind = 'snapshot' if args.include_interrupted else 'complete snapshot'
        raise CliError(f'run {run_id!r} has no {kind}{hint}')
    if args.json:
        out.json(snapshot_dict(snapshot))
        return
    style = out.style
    count = len(snapshot.messages)
    out.line(
        style(f'run {printable(run_id)}', 'bold')
        + f'  snapshot at step {snapshot.step_index}  '
        + style(snapshot.state, STATUS_COLOURS[snapshot.state])
        + f'  {when(snapshot.timestamp)} UTC  {count} message'
        + ('' if count == 1 else 's')
    )
    out.line(render_messages(snapshot.messages, style, media_policy(store), full=args.full))


async def cmd_stats(args: argparse.Namespace, out: Output) -> None:
    """Totals of the whole store: how much it holds and what it costs on disk."""
    location, store = await out.open_store(args)
    with ProgressLine('reading runs') as progress:
        probe = await store.probe()
        stats = await _inspect.store_stats(
            store,
            bytes_on_disk=probe.size_bytes,
            media_blobs=await media_blob_count(store.media_store),
            progress=progress,
        )
    if args.json:
        out.json(
            {
                'store': location.url,
                'runs': stats.runs,
                'events': stats.events,
                'snapshots': stats.snapshots,
                'interrupted_snapshots': stats.interrupted_snapshots,
                'unresolved_effects': stats.unresolved_effects,
                'bytes': stats.bytes_on_disk,
                'media_blobs': stats.media_blobs,
            }
        )
        return
    rows: list[list[Cell]] = [
        ['store', location.url],
        ['runs', f'{stats.runs:,}'],
        ['events', f'{stats.events:,}'],
        ['snapshots', f'{stats.snapshots:,} ({stats.interrupted_snapshots:,} interrupted)'],
        ['unresolved effects', (f'{stats.unresolved_effects:,}', 'yellow' if stats.unresolved_effects else '')],
        ['bytes on disk', size(stats.bytes_on_disk) if stats.bytes_on_disk is not None else 'unknown'],
        ['media blobs', f'{stats.media_blobs:,}' if stats.media_blobs is not None else 'unknown'],
    ]
    out.line(table(None, rows, out.style, width=out.width))


async def cmd_export(args: argparse.Namespace, out: Output) -> None:
    """One JSON object per line: the run record, its events, its tool effects, every snapshot.

    Each line carries `"type"` (`run`, `event`, `tool_effect`, `snapshot`), so `jq 'select(.type ==
    "event")'` and friends work without knowing the order.
    """
    location, store = await out.open_store(args)
    run_id, record = await _inspect.resolve_run(store, args.run, location.url)
    output: str | None = None if args.output == '-' else args.output  # `-o -`: stdout, as Unix tools read it
    if output is not None:
        _check_export_target(location, output)
    # A blocking file in an async command is fine here: the CLI runs nothing else concurrently.
    target = _replacing(output) if output is not None else contextlib.nullcontext(out.write)
    with target as write, ProgressLine(f'exporting {run_id}') as progress:
        if record is not None:
            _jsonl(write, {'type': 'run', **run_dict(record)})
        progress(1, 4)
        for event in await store.list_events(run_id=run_id):
            _jsonl(write, {'type': 'event', **event_dict(event)})
        progress(2, 4)
        for effect in await _inspect.tool_effects(store, run_id, unresolved_only=False):
            _jsonl(write, {'type': 'tool_effect', **effect_dict(effect)})
        progress(3, 4)
        for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True):
            _jsonl(write, {'type': 'snapshot', **snapshot_dict(snapshot)})
        progress(4, 4)
    if output is not None:
        sys.stderr.write(f'exported run {printable(run_id)} to {printable(output)}\n')


_SQLITE_SIDECARS = ('', '-wal', '-shm', '-journal')


def _check_export_target(location: StoreLocation, output: str) -> None:
    """Refuse an `--output` that names no file (`-o "$UNSET"` is a mistake, not a request for stdout),
    or that is the store itself: the SQLite file (or its WAL, shared memory and journal files), or
    anything inside a File store's directory."""
    if not output:
        raise CliError(
            "--output '' names no file: name the file to write the export to, or leave out --output for stdout"
        )
    kind = location.scheme.scheme
    if kind not in ('sqlite', 'file'):
        return
    target = os.path.realpath(output)
    store = os.path.realpath(location.target)
    if kind == 'sqlite':
        clash = target in {store + suffix for suffix in _SQLITE_SIDECARS} or _same_file(output, location.target)
    else:
        clash = target == store or target.startswith(store.rstrip(os.sep) + os.sep)
    if clash:
        raise CliError(f'--output {output!r} is part of the store at {location.url}: write the export elsewhere')


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)  # a hard link to the database
    except OSError:
        return False


@contextlib.contextmanager
def _replacing(path: str) -> Generator[Callable[[str], None]]:
    """Writes to a regular file that becomes `path` only once it is written whole: an export that
    fails part way (the disk fills, the store goes away) removes its temporary file and leaves what
    was there, never a file cut short that looks complete. The file keeps the mode of the one it
    replaces (a new file is private, as the stores' own files are), and one the user may not write
    is refused, as the shell's `>` refuses it. A link to a file is followed, and the file it leads
    to replaced the same way. Anything else (`/dev/stdout`, a pipe, a device) is written through,
    as `open` would. A directory, or a path that cannot be written (at the start or part way), is a
    `CliError` naming it."""
    if path.endswith(('/', os.sep)) or os.path.isdir(path):
        raise CliError(f'--output {path!r} names a directory: name the file to write the export to')
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as error:  # a folder on the way is a file, or may not be searched
        raise _unwritable(path, error) from None
    replaced = path
    if info is not None and stat.S_ISLNK(info.st_mode) and not _under_dev_or_proc(path):
        replaced = os.path.realpath(path)  # the link stays, and leads to the new file
        try:
            info = os.lstat(replaced)
        except FileNotFoundError:
            info = None
        except OSError as error:
            raise _unwritable(path, error) from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        try:
            # Appending: `-o /dev/stdout >> log` adds to the log, and `>` has emptied the file already.
            through = open(path, 'a', encoding='utf-8')  # noqa: SIM115 - `_written` closes it
        except OSError as error:
            raise _unwritable(path, error) from None
        with _written(through, path) as write:
            yield write
        return
    if info is not None and not os.access(replaced, os.W_OK):  # a rename would replace what `>` may not write
        raise _unwritable(path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
    directory = os.path.dirname(os.path.abspath(replaced))
    try:
        descriptor, name = tempfile.mkstemp(dir=directory, prefix='.export-', suffix='.tmp')
    except OSError as error:
        raise _unwritable(path, error) from None
    try:
        if info is not None:
            os.chmod(name, stat.S_IMODE(info.st_mode))
        with _written(os.fdopen(descriptor, 'w', encoding='utf-8'), path) as write:
            yield write
        try:
            os.replace(name, replaced)
        except OSError as error:
            raise _unwritable(path, error) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def _under_dev_or_proc(path: str) -> bool:
    """`/dev/stdout`, `/dev/fd/1`, `/proc/self/fd/1`: a link to what the shell opened (a pipe, or a file
    opened for appending), written through, never replaced."""
    return any(where.startswith(('/dev/', '/proc/')) for where in (os.path.abspath(path), os.path.realpath(path)))


def _unwritable(path: str, error: OSError) -> CliError:
    return unwritable(f'--output {path!r}', error)


@contextlib.contextmanager
def _written(handle: TextIO, path: str) -> Generator[Callable[[str], None]]:
    """Writes to `handle`, then closes it: a write or the close (the last buffered lines may not fit
    either) that fails is the error naming `path`. After a failure, what is still buffered is dropped."""
    target = f'--output {path!r}'

    def write(text: str) -> None:
        with writing(target):
            handle.write(text)

    try:
        yield write
        with writing(target):
            handle.close()
    finally:
        with contextlib.suppress(OSError):
            handle.close()


def _jsonl(write: Callable[[str], None], value: dict[str, Any]) -> None:
    write(json_printable(json.dumps(value, ensure_ascii=False, separators=(',', ':'))) + '\n')


async def cmd_continue(args: argparse.Namespace, out: Output) -> None:
    """The history to continue a run with, as JSON for `ModelMessagesTypeAdapter.validate_json`."""
    _, store, run_id = await out.open_run(args)
    try:
        history = await continue_run(store, run_id=run_id, include_interrupted=args.include_interrupted)
    except LookupError as error:
        hint = '' if args.include_interrupted else ' (--include-interrupted also considers interrupted ones)'
        raise CliError(f'{error}{hint}') from None
    out.write(json_printable(ModelMessagesTypeAdapter.dump_json(history, indent=2).decode()) + '\n')
