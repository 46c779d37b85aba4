"""`pydantic-ai-steps`: the argument parser, dispatch, and the exit-code policy.

Exit codes: 0 success, 1 a user-fixable error (printed as one line on stderr), 2 bad arguments
(argparse's usage message), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import anyio

from . import _commands
from ._errors import CliError
from ._inspect import STATUS_HELP
from ._render import printable
from ._stores import schemes_help

PROG = 'pydantic-ai-steps'

DESCRIPTION = """\
Look inside the step records that pydantic-ai-steps' StepPersistence keeps for pydantic-ai agents
(runs, event logs, tool-effect ledgers, continuable snapshots), or watch the demo make some."""


def _store_help(role: str = 'the store to read') -> str:
    return (
        f'{role}: {schemes_help()} (SQLite: three slashes then a relative path, four for an '
        'absolute one), or a bare path: *.db / *.sqlite is SQLite, a directory is a File store'
    )


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=f'{STATUS_HELP}\n\nstart with:  {PROG} demo',
        formatter_class=formatter,
    )
    parser.add_argument('--debug', action='store_true', help='show the traceback of an unexpected error')
    commands = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)

    store = argparse.ArgumentParser(add_help=False)
    store.add_argument('--store', metavar='URL', help=_store_help())
    listing = argparse.ArgumentParser(add_help=False)
    listing.add_argument('--json', action='store_true', help='print JSON for scripts instead of a table')

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
        default='sqlite:///steps-demo.db',
        help=_store_help('where the demo writes (default: %(default)s)'),
    )
    demo.add_argument(
        '--keep',
        action='store_true',
        help='add to the store instead of resetting it first (without it, the demo deletes the store it wrote '
        'last time, and refuses to touch a store holding runs it did not write)',
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
    runs.set_defaults(handler=_commands.cmd_runs)

    tree = add('tree', 'runs nested under the runs that delegated them, with their status', store, listing)
    tree.add_argument('run', nargs='?', metavar='RUN', help='show only this run and its descendants')
    tree.set_defaults(handler=_commands.cmd_tree)

    events = add('events', "a run's event log, in order", store, listing)
    events.add_argument('run', metavar='RUN')
    events.set_defaults(handler=_commands.cmd_events)

    effects = add('effects', "a run's tool side-effect ledger (started / completed / failed)", store, listing)
    effects.add_argument('run', metavar='RUN')
    effects.add_argument(
        '--unresolved', action='store_true', help='only calls that started and never ended (unknown after a crash)'
    )
    effects.set_defaults(handler=_commands.cmd_effects)

    snapshot = add('snapshot', "a run's newest continuable snapshot, messages rendered for reading", store, listing)
    snapshot.add_argument('run', metavar='RUN')
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
    export.add_argument('run', metavar='RUN')
    export.add_argument('--format', choices=['jsonl'], default='jsonl', help='output format (default: %(default)s)')
    export.add_argument('--output', '-o', metavar='FILE', help='write to FILE instead of stdout')
    export.set_defaults(handler=_commands.cmd_export)

    cont = add('continue', 'print the history to continue a run with, as JSON for message_history=', store)
    cont.add_argument('run', metavar='RUN')
    cont.add_argument(
        '--include-interrupted',
        action='store_true',
        help='continue from the newest snapshot even if interrupted (check `effects --unresolved` first)',
    )
    cont.set_defaults(handler=_commands.cmd_continue)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code instead of exiting, so tests can call it."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == 'demo':
            from ._demo import run_demo

            return run_demo(store=args.store, keep=args.keep, model=args.model, stream=sys.stdout)
        out = _commands.Output.for_stream(sys.stdout)
        handler: _commands.Command = args.handler
        anyio.run(_run_command, handler, args, out)
        sys.stdout.flush()
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
        _error(f'{type(error).__name__}: {error} (--debug shows the traceback)')
        return 1
    return 0


async def _run_command(handler: _commands.Command, args: argparse.Namespace, out: _commands.Output) -> None:
    try:
        await handler(args, out)
    finally:
        await out.close()


def _error(message: str) -> None:
    """One line on stderr; what the message quotes (a store's text, a run id) is escaped, never obeyed."""
    first_line = ' '.join(printable(message.split('\n')[0]).split()) if message else 'unknown error'
    sys.stderr.write(f'{PROG}: error: {first_line}\n')
