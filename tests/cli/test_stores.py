"""`--store` values: URL schemes, bare paths, clear errors, and adding a backend."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from pydantic_ai_steps.cli import _stores, main
from pydantic_ai_steps.cli._errors import CliError
from pydantic_ai_steps.step_persistence import InMemoryStepStore

from .populate import populate


@pytest.mark.parametrize(
    ('url', 'scheme', 'target'),
    [
        ('sqlite:///steps.db', 'sqlite', 'steps.db'),
        ('sqlite:///data/steps.db', 'sqlite', 'data/steps.db'),
        ('sqlite:////var/lib/steps.db', 'sqlite', '/var/lib/steps.db'),
        ('sqlite:///my%20steps.db', 'sqlite', 'my steps.db'),
        ('file:///var/lib/steps', 'file', '/var/lib/steps'),
        ('file://localhost/var/lib/steps', 'file', '/var/lib/steps'),
        ('file:relative/steps', 'file', 'relative/steps'),
        ('SQLITE:///steps.db', 'sqlite', 'steps.db'),
    ],
)
def test_urls(url: str, scheme: str, target: str) -> None:
    location = _stores.resolve(url)
    assert (location.backend.scheme, location.target, location.url) == (scheme, target, url)


@pytest.mark.parametrize(
    ('value', 'message'),
    [
        ('sqlite://host/steps.db', 'expected sqlite:///relative/path.db or sqlite:////absolute/path.db'),
        ('sqlite:///', 'expected sqlite:///relative/path.db'),
        ('sqlite:steps.db', 'expected sqlite:///relative/path.db'),
        ('sqlite:///steps.db?mode=ro', 'query strings and fragments are not supported'),
        ('file://server/share', 'expected file:///absolute/dir or file:relative/dir'),
        ('file:', 'no directory given'),
        (
            'mongodb://localhost/steps',
            "unknown store scheme 'mongodb:' in 'mongodb://localhost/steps'; known schemes: sqlite:, file:",
        ),
        ('', 'empty --store'),
    ],
)
def test_bad_urls_say_what_is_expected(value: str, message: str) -> None:
    with pytest.raises(CliError, match=re.escape(message)):
        _stores.resolve(value)


def test_bare_paths(tmp_path: Path) -> None:
    assert _stores.resolve(str(tmp_path / 'new.db')).backend.scheme == 'sqlite'
    assert _stores.resolve(str(tmp_path / 'new.sqlite3')).backend.scheme == 'sqlite'
    assert _stores.resolve('C:\\Users\\me\\steps.db').backend.scheme == 'sqlite'  # a drive letter is no scheme
    directory = _stores.resolve(str(tmp_path))
    assert (directory.backend.scheme, directory.url) == ('file', 'file://' + tmp_path.resolve().as_posix())
    headerless = tmp_path / 'steps.data'
    sqlite3.connect(headerless).execute('CREATE TABLE t (x)').connection.close()
    assert _stores.resolve(str(headerless)).backend.scheme == 'sqlite'  # recognised by its header
    assert _stores.resolve('relative.db').url == 'sqlite:///relative.db'


def test_bare_paths_that_name_nothing(tmp_path: Path) -> None:
    text = tmp_path / 'notes.txt'
    text.write_text('hello')
    with pytest.raises(CliError, match='is neither a SQLite database nor a directory'):
        _stores.resolve(str(text))
    with pytest.raises(
        CliError, match=r'no store at .*must end in \.db, \.sqlite, \.sqlite3 \(SQLite\) or be an existing'
    ):
        _stores.resolve(str(tmp_path / 'missing'))


def test_open_existing_never_creates_or_touches(tmp_path: Path) -> None:
    with pytest.raises(CliError, match=r'^no store at sqlite:///.*missing\.db \(.*missing\.db does not exist\)$'):
        _stores.open_existing(f'sqlite:///{tmp_path}/missing.db')
    assert not (tmp_path / 'missing.db').exists()
    with pytest.raises(CliError, match='does not exist'):
        _stores.open_existing(f'file://{tmp_path}/missing-dir')

    other = tmp_path / 'other.db'
    connection = sqlite3.connect(other)
    connection.execute('CREATE TABLE notes (x)')
    connection.close()
    with pytest.raises(CliError, match='is a SQLite database but not a step store'):
        _stores.open_existing(str(other))
    tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [('notes',)]  # checking did not create the store's tables

    fake = tmp_path / 'fake.db'
    fake.write_text('not sqlite')
    with pytest.raises(CliError, match='is not a SQLite database'):
        _stores.open_existing(str(fake))


class _MemoryBackend(_stores.Backend):
    """A backend added from outside the package: `memory://NAME` stores held in a dict."""

    scheme = 'memory'
    example = 'memory://name'

    def __init__(self) -> None:
        self.stores: dict[str, InMemoryStepStore] = {}

    def parse(self, url: str) -> _stores.StoreLocation:
        return _stores.StoreLocation(self, url.removeprefix('memory://'), url)

    def exists(self, location: _stores.StoreLocation) -> bool:
        return location.target in self.stores

    def check_store(self, location: _stores.StoreLocation) -> None:
        pass

    def open(self, location: _stores.StoreLocation) -> _stores.InspectableStore:
        return self.stores[location.target]

    def size_bytes(self, location: _stores.StoreLocation) -> int:
        return 0

    def media_blobs(self, location: _stores.StoreLocation) -> int | None:
        return None

    def remove(self, location: _stores.StoreLocation) -> None:
        self.stores.pop(location.target, None)


@pytest.fixture
def memory_backend() -> Iterator[_MemoryBackend]:
    backend = _MemoryBackend()
    _stores.register_backend(backend)
    try:
        yield backend
    finally:
        del _stores.BACKENDS['memory']


def test_a_new_backend_is_one_registration(memory_backend: _MemoryBackend, capsys: pytest.CaptureFixture[str]) -> None:
    store = memory_backend.stores['demo'] = InMemoryStepStore()
    population = anyio.run(populate, store)
    assert main(['runs', '--store', 'memory://demo', '--json']) == 0
    runs = json.loads(capsys.readouterr().out)
    assert {run['run_id'] for run in runs} == set(vars(population).values())
    assert main(['tree', population.orchestrator, '--store', 'memory://demo']) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith('└─ ' + population.librarian)
    assert main(['stats', '--store', 'memory://demo']) == 0
    assert 'media blobs         unknown' in capsys.readouterr().out
    assert main(['runs', '--store', 'memory://absent']) == 1
    assert capsys.readouterr().err == (
        'pydantic-ai-steps: error: no store at memory://absent (absent does not exist)\n'
    )
