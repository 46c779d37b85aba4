"""What a user reaches for after a crash: --store anywhere or from the environment, id prefixes,
filters, tool arguments and delegates in the log, resolving an unknown effect, and removing runs."""

from __future__ import annotations

import argparse
import getpass
import json
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.cli import main
from pydantic_ai_steps.cli._app import build_parser
from pydantic_ai_steps.step_persistence import RunRecord, ToolEffectRecord
from pydantic_ai_steps.testing.step_store import T0

from .conftest import PopulatedStore, open_store, populate_and_close, run_cli_inprocess


def ok(*args: str, **env: str | None) -> str:
    result = run_cli_inprocess(*args, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_store_before_or_after_the_command_or_from_the_environment(populated: PopulatedStore) -> None:
    after = ok('runs', '--json', '--store', populated.url)
    assert ok('--store', populated.url, 'runs', '--json') == after
    assert ok('runs', '--json', PYDANTIC_AI_STEPS_STORE=populated.url) == after
    elsewhere = ok('--store', 'sqlite:///nowhere.db', 'runs', '--json', '--store', populated.url)
    assert elsewhere == after  # the one after the command wins


def test_version_and_help_for_every_argument() -> None:
    result = run_cli_inprocess('--version')
    assert result.returncode == 0 and result.stdout.startswith('pydantic-ai-steps ')
    parser = build_parser()
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))  # pyright: ignore[reportPrivateUsage]
    for name, command in subparsers.choices.items():
        for action in command._actions:  # pyright: ignore[reportPrivateUsage]
            assert action.help, f'{name} {action.dest} has no help text'


def test_a_unique_prefix_names_a_run_and_an_ambiguous_one_lists_them(populated: PopulatedStore) -> None:
    runs = populated.runs
    full = json.loads(ok('events', runs.librarian, '--json', '--store', populated.url))
    assert json.loads(ok('events', runs.librarian[:-3], '--json', '--store', populated.url)) == full
    ambiguous = run_cli_inprocess('events', 'c', '--store', populated.url)  # crashed-1, code_librarian-...
    assert ambiguous.returncode == 1
    assert "'c' is the start of 2 run ids" in ambiguous.stderr and runs.crashed in ambiguous.stderr


def test_a_blank_run_names_no_run_even_in_a_store_of_one(tmp_path: Path) -> None:
    """An empty prefix matches every id: in a store of one run, `delete "$UNSET" --yes` took it."""
    store, url = open_store('sqlite', tmp_path)

    async def one_run() -> None:
        async with store:
            await store.register_run(RunRecord(run_id='keep-me', started_at=T0))

    anyio.run(one_run)
    for blank in ('', ' '):
        for command in (['delete', blank, '--yes'], ['events', blank]):
            refused = run_cli_inprocess(*command, '--store', url)
            assert refused.returncode == 1 and 'names no run' in refused.stderr, refused
    assert 'keep-me' in ok('runs', '--store', url)


def test_delete_yes_removes_a_run_named_whole_not_by_a_prefix(tmp_path: Path) -> None:
    """`delete run-1 --yes` after `run-1` went would take `run-12`, the one id left that it starts:
    a prefix shows the plan, and only the whole id removes."""
    store, url = open_store('sqlite', tmp_path)

    async def two_runs() -> None:
        async with store:
            for run_id in ('run-1', 'run-12'):
                await store.register_run(RunRecord(run_id=run_id, started_at=T0))

    anyio.run(two_runs)
    assert 'removed 1 run: run-1' in ok('delete', 'run-1', '--yes', '--store', url)
    assert 'would remove 1 run: run-12' in ok('delete', 'run-1', '--dry-run', '--store', url)
    refused = run_cli_inprocess('delete', 'run-1', '--yes', '--store', url)
    assert refused.returncode == 1 and "'run-1' is the start of 'run-12': give that id" in refused.stderr, refused
    assert 'run-12' in ok('runs', '--store', url)
    assert 'removed 1 run: run-12' in ok('delete', 'run-12', '--yes', '--store', url)


def test_runs_filters_and_limit(populated: PopulatedStore) -> None:
    def ids(*options: str) -> list[str]:
        return [run['run_id'] for run in json.loads(ok('runs', '--json', '--store', populated.url, *options))]

    runs = populated.runs
    assert ids('--status', 'failed') == [runs.failed]
    assert ids('--status', 'unfinished') == [runs.crashed]
    assert runs.orchestrator in ids('--status', 'completed')
    assert ids('--agent', 'deployer') == [runs.crashed]
    every = ids()
    assert ids('--limit', '2') == every[-2:]  # the newest two, still oldest first
    assert run_cli_inprocess('runs', '--limit', 'two', '--store', populated.url).returncode == 2


def test_events_show_tool_arguments_and_the_delegate_a_call_started(populated: PopulatedStore) -> None:
    runs = populated.runs
    events = json.loads(ok('events', runs.orchestrator, '--json', '--store', populated.url))
    (started,) = [event for event in events if event['kind'] == 'tool_call_started']
    assert started['tool_args'] and json.loads(started['tool_args'])
    assert started['child_run_ids'] == [runs.librarian]
    table = ok('events', runs.orchestrator, '--store', populated.url)
    assert 'ARGUMENTS' in table and 'DELEGATED TO' in table and runs.librarian in table


def test_resolving_an_unknown_effect(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    (effect,) = json.loads(ok('effects', runs.crashed, '--unresolved', '--json', '--store', url))
    refused = run_cli_inprocess('effects', 'resolve', runs.crashed, effect['tool_call_id'], '--store', url)
    assert refused.returncode == 1 and '--done' in refused.stderr
    said = ok(
        'effects',
        'resolve',
        runs.crashed,
        effect['tool_call_id'],
        '--not-done',
        '--note',
        'not in the tracker',
        '--by',
        'ops',
        '--store',
        url,
    )
    assert 'resolved not done (ops' in said
    assert json.loads(ok('effects', runs.crashed, '--unresolved', '--json', '--store', url)) == []
    assert 'not in the tracker' in ok('effects', runs.crashed, '--store', url)
    stats = json.loads(ok('stats', '--json', '--store', url))
    assert stats['unresolved_effects'] == 0
    assert '1 unresolved tool effect' not in ok('tree', '--store', url)


def test_a_resolution_is_refused_a_second_time_unless_replaced(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    (effect,) = json.loads(ok('effects', runs.crashed, '--unresolved', '--json', '--store', url))
    call = effect['tool_call_id']
    ok('effects', 'resolve', runs.crashed, call, '--not-done', '--by', 'orchestrator', '--store', url)
    again = run_cli_inprocess('effects', 'resolve', runs.crashed, call, '--done', '--by', 'root', '--store', url)
    assert again.returncode == 1
    assert f"tool call '{call}' of run '{runs.crashed}' is already resolved: not_done by 'orchestrator'" in again.stderr
    assert 'pass --replace to overwrite it' in again.stderr and 'replace=True' not in again.stderr
    (kept,) = [
        row for row in json.loads(ok('effects', runs.crashed, '--json', '--store', url)) if row['tool_call_id'] == call
    ]
    assert (kept['resolution'], kept['resolved_by']) == ('not_done', 'orchestrator')
    replaced = json.loads(
        ok('effects', 'resolve', runs.crashed, call, '--done', '--by', 'root', '--replace', '--json', '--store', url)
    )
    assert (replaced['resolution'], replaced['resolved_by'], replaced['status']) == ('done', 'root', 'started')
    for flag in (['--replace'], ['--note', ''], ['--by', '']):
        misplaced = run_cli_inprocess('effects', runs.crashed, *flag, '--store', url)
        assert misplaced.returncode == 1 and '--replace go with `effects resolve RUN CALL`' in misplaced.stderr


def test_a_run_named_resolve_is_shown_with_run(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)

    async def write() -> None:
        async with store:
            await store.register_run(RunRecord(run_id='resolve', started_at=T0))
            effect = ToolEffectRecord(tool_call_id='c1', tool_name='post', run_id='resolve', status='started')
            await store.record_tool_effect(effect)

    anyio.run(write)
    (shown,) = json.loads(ok('effects', '--run', 'resolve', '--json', '--store', url))
    assert (shown['run_id'], shown['tool_call_id'], shown['status']) == ('resolve', 'c1', 'started')
    assert 'c1' in ok('effects', '--store', url, '--run', 'resolve', '--unresolved')
    bare = run_cli_inprocess('effects', 'resolve', '--store', url)  # the subcommand, missing RUN CALL
    assert bare.returncode == 1 and 'a run named resolve: effects --run resolve' in bare.stderr
    both = run_cli_inprocess('effects', 'other', '--run', 'resolve', '--store', url)
    assert both.returncode == 1 and 'takes no other RUN' in both.stderr
    assert 'resolved done' in ok('effects', 'resolve', 'resolve', 'c1', '--done', '--store', url)
    assert '`effects --run resolve`' in ok('effects', '--help')


def test_delete_prune_and_gc_show_before_they_remove(tmp_path: Path) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    refused = run_cli_inprocess('delete', runs.failed, '--store', url)
    assert refused.returncode == 1 and 'pass --yes' in refused.stderr
    assert 'would remove 1 run: ' + runs.failed in refused.stdout
    assert runs.failed in ok('runs', '--store', url)  # nothing removed
    assert 'would remove 1 run' in ok('delete', runs.failed, '--dry-run', '--store', url)
    removed = ok('delete', runs.failed, '--yes', '--store', url)
    assert f'removed 1 run: {runs.failed}' in removed and 'store size:' in removed
    assert runs.failed not in ok('runs', '--store', url)
    both = ok('delete', '--conversation', 'conv-orch', '--include-delegates', '--yes', '--store', url)
    assert 'removed 2 runs' in both and runs.librarian in both
    pruned = ok('prune', '--older-than', '30d', '--dry-run', '--store', url)
    assert 'would remove' in pruned and runs.crashed in pruned  # written with a timestamp of 2026-01-02
    assert 'removed' in ok('prune', '--older-than', '30d', '--yes', '--store', url)
    bad = run_cli_inprocess('prune', '--older-than', 'a month', '--store', url)
    assert bad.returncode == 2 and 'expected an age such as 30d' in bad.stderr
    unsafe = run_cli_inprocess('gc', '--grace', '5m', '--yes', '--store', url)
    assert unsafe.returncode == 1, unsafe
    assert unsafe.stderr == (
        'pydantic-ai-steps: error: --grace 5m is under 10m: a writer still running could be about to reference a '
        'blob put that recently; give a longer --grace, or --writers-stopped if no process writes to this store '
        'meanwhile\n'
    )
    collected = ok('gc', '--grace', '0s', '--writers-stopped', '--yes', '--store', url)
    assert 'removed' in collected and 'blob' in collected


@pytest.mark.parametrize(
    ('option', 'value', 'most'),
    [
        ('--older-than', '99999999999999d', 'at most 999999999d'),
        ('--older-than', '142857143w', 'at most 142857142w (999999999 days)'),
        ('--older-than', '9' * 5000 + 's', 'at most 86399999999999s'),
        ('--grace', '99999999999999999w', 'at most 142857142w'),
    ],
)
def test_an_age_longer_than_any_is_refused_naming_the_longest(option: str, value: str, most: str) -> None:
    command = 'gc' if option == '--grace' else 'prune'
    refused = run_cli_inprocess(command, option, value, '--dry-run', '--store', 'sqlite:///never-opened.db')
    assert refused.returncode == 2, refused
    (error,) = [line for line in refused.stderr.splitlines() if 'error:' in line]
    assert f'argument {option}: age ' in error and most in error and len(error) < 200
    assert 'Traceback' not in refused.stderr


def test_huge_ages_and_counts_mean_no_bound(tmp_path: Path) -> None:
    """An age that fits but reaches back before year 1 removes nothing; a count above what a store
    can count means every run, in `runs --limit` and `prune --keep-last`."""
    store, url = open_store('sqlite', tmp_path)
    anyio.run(populate_and_close, store)
    every = ok('runs', '--json', '--store', url)
    huge = '9' * 30
    assert ok('runs', '--json', '--limit', huge, '--store', url) == every
    assert ok('runs', '--json', '--limit', '9' * 5000, '--store', url) == every
    assert 'would remove 0 runs' in ok('prune', '--older-than', '999999999d', '--dry-run', '--store', url)
    assert 'removed 0 runs' in ok('prune', '--older-than', '142857142w', '--yes', '--store', url)
    kept = ok('prune', '--older-than', '30d', '--keep-last', huge, '--yes', '--store', url)
    assert 'removed 0 runs' in kept
    assert 'removed 0 blobs' in ok('gc', '--grace', '999999999d', '--yes', '--store', url)
    assert ok('runs', '--json', '--store', url) == every  # nothing stored was harmed


@pytest.mark.parametrize('command', [['delete', 'x'], ['prune', '--older-than', '1d'], ['gc']])
def test_removing_commands_need_a_store(command: list[str]) -> None:
    result = run_cli_inprocess(*command, PYDANTIC_AI_STEPS_STORE=None)
    assert result.returncode == 1 and 'no store given' in result.stderr


def test_resolve_needs_to_know_who_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, url = open_store('sqlite', tmp_path)
    runs = anyio.run(populate_and_close, store)
    resolve = ('effects', 'resolve', runs.crashed, 'call-deploy', '--done', '--store', url)
    for blank in ('', ' '):
        refused = run_cli_inprocess(*resolve, '--by', blank)
        assert refused.returncode == 1
        assert refused.stderr == (
            f'pydantic-ai-steps: error: --by {blank!r} names no one: give who checked, or leave out --by for the '
            'user running this\n'
        )

    def nameless() -> str:
        raise KeyError('getpwuid(): uid not found: 4242')

    monkeypatch.setattr(getpass, 'getuser', nameless)  # a container's uid with no passwd entry
    assert main(list(resolve)) == 1  # in this process: patched
    assert capsys.readouterr().err == (
        'pydantic-ai-steps: error: no user name for this process to record as who resolved the call: pass --by WHO\n'
    )
    (effect,) = json.loads(run_cli_inprocess('effects', runs.crashed, '--json', '--store', url).stdout)
    assert effect['resolution'] is None


@pytest.mark.parametrize(
    'command', [['runs'], ['prune', '--older-than', '0s', '--yes'], ['delete', 'orch-1', '--yes'], ['demo']]
)
def test_an_empty_store_is_refused_not_replaced_by_the_environments(tmp_path: Path, command: list[str]) -> None:
    store, url = open_store('sqlite', tmp_path)
    anyio.run(populate_and_close, store)
    every = ok('runs', '--json', '--store', url)
    for spelling in (['--store', ''], ['--store=']):
        result = run_cli_inprocess(*command, *spelling, PYDANTIC_AI_STEPS_STORE=url, cwd=tmp_path)
        assert result.returncode == 1
        assert result.stderr == (
            "pydantic-ai-steps: error: --store '' names no store: give a URL or a path, or leave out --store to use "
            '$PYDANTIC_AI_STEPS_STORE\n'
        )
        assert result.stdout == ''
    assert ok('runs', '--json', '--store', url) == every
    assert sorted(path.name for path in tmp_path.iterdir()) == ['steps.db']  # no demo store either


def test_delete_names_what_it_got_when_it_needs_a_run_or_a_conversation() -> None:
    both = run_cli_inprocess('delete', 'orch-1', '--conversation', 'conv-1', '--store', 'sqlite:///unused.db')
    neither = run_cli_inprocess('delete', '--store', 'sqlite:///unused.db')
    assert (both.returncode, neither.returncode) == (1, 1)
    assert both.stderr == (
        "pydantic-ai-steps: error: delete takes a RUN or --conversation ID (one of them), got both 'orch-1' and "
        "--conversation 'conv-1'\n"
    )
    assert neither.stderr == (
        'pydantic-ai-steps: error: delete takes a RUN or --conversation ID (one of them), got neither\n'
    )
    long = run_cli_inprocess('delete', 'r' * 5000, '--conversation', 'c', '--store', 'sqlite:///unused.db')
    assert "(5000 characters) and --conversation 'c'" in long.stderr and len(long.stderr) < 500
