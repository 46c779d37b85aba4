"""The inspector commands: read a store, print a table, a tree, text or JSON.

Each command is an async function of the parsed arguments and an `Output`. Reading lives in
`_inspect`, drawing in `_render` and `_messages`; this module only joins them, so every command
has the same shape: resolve the store, read, print. `export`, whose file handling is most of it,
is `_export`'s.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from pydantic_ai.messages import ModelMessagesTypeAdapter

from .._errors import EffectAlreadyResolvedError
from ..step_persistence import ContinuableSnapshot, ToolEffectRecord, continue_run
from ..store.codec import effect_dict, event_dict, run_dict
from . import _inspect
from ._errors import CliError
from ._messages import media_policy, render_messages
from ._output import Output
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


async def cmd_continue(args: argparse.Namespace, out: Output) -> None:
    """The history to continue a run with, as JSON for `ModelMessagesTypeAdapter.validate_json`."""
    _, store, run_id = await out.open_run(args)
    try:
        history = await continue_run(store, run_id=run_id, include_interrupted=args.include_interrupted)
    except LookupError as error:
        hint = '' if args.include_interrupted else ' (--include-interrupted also considers interrupted ones)'
        raise CliError(f'{error}{hint}') from None
    out.write(json_printable(ModelMessagesTypeAdapter.dump_json(history, indent=2).decode()) + '\n')
