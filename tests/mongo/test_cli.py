"""The command line with `--store mongodb://host:port/database`: every inspector command, and the demo.

The inspector tests of `tests/cli/test_console.py` run here unchanged (imported, so pytest collects
them in this module) against a MongoDB store populated the same way; `stats` and `continue`, which
look at the storage itself, have versions of their own below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import pymongo
import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from pydantic_ai_steps.step_persistence import MongoStepStore

from ..cli.conftest import PopulatedStore, populate_and_close, run_cli_inprocess
from ..cli.test_console import (  # noqa: F401 - collected here, against the MongoDB store
    ok,
    test_effects,
    test_events,
    test_export_jsonl,
    test_runs_filters_and_json,
    test_runs_table,
    test_snapshot_json_round_trips_the_history,
    test_snapshot_renders_messages_and_media,
    test_snapshot_state_choice,
    test_tree,
)
from ..cli.test_demo import KEY, DemoRun, parse
from .conftest import mongo_url, new_database_name


@pytest.fixture(scope='module')
def mongodb() -> Iterator[tuple[str, str]]:
    """The test server's URL and a database for this module, dropped afterwards."""
    url, name = mongo_url(), new_database_name('cli')
    yield url, name
    with pymongo.MongoClient(url) as client:
        client.drop_database(name)


@pytest.fixture(scope='module')
def populated(mongodb: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> PopulatedStore:
    url, name = mongodb
    runs = anyio.run(populate_and_close, MongoStepStore(db_url=url, database=name))
    return PopulatedStore('mongodb', f'{url}/{name}', tmp_path_factory.mktemp('mongodb'), runs)


def test_stats(populated: PopulatedStore) -> None:
    stats = json.loads(ok('stats', '--json', '--store', populated.url))
    assert stats['store'] == populated.url
    assert (stats['runs'], stats['interrupted_snapshots'], stats['unresolved_effects']) == (5, 2, 1)
    assert stats['snapshots'] >= 6
    assert stats['media_blobs'] == 2  # the big image and the big text; the small image stays inline
    assert stats['bytes'] > 0  # what the server says the database takes
    assert 'media blobs         2' in ok('stats', '--store', populated.url)


def test_continue_prints_the_latest_history(populated: PopulatedStore) -> None:
    runs = populated.runs
    history = ModelMessagesTypeAdapter.validate_json(ok('continue', runs.librarian, '--store', populated.url))
    assert len(history) == 4
    frontier = ModelMessagesTypeAdapter.validate_json(
        ok('continue', runs.crashed, '--include-interrupted', '--store', populated.url)
    )
    assert len(frontier) == 2


def test_a_url_without_a_database_or_an_unknown_one_is_one_line(populated: PopulatedStore) -> None:
    bare = populated.url.rsplit('/', 1)[0]
    result = run_cli_inprocess('runs', '--store', bare)
    assert result.returncode == 1 and result.stderr.count('\n') == 1
    assert 'names no database: put it in the path' in result.stderr
    missing = f'{bare}/{new_database_name("nothing")}'
    result = run_cli_inprocess('runs', '--store', missing)
    assert result.returncode == 1 and result.stderr.count('\n') == 1
    assert f'no store at {missing}' in result.stderr


# --- the demo ----------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def demo(mongodb: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    url, _ = mongodb
    name = new_database_name('demo')
    cwd = tmp_path_factory.mktemp('demo-mongodb')
    result = run_cli_inprocess('demo', '--store', f'{url}/{name}', cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ''
    yield parse(cwd, result.stdout)
    with pymongo.MongoClient(url) as client:
        client.drop_database(name)


def store_of(demo: DemoRun) -> str:
    match = re.search(r'^store:  (\S+) \(new\)$', demo.output, re.MULTILINE)
    assert match, demo.output
    return match[1]


def test_the_demo_tells_its_story_on_a_mongodb_store(demo: DemoRun) -> None:
    assert store_of(demo).startswith('mongodb://')
    steps = [int(number) for number in re.findall(r'^(\d+)\. ', demo.output, re.MULTILINE)]
    assert steps == list(range(1, 9))
    flat = ' '.join(demo.output.split())
    assert 'It called only post_finding; the earlier reads came from the snapshot' in flat
    (comment,) = [json.loads(line) for line in (demo.cwd / 'steps-demo.outbox.jsonl').read_text().splitlines()]
    assert comment['idempotency_key'] == KEY  # the side effect happened exactly once


def test_every_command_the_demo_suggests_runs_on_it(demo: DemoRun) -> None:
    commands = demo.commands()
    assert {args[0] for args in commands} == {'events', 'tree', 'effects', 'snapshot', 'continue', 'runs', 'stats'}
    for args in commands:
        assert args[-2:] == ['--store', store_of(demo)]
        demo.run(args)
    assert json.loads(demo.run(['effects', demo.crashed, '--unresolved', '--json', '--store', store_of(demo)])) == []
    effects = json.loads(demo.run(['effects', demo.crashed, '--json', '--store', store_of(demo)]))
    (effect,) = [effect for effect in effects if effect['status'] == 'started']
    assert (effect['tool_name'], effect['idempotency_key'], effect['resolution']) == ('post_finding', KEY, 'not_done')


def test_a_second_demo_resets_the_mongodb_store(demo: DemoRun, tmp_path: Path) -> None:
    result = run_cli_inprocess('demo', '--store', store_of(demo), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert 'reset: deleted the 3 runs of the previous demo' in result.stdout
    assert len(json.loads(demo.run(['runs', '--json', '--store', store_of(demo)]))) == 3
