"""`pydantic-ai-steps`: the argument parser, dispatch, and the exit-code policy.

Exit codes: 0 success, 1 a user-fixable error (printed as one line on stderr), 2 bad arguments
(argparse's usage message), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Sequence
from datetime import timedelta

import anyio

from .._urls import redacted_url
from ..store.record_checks import MAX_COUNT
from . import _commands, _export, _maintenance
from ._errors import CliError
from ._inspect import STATUS_HELP
from ._output import ClosedStdout, Command, Output
from ._render import printable
from ._stores import STORE_VARIABLE, schemes_help, unreachable

PROG = 'pydantic-ai-steps'

DESCRIPTION = """\
Look inside the step records that pydantic-ai-steps' StepPersistence keeps for pydantic-ai agents
(runs, event logs, tool-effect ledgers, continuable snapshots), or watch the demo make some."""


def _store_help(role: str = 'the store to read') -> str:
    return (
        f'{role}: {schemes_help()} (SQLite: three slashes then a relative path, four for an '
        'absolute one), or a bare path: *.db / *.sqlite is SQLite, a directory is a File store'
    )


RUN_HELP = 'a run id, or a unique prefix of one (an ambiguous prefix lists its matches)'


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=f'{STATUS_HELP}\n\n{STORE_VARIABLE}: the store used when --store is not given'
        f'\n\nstart with:  {PROG} demo',
        formatter_class=formatter,
    )
    parser.add_argument('--version', action='version', version=f'{PROG} {_version()}')
    parser.add_argument('--debug', action='store_true', help='show the traceback of an unexpected error')
    parser.add_argument('--store', metavar='URL', help=_store_help() + f' (default: ${STORE_VARIABLE})')
    commands = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)

    store = argparse.ArgumentParser(add_help=False)
    # Also after the command; SUPPRESS keeps a --store given before the command when none comes after.
    store.add_argument('--store', metavar='URL', default=argparse.SUPPRESS, help=_store_help())
    listing = argparse.ArgumentParser(add_help=False)
    listing.add_argument('--json', action='store_true', help='print JSON for scripts instead of a table')
    confirm = argparse.ArgumentParser(add_help=False)
    confirm.add_argument('--dry-run', action='store_true', help='show what would be removed, remove nothing')
    confirm.add_argument('--yes', action='store_true', help='remove without asking (needed unless --dry-run)')

    def add(name: str, summary: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=summary,
            parents=list(parents),
            epilog=STATUS_HELP,
            formatter_class=formatter,
        )

    demo = commands.add_parser(
        'demo',
        help='play the story: a delegate killed mid-tool, inspected, and continued (no API key needed)',
        description=(
            'An orchestrator delegates to a code_librarian in a child process; the librarian reads files\n'
            'through tools, starts a side-effecting tool, and the demo kills its process (SIGKILL) mid-tool.\n'
            'It then inspects the store and continues the librarian from its last complete snapshot,\n'
            'printing each step with the command that shows it. Models are scripted (FunctionModel).'
        ),
        formatter_class=formatter,
    )
    demo.add_argument(
        '--store',
        metavar='URL',
        default=argparse.SUPPRESS,
        help=_store_help('where the demo writes (default: sqlite:///steps-demo.db)'),
    )
    demo.add_argument(
        '--keep',
        action='store_true',
        help='add to the store instead of resetting it first (without it, the demo deletes the runs it wrote '
        'last time, and refuses a store holding runs it did not write)',
    )
    demo.add_argument(
        '--model',
        metavar='NAME',
        help='a real model such as openai:gpt-5 instead of the scripted ones (needs its API key in the environment)',
    )
    demo.set_defaults(handler=None)

    runs = add('runs', 'list runs, oldest first (the newest is the last line)', store, listing)
    runs.add_argument('--conversation', metavar='ID', help='only runs of this conversation_id')
    runs.add_argument('--parent', metavar='RUN', help='only runs delegated by this run (parent_run_id)')
    runs.add_argument('--agent', metavar='NAME', help='only runs of this agent_name')
    runs.add_argument('--status', choices=['completed', 'failed', 'unfinished'], help='only runs of this status')
    runs.add_argument('--limit', metavar='N', type=_count, help='only the N newest matching runs')
    runs.set_defaults(handler=_commands.cmd_runs)

    tree = add('tree', 'runs nested under the runs that delegated them, with their status', store, listing)
    tree.add_argument('run', nargs='?', metavar='RUN', help='show only this run and its descendants; ' + RUN_HELP)
    tree.set_defaults(handler=_commands.cmd_tree)

    events = add(
        'events', "a run's event log, in order, with tool arguments and the delegates calls started", store, listing
    )
    events.add_argument('run', metavar='RUN', help=RUN_HELP)
    events.set_defaults(handler=_commands.cmd_events)

    effects = commands.add_parser(
        'effects',
        help="a run's tool side-effect ledger (started / completed / failed), or `effects resolve RUN CALL`",
        description="A run's tool side-effect ledger (started / completed / failed), or, with\n"
        '`effects resolve RUN CALL --done|--not-done`, a record of what checking a call left `started` found.',
        usage=f'{PROG} effects [-h] [--store URL] [--json] [--unresolved] RUN\n'
        f'       {PROG} effects [-h] [--store URL] [--json] [--unresolved] --run RUN\n'
        f'       {PROG} effects resolve RUN CALL (--done | --not-done) [--note TEXT] [--by WHO] [--replace]',
        parents=[store, listing],
        epilog='A run called `resolve`, or found by the prefix `resolve`: `effects --run resolve`.\n'
        'A call is resolved once: resolving it again is refused, naming the resolution that stands,\n'
        'unless --replace says to overwrite it.\n\n' + STATUS_HELP,
        formatter_class=formatter,
    )
    effects.add_argument('target', nargs='*', metavar='RUN', help=RUN_HELP + '; or: resolve RUN CALL')
    effects.add_argument(
        '--run',
        metavar='RUN',
        dest='named_run',
        help="show this run's ledger, whatever it is called (`effects --run resolve`: a run named resolve)",
    )
    effects.add_argument(
        '--unresolved', action='store_true', help='only calls that started and never ended (unknown after a crash)'
    )
    outcome = effects.add_mutually_exclusive_group()
    outcome.add_argument('--done', action='store_true', help='resolve: the call had its effect')
    outcome.add_argument('--not-done', action='store_true', help='resolve: the call did not have its effect')
    effects.add_argument('--note', metavar='TEXT', help='resolve: what was found, kept with the resolution')
    effects.add_argument('--by', metavar='WHO', help='resolve: who checked (default: the user running this)')
    effects.add_argument(
        '--replace',
        action='store_true',
        help="resolve: overwrite the call's earlier resolution (without it, a resolved call is refused)",
    )
    effects.set_defaults(handler=_commands.cmd_effects)

    snapshot = add('snapshot', "a run's newest continuable snapshot, messages rendered for reading", store, listing)
    snapshot.add_argument('run', metavar='RUN', help=RUN_HELP)
    snapshot.add_argument(
        '--include-interrupted',
        action='store_true',
        help='also consider interrupted snapshots (taken with tool calls unsettled)',
    )
    snapshot.add_argument('--full', action='store_true', help='do not shorten long texts')
    snapshot.set_defaults(handler=_commands.cmd_snapshot)

    stats = add('stats', 'totals: runs, events, snapshots, bytes on disk, media blobs', store, listing)
    stats.set_defaults(handler=_commands.cmd_stats)

    export = add('export', 'a run as JSON lines: run, events, tool effects, every snapshot', store)
    export.add_argument('run', metavar='RUN', help=RUN_HELP)
    export.add_argument('--format', choices=['jsonl'], default='jsonl', help='output format (default: %(default)s)')
    export.add_argument('--output', '-o', metavar='FILE', help='write to FILE instead of stdout (- is stdout)')
    export.set_defaults(handler=_export.cmd_export)

    cont = add('continue', 'print the history to continue a run with, as JSON for message_history=', store)
    cont.add_argument('run', metavar='RUN', help=RUN_HELP)
    cont.add_argument(
        '--include-interrupted',
        action='store_true',
        help='continue from the newest snapshot even if interrupted (check `effects --unresolved` first)',
    )
    cont.set_defaults(handler=_commands.cmd_continue)

    delete = add('delete', 'remove a run (or a conversation) and everything recorded for it', store, confirm)
    delete.add_argument('run', nargs='?', metavar='RUN', help=RUN_HELP)
    delete.add_argument('--conversation', metavar='ID', help='remove every run of this conversation_id instead')
    delete.add_argument('--include-delegates', action='store_true', help='also the runs these runs delegated to')
    delete.set_defaults(handler=_maintenance.cmd_delete)

    prune = add('prune', 'remove whole runs whose last activity is older than an age', store, confirm)
    prune.add_argument(
        '--older-than', metavar='AGE', required=True, type=_age, help='an age such as 30d, 12h, 90m or 2w'
    )
    prune.add_argument('--keep-last', metavar='N', type=_count, help='always keep the N newest runs')
    prune.add_argument(
        '--status', action='append', choices=['completed', 'failed', 'unfinished'], help='only runs of this status'
    )
    prune.set_defaults(handler=_maintenance.cmd_prune)

    gc = add('gc', 'remove media blobs no run references (and give the space back)', store, confirm)
    gc.add_argument(
        '--grace',
        metavar='AGE',
        type=_age,
        default=timedelta(hours=1),
        help='keep blobs put more recently than this (default: 1h, at least 10m unless --writers-stopped): a running '
        'writer may be about to reference them',
    )
    gc.add_argument(
        '--writers-stopped',
        action='store_true',
        help='no process writes to the store meanwhile, so a --grace under 10m (0s, say) is safe; a writer '
        'process that was only paused trusts its puts of the last 5 minutes: restart it, or wait that long',
    )
    gc.set_defaults(handler=_maintenance.cmd_gc)
    return parser


def _count(text: str) -> int:
    """A whole number >= 0, of any size: above `MAX_COUNT` every store reads it as no limit.

    A number with more digits than `MAX_COUNT` is that, so it is not parsed (Python refuses to
    parse very long ones): it becomes `MAX_COUNT + 1`.
    """
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f'expected a whole number >= 0, got {text!r}')
    digits = text.lstrip('0') or '0'
    return int(digits) if len(digits) <= len(str(MAX_COUNT)) else MAX_COUNT + 1


_UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800}
_LONGEST_AGE = timedelta.max.days * 86400 + timedelta.max.seconds
"""The longest age in whole seconds, `timedelta.max` (999999999 days and a bit)."""


def _age(text: str) -> timedelta:
    """An age such as 30d, of at most `timedelta.max`: a longer one is refused naming the most in its unit.

    One that fits but reaches back before year 1 is the store's to read: nothing is that old, so
    `prune` removes nothing and `gc` collects nothing.
    """
    number, unit = text[:-1], text[-1:].lower()
    if unit not in _UNITS or not (number.isascii() and number.isdigit()):
        raise argparse.ArgumentTypeError(f'expected an age such as 30d, 12h, 90m, 45s or 2w, got {text!r}')
    digits = number.lstrip('0') or '0'
    most = _LONGEST_AGE // _UNITS[unit]
    if len(digits) > len(str(most)) or int(digits) > most:
        shown = text if len(text) <= 40 else f'{text[:20]}...{text[-10:]}'
        days = '' if unit == 'd' else f' ({timedelta.max.days} days)'
        raise argparse.ArgumentTypeError(f'age {shown!r} is too long: at most {most}{unit}{days}')
    return timedelta(seconds=int(digits) * _UNITS[unit])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version('pydantic-ai-steps')
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return 'unknown'


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code instead of exiting, so tests can call it."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = _parse(build_parser(), arguments)
    try:
        if getattr(args, 'store', None) is None:
            args.store = os.environ.get(STORE_VARIABLE) or None
        elif not args.store:  # `--store "$UNSET"` must not fall back to another store, for `delete --yes` least of all
            raise CliError(
                f"--store '' names no store: give a URL or a path, or leave out --store to use ${STORE_VARIABLE}"
            )
        stdout = sys.stdout or ClosedStdout()  # `None` when started with `>&-`
        if args.command == 'demo':
            from ._demo import run_demo

            return run_demo(
                store=args.store or 'sqlite:///steps-demo.db', keep=args.keep, model=args.model, stream=stdout
            )
        out = Output.for_stream(stdout)
        handler: Command = args.handler
        anyio.run(_run_command, handler, args, out)
        out.flush()
    except CliError as error:
        _error(str(error))
        return 1
    except KeyboardInterrupt:
        _error('interrupted')
        return 130
    except BrokenPipeError:
        # The reader (`| head`) went away: not an error. Point stdout at devnull so the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as error:
        if args.debug:
            raise
        reason = unreachable(error)  # the server went away during the command: a condition, not a bug
        _error(
            f'lost the store: {reason}'
            if reason is not None
            else f'{type(error).__name__}: {error} (--debug shows the traceback)'
        )
        return 1
    return 0


def _parse(parser: argparse.ArgumentParser, arguments: list[str]) -> argparse.Namespace:
    """`parser.parse_args(arguments)`, with argparse's usage errors passed on with every store URL in
    them masked: `runs postgresql://u:pw@db/x` (a forgotten `--store`) must not print the password."""
    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint):
            return parser.parse_args(arguments)
    finally:
        text = complaint.getvalue()
        for argument in arguments:
            if (masked := redacted_url(argument)) != argument:  # quoted (`invalid choice: '...'`) or as typed
                text = text.replace(repr(argument), repr(masked)).replace(argument, masked)
        if text and sys.stderr is not None:  # `None` when started with `2>&-`: the command still runs
            sys.stderr.write(text)


async def _run_command(handler: Command, args: argparse.Namespace, out: _commands.Output) -> None:
    try:
        await handler(args, out)
    finally:
        await out.close()


def _error(message: str) -> None:
    """One line on stderr; what the message quotes (a store's text, a run id) is escaped, never obeyed."""
    first_line = ' '.join(printable(message.split('\n')[0]).split()) if message else 'unknown error'
    if sys.stderr is not None:  # started with `2>&-`: the exit code still tells
        sys.stderr.write(f'{PROG}: error: {first_line}\n')
