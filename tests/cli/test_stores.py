"""`--store` values: URL schemes, bare paths, clear errors, and adding a backend."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import anyio
import pytest

from pydantic_ai_steps._errors import StoreUnavailableError
from pydantic_ai_steps.cli import _stores, main
from pydantic_ai_steps.cli._errors import CliError
from pydantic_ai_steps.step_persistence import InMemoryStepStore, SqliteStepStore
from pydantic_ai_steps.store import Probe, registry
from pydantic_ai_steps.store.protocol import ManagedStepStore
from tests.conftest import require_env

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
    location = _stores.locate(url)
    assert (location.scheme.scheme, location.target, location.url) == (scheme, target, url)


@pytest.mark.parametrize(
    ('value', 'message'),
    [
        ('sqlite://host/steps.db', 'expected sqlite:///relative/path.db or sqlite:////absolute/path.db'),
        ('sqlite:///', 'expected sqlite:///relative/path.db'),
        ('sqlite:steps.db', 'expected sqlite:///relative/path.db'),
        ('sqlite:///steps.db?mode=ro', 'query strings and fragments are not supported'),
        ('sqlite:////', "bad SQLite store URL 'sqlite:////': no database file named"),
        ('sqlite:///a%00b.db', 'a path cannot hold a NUL character (%00)'),
        ('file://server/share', 'expected file:///absolute/dir or file:relative/dir'),
        ('file:', 'no directory given'),
        (
            'redis://localhost/steps',
            "unknown store scheme 'redis:' in 'redis://localhost/steps'; known schemes: sqlite:, file:, memory:",
        ),
        ('', 'empty store URL'),
    ],
)
def test_bad_urls_say_what_is_expected(value: str, message: str) -> None:
    with pytest.raises(CliError, match=re.escape(message)):
        _stores.locate(value)


def test_bare_paths(tmp_path: Path) -> None:
    assert _stores.locate(str(tmp_path / 'new.db')).scheme.scheme == 'sqlite'
    assert _stores.locate(str(tmp_path / 'new.sqlite3')).scheme.scheme == 'sqlite'
    assert _stores.locate('C:\\Users\\me\\steps.db').scheme.scheme == 'sqlite'  # a drive letter is no scheme
    directory = _stores.locate(str(tmp_path))
    assert (directory.scheme.scheme, directory.url) == ('file', 'file://' + tmp_path.resolve().as_posix())
    headerless = tmp_path / 'steps.data'
    sqlite3.connect(headerless).execute('CREATE TABLE t (x)').connection.close()
    assert _stores.locate(str(headerless)).scheme.scheme == 'sqlite'  # recognised by its header
    assert _stores.locate('relative.db').url == 'sqlite:///relative.db'


def test_bare_paths_that_name_nothing(tmp_path: Path) -> None:
    text = tmp_path / 'notes.txt'
    text.write_text('hello')
    with pytest.raises(CliError, match='is neither a SQLite database nor a directory'):
        _stores.locate(str(text))
    with pytest.raises(
        CliError, match=r'no store at .*must end in \.db, \.sqlite, \.sqlite3 \(SQLite\) or be an existing'
    ):
        _stores.locate(str(tmp_path / 'missing'))


def test_open_existing_never_creates_or_touches(tmp_path: Path) -> None:
    async def check() -> None:
        with pytest.raises(CliError, match=r'^no store at sqlite:///.*missing\.db \(.*does not exist\)$'):
            await _stores.open_existing(f'sqlite:///{tmp_path}/missing.db')
        assert not (tmp_path / 'missing.db').exists()
        with pytest.raises(CliError, match='no store at'):
            await _stores.open_existing(f'file://{tmp_path}/missing-dir')
        assert not (tmp_path / 'missing-dir').exists()

        other = tmp_path / 'other.db'
        connection = sqlite3.connect(other)
        connection.execute('CREATE TABLE notes (x)')
        connection.close()
        with pytest.raises(CliError, match=r'is not a step store: .* has no runs table'):
            await _stores.open_existing(str(other))
        tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [('notes',)]  # checking did not create the store's tables

        fake = tmp_path / 'fake.db'
        fake.write_text('not sqlite')
        with pytest.raises(CliError, match='is not a SQLite database'):
            await _stores.open_existing(str(fake))

    anyio.run(check)


class _DictScheme(registry.StoreScheme):
    """A kind of store added from outside the package: `dictmem://NAME` stores held in a dict."""

    scheme = 'dictmem'
    example = 'dictmem://name'

    def __init__(self) -> None:
        self.stores: dict[str, InMemoryStepStore] = {}

    def parse(self, url: str) -> registry.StoreLocation:
        return registry.StoreLocation(self, url.removeprefix('dictmem://'), url)

    def open(self, location: registry.StoreLocation, **options: object) -> ManagedStepStore:
        if location.target not in self.stores:
            return _Absent()
        return self.stores[location.target]


class _Absent(InMemoryStepStore):
    async def probe(self) -> Probe:
        return Probe(exists=False, step_store=False)


@pytest.fixture
def dict_scheme() -> Iterator[_DictScheme]:
    kind = _DictScheme()
    registry.register_scheme(kind)
    try:
        yield kind
    finally:
        del registry.SCHEMES['dictmem']


def test_a_new_kind_of_store_is_one_registration(dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str]) -> None:
    store = dict_scheme.stores['demo'] = InMemoryStepStore()
    population = anyio.run(populate, store)
    assert main(['runs', '--store', 'dictmem://demo', '--json']) == 0
    runs = json.loads(capsys.readouterr().out)
    assert {run['run_id'] for run in runs} == set(vars(population).values())
    assert main(['tree', population.orchestrator, '--store', 'dictmem://demo']) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith('└─ ' + population.librarian)
    assert main(['stats', '--store', 'dictmem://demo']) == 0
    assert re.search(r'media blobs\s+0', capsys.readouterr().out)
    assert main(['runs', '--store', 'dictmem://absent']) == 1
    assert capsys.readouterr().err == 'pydantic-ai-steps: error: no store at dictmem://absent\n'


class _Silent(InMemoryStepStore):
    """A server that accepts the connection and never answers."""

    closed = False

    async def probe(self) -> Probe:
        await anyio.sleep_forever()
        raise AssertionError('unreachable')

    async def aclose(self) -> None:
        self.closed = True


def test_a_store_that_never_answers_is_one_line_after_the_probe_deadline(
    dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_stores, 'PROBE_SECONDS', 0.2)
    silent = dict_scheme.stores['hung'] = _Silent()
    assert main(['runs', '--store', 'dictmem://hung']) == 1
    said = capsys.readouterr().err
    assert said == 'pydantic-ai-steps: error: the store at dictmem://hung did not answer within 0.2 s\n'
    assert silent.closed


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ('url', 'said'),
    [
        ('mongodb://steps:s3cret@127.0.0.1:{port}/agents?serverSelectionTimeoutMS=300', 'Connect call failed'),
        ('postgresql://steps:s3cret@127.0.0.1:{port}/agents', 'could not be reached: ConnectionRefusedError'),
        ('postgresql://steps@127.0.0.1:{port}/agents?password=s3cret', 'could not be reached: ConnectionRefusedError'),
        (
            'mongodb://127.0.0.1:{port}/agents?tlsCertificateKeyFilePassword=s3cret&serverSelectionTimeoutMS=300',
            'Connect call failed',
        ),
    ],
)
def test_a_server_that_is_down_is_named_in_one_line_without_its_password(
    url: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    value = url.format(port=_closed_port())
    assert main(['runs', '--store', value]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'pydantic-ai-steps: error: cannot reach the store at {value.replace("s3cret", "***")}: ')
    assert said in err
    assert 's3cret' not in err and 'Topology' not in err and '--debug' not in err
    assert err.count('\n') == 1


class _Vanishing(InMemoryStepStore):
    """A server that answers the probe, then goes away."""

    async def list_runs(self, *args: object, **kwargs: object) -> NoReturn:
        raise StoreUnavailableError('the PostgreSQL server named by dsn= could not be reached: ConnectionResetError')


def _runs_error(
    dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str], name: str, store: InMemoryStepStore
) -> str:
    """What `runs` prints on stderr (and that it fails) for a `dictmem://` store behaving as `store` does."""
    dict_scheme.stores[name] = store
    assert main(['runs', '--store', f'dictmem://{name}']) == 1
    return capsys.readouterr().err


def test_a_server_lost_during_a_command_is_one_line_without_a_traceback_hint(
    dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _runs_error(dict_scheme, capsys, 'gone', _Vanishing()) == (
        'pydantic-ai-steps: error: lost the store: the PostgreSQL server named by dsn= could not be reached: '
        'ConnectionResetError\n'
    )


class _PoolExhausted(StoreUnavailableError, TimeoutError):
    """What a pool says when no connection became free in time: a timeout of its own."""


class _Exhausted(InMemoryStepStore):
    async def probe(self) -> Probe:
        raise _PoolExhausted('no connection became free within 5 s (pool of 1)')


def test_a_drivers_own_timeout_is_its_message_not_the_probe_deadline(
    dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _runs_error(dict_scheme, capsys, 'busy', _Exhausted()) == (
        'pydantic-ai-steps: error: cannot reach the store at dictmem://busy: '
        'no connection became free within 5 s (pool of 1)\n'
    )


def _with_database(dsn: str, database: str) -> str:
    return dsn.rsplit('/', 1)[0] + '/' + database


@pytest.mark.parametrize(
    ('make_url', 'said'),
    [
        (
            lambda dsn: dsn + '?table=BAD-x',
            "bad postgresql store URL '{url}': invalid table name: 'BAD-x'; expected [a-z_][a-z0-9_]{{0,39}}",
        ),
        (
            lambda dsn: _with_database(dsn, 'no_such_database'),
            'cannot open the store at {url}: the server refused: database "no_such_database" does not exist',
        ),
        (
            lambda dsn: dsn.replace('//steps@', '//no_such_role:s3cret@'),
            'cannot open the store at {url}: the server refused: role "no_such_role" does not exist',
        ),
        (
            lambda dsn: dsn + '?sslmode=bogus',
            'cannot open the store at {url}: the PostgreSQL URL given as dsn= is not usable: `sslmode` parameter '
            'must be one of: disable,',
        ),
    ],
    ids=['table', 'database', 'role', 'sslmode'],
)
def test_a_postgresql_url_the_server_or_driver_rejects_is_one_line_naming_the_store(
    make_url: Callable[[str], str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = make_url(require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN'])
    assert main(['runs', '--store', url]) == 1
    err = capsys.readouterr().err
    assert err.startswith('pydantic-ai-steps: error: ' + said.format(url=url.replace('s3cret', '***')))
    assert 's3cret' not in err and '--debug' not in err and 'Error:' not in err
    assert err.count('\n') == 1


def test_a_mongodb_url_with_an_unknown_option_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    url = require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL'] + '/agents?tls=false;table=steps'
    assert main(['runs', '--store', url]) == 1
    err = capsys.readouterr().err
    said = f"bad mongodb store URL '{url}': unknown option 'table': Unknown option."
    assert err.startswith(f'pydantic-ai-steps: error: {said}')
    assert '--debug' not in err and err.count('\n') == 1


def test_a_bad_keyword_option_is_not_blamed_on_the_url() -> None:
    """`?table=` is the URL's; a keyword is the caller's, and its error is the store's own `ValueError`."""
    dsn = require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']
    with pytest.raises(ValueError, match='acquire_timeout') as raised:
        registry.open_step_store(dsn, acquire_timeout=-1)
    assert not isinstance(raised.value, registry.StoreUrlError)
    with pytest.raises(ValueError, match="invalid table name: 'BAD-x'") as raised:
        registry.open_step_store(dsn, table='BAD-x')
    assert not isinstance(raised.value, registry.StoreUrlError)


class _Unauthenticated(InMemoryStepStore):
    """What pymongo raises when the server refuses the credentials: its message, then the whole reply."""

    async def probe(self) -> Probe:
        from pymongo.errors import OperationFailure

        reply = {'ok': 0.0, 'errmsg': 'Authentication failed.', 'code': 18, '$clusterTime': {'signature': b'\x00' * 8}}
        raise OperationFailure('Authentication failed.', code=18, details=reply)


def test_a_mongodb_server_refusing_the_credentials_is_its_message_in_one_line(
    dict_scheme: _DictScheme, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _runs_error(dict_scheme, capsys, 'locked', _Unauthenticated()) == (
        'pydantic-ai-steps: error: cannot open the store at dictmem://locked: the server refused: '
        'Authentication failed.\n'
    )


def test_a_postgresql_url_with_its_host_in_the_query_reaches_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    """libpq's form for Unix sockets and host lists: `postgresql://user@/db?host=...&port=...`."""
    dsn = require_env('TEST_POSTGRES_DSN')['TEST_POSTGRES_DSN']
    netloc = dsn.split('://', 1)[1].split('/', 1)[0]
    host, port = netloc.split('@', 1)[1].rsplit(':', 1)
    url = dsn.replace(f'@{host}:{port}/', '@/') + f'?host={host}&port={port}&table=no_such_prefix'
    assert main(['runs', '--store', url]) == 1
    assert capsys.readouterr().err == (
        f"pydantic-ai-steps: error: no store at {url} (no tables with the prefix 'no_such_prefix')\n"
    )


def test_a_mongodb_url_naming_a_tls_file_that_cannot_be_read_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    server = require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL']
    url = f'{server}/agents?tls=true&tlsCertificateKeyFile=/no/such/key.pem'
    assert main(['runs', '--store', url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pydantic-ai-steps: error: bad mongodb store URL '{url}': ")
    assert 'tlscertificatekeyfile file is not readable' in err and '--debug' not in err and err.count('\n') == 1


def test_a_wal_database_its_user_cannot_read_is_not_called_a_non_store(tmp_path: Path) -> None:
    """A WAL database in a directory the user may not write: SQLite cannot create its `-shm` file to
    read it. The CLI says that, not "not a step store". As root, the check runs as `nobody`."""

    async def write() -> None:
        async with SqliteStepStore(database=tmp_path / 'steps.db') as store:
            await populate(store)

    anyio.run(write)
    command = [sys.executable, '-m', 'pydantic_ai_steps.cli']
    if os.geteuid() == 0:  # root writes anywhere: read as an unprivileged user instead
        setpriv = shutil.which('setpriv')
        if setpriv is None:
            pytest.skip('running as root without setpriv: no unprivileged user to read as')
        command = [setpriv, '--reuid', '65534', '--regid', '65534', '--clear-groups', *command]
    locked = Path(tempfile.mkdtemp(prefix='steps-read-only-'))  # not under tmp_path: `nobody` must reach it
    try:
        shutil.copy(tmp_path / 'steps.db', locked / 'steps.db')
        with sqlite3.connect(locked / 'steps.db') as conn:
            assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
        conn.close()
        (locked / 'steps.db').chmod(0o444)
        locked.chmod(0o555)
        result = subprocess.run(
            [*command, '--store', str(locked / 'steps.db'), 'runs'], capture_output=True, text=True, timeout=60
        )
    finally:
        locked.chmod(0o755)
        shutil.rmtree(locked)
    assert result.returncode == 1, result.stderr
    assert 'is not a step store' not in result.stderr
    assert f'cannot read the store at sqlite:///{locked}/steps.db: ' in result.stderr
    assert 'steps.db-shm beside it' in result.stderr
    assert 'Traceback' not in result.stderr
