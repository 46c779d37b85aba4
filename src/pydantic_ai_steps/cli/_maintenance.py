"""The commands that remove: `delete`, `prune`, `gc`. Each shows what it would remove, removes it only
with `--yes` (never with `--dry-run`), and says what went: runs, bytes, blobs."""

from __future__ import annotations

import argparse
from datetime import timedelta

from .._errors import shortened
from ..store.maintenance import MIN_LIVE_GRACE, GarbageResult
from ..store.protocol import ManagedStepStore
from . import _inspect
from ._errors import CliError
from ._output import Output
from ._render import printable, size


async def cmd_delete(args: argparse.Namespace, out: Output) -> None:
    """Remove one run (or every run of a conversation) with its events, snapshots, ledger and log."""
    if (args.run is None) == (args.conversation is None):
        got = (
            'neither'
            if args.run is None
            else f'both {shortened(args.run)} and --conversation {shortened(args.conversation)}'
        )
        raise CliError(f'delete takes a RUN or --conversation ID (one of them), got {got}')
    location, store = await out.open_store(args)
    if args.run is not None:
        run_id, _ = await _inspect.resolve_run(store, args.run, location.url)
        if run_id != args.run and args.yes and not args.dry_run:
            # A prefix that named one run yesterday may name another today (its run deleted, a
            # longer id left): what goes is named whole, as the plan without --yes shows it.
            raise CliError(
                f'delete --yes removes a run named by its whole id; {args.run!r} is the start of {run_id!r}: '
                'give that id to remove it'
            )
        targets = [run_id]
    else:
        targets = [run.run_id for run in await store.list_runs(conversation_id=args.conversation)]
        if not targets:
            raise CliError(f'no run of conversation {args.conversation!r} in {location.url}')
    planned = await _with_delegates(store, targets) if args.include_delegates else targets
    if _planning(args, out, planned, 'delete'):
        return
    before = await _size(store)
    removed: list[str] = []
    for run_id in targets:
        removed += await store.delete_run(run_id, include_delegates=args.include_delegates)
    await _report(out, store, removed, before)


async def cmd_prune(args: argparse.Namespace, out: Output) -> None:
    """Remove whole runs whose last activity is older than `--older-than`."""
    _, store = await out.open_store(args)
    age: timedelta = args.older_than
    plan = await store.prune(older_than=age, keep_last=args.keep_last, status=args.status, dry_run=True)
    if _planning(args, out, plan.run_ids, f'prune (last activity before {plan.cutoff:%Y-%m-%d %H:%M} UTC)'):
        return
    before = await _size(store)
    done = await store.prune(older_than=age, keep_last=args.keep_last, status=args.status)
    await _report(out, store, done.run_ids, before)


async def cmd_gc(args: argparse.Namespace, out: Output) -> None:
    """Remove media blobs no run references and nothing has put within `--grace`."""
    _, store = await out.open_store(args)
    if store.media_store is None:
        out.line('this store keeps media inline: there are no blobs to collect')
        return
    if args.grace < MIN_LIVE_GRACE and not args.writers_stopped:  # the library's rule, in the CLI's words
        raise CliError(
            f'--grace {_shown_age(args.grace)} is under {_shown_age(MIN_LIVE_GRACE)}: a writer still running could be '
            'about to reference a blob put that recently; give a longer --grace, or --writers-stopped if no process '
            'writes to this store meanwhile'
        )
    plan = await store.collect_garbage(grace=args.grace, dry_run=True, writers_stopped=args.writers_stopped)
    if args.dry_run or not args.yes:
        out.line(_garbage_line(plan, 'would remove'))
        if not args.dry_run:
            raise CliError('nothing removed: pass --yes to remove them (or --dry-run to only look)')
        return
    before = await _size(store)
    done = await store.collect_garbage(grace=args.grace, writers_stopped=args.writers_stopped)
    out.line(_garbage_line(done, 'removed'))
    after = await _size(store)
    if before is not None and after is not None:
        out.line(f'store size: {size(before)} -> {size(after)}')


def _planning(args: argparse.Namespace, out: Output, run_ids: list[str], action: str) -> bool:
    """Show the plan; `True` when nothing is to be removed now (a dry run, or no `--yes`)."""
    count = len(run_ids)
    shown = ', '.join(printable(run_id) for run_id in run_ids[:10]) + (', ...' if count > 10 else '')
    if args.dry_run or not args.yes:
        out.line(f'{action} would remove {count} run' + ('' if count == 1 else 's') + (f': {shown}' if count else ''))
        if not args.dry_run and count:
            raise CliError('nothing removed: pass --yes to remove them (or --dry-run to only look)')
        return True
    return False


async def _report(out: Output, store: ManagedStepStore, removed: list[str], before: int | None) -> None:
    count = len(removed)
    out.line(
        f'removed {count} run'
        + ('' if count == 1 else 's')
        + (f': {", ".join(map(printable, removed[:10]))}' if count else '')
    )
    after = await _size(store)
    if before is not None and after is not None:
        out.line(f'store size: {size(before)} -> {size(after)} (media stays until `gc`)')


def _garbage_line(result: GarbageResult, verb: str) -> str:
    count = len(result.blobs)
    return (
        f'{verb} {count} blob'
        + ('' if count == 1 else 's')
        + f' ({size(result.bytes)}); kept {result.kept_referenced} '
        f'referenced and {result.kept_recent} put within the grace period'
    )


async def _with_delegates(store: ManagedStepStore, run_ids: list[str]) -> list[str]:
    found = dict.fromkeys(run_ids)
    frontier = list(run_ids)
    while frontier:
        for child in await store.list_runs(parent_run_id=frontier.pop()):
            if child.run_id not in found:
                found[child.run_id] = None
                frontier.append(child.run_id)
    return list(found)


async def _size(store: ManagedStepStore) -> int | None:
    return (await store.probe()).size_bytes


def _shown_age(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    for unit, length in (('w', 604800), ('d', 86400), ('h', 3600), ('m', 60)):
        if seconds and seconds % length == 0:
            return f'{seconds // length}{unit}'
    return f'{seconds}s'
