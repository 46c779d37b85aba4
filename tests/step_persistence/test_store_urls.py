"""Store URLs: a password is never shown, however it is spelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydantic_ai_steps._urls import redacted_url
from pydantic_ai_steps.cli import main
from pydantic_ai_steps.step_persistence import FileStepStore, SqliteStepStore, open_step_store
from pydantic_ai_steps.store.registry import StoreUrlError, resolve


@pytest.mark.parametrize(
    'url',
    [
        'postgresql://app:Tr0ub4dor/3@127.0.0.1:5432/db',
        'postgresql://app:hun?ter2@127.0.0.1:5432/db',
        'postgresql://app:hun#ter2@127.0.0.1:5432/db',
        'mongodb://app:Tr0ub4dor/3@127.0.0.1/agents',
    ],
)
def test_a_raw_slash_question_mark_or_hash_in_a_password_is_refused_without_showing_it(url: str) -> None:
    with pytest.raises(StoreUrlError, match='percent-encoded') as refused:
        open_step_store(url)
    message = str(refused.value)
    assert 'Tr0ub4dor' not in message and 'hun' not in message and 'ter2' not in message
    assert 'app:***@127.0.0.1' in message


@pytest.mark.parametrize(
    ('url', 'shown'),
    [
        ('postgresql://app:s3cret@db.example:5432/steps', 'postgresql://app:***@db.example:5432/steps'),
        ('postgresql://app:s3/cret@db.example/steps', 'postgresql://app:***@db.example/steps'),
        ('postgresql://app@db.example/steps', 'postgresql://app@db.example/steps'),
        ('mongodb://app:pw@host/agents?authSource=a@b', 'mongodb://app:***@b'),  # more hidden, never less
    ],
)
def test_redaction_hides_everything_between_the_user_and_the_last_at(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_an_at_sign_in_the_query_alone_is_not_taken_for_a_password() -> None:
    location = resolve('postgresql://db.example:5432/steps?application_name=a@b')  # parsed, not connected
    assert location.target == 'postgresql://db.example:5432/steps?application_name=a@b'


@pytest.mark.parametrize(
    ('url', 'reason'),
    [
        ('postgresql://app:s3cret@127.0.0.1:99999/db', 'Port out of range'),
        ('postgresql://app:s3cret@[::1/db', 'Invalid IPv6 URL'),
        ('mongodb://app:s3cret@127.0.0.1:70000/agents', 'Port out of range'),
        ('mongodb://app:s3cret@h1:27017,h2:70000/agents', 'Port out of range'),
        ('postgresql://app:s3cret@h1:5432,h2:x/db', 'Port could not be cast'),
    ],
)
def test_a_malformed_server_url_is_a_store_url_error_naming_it(url: str, reason: str) -> None:
    with pytest.raises(StoreUrlError, match=reason) as refused:
        open_step_store(url)
    assert 'app:***@' in str(refused.value) and 's3cret' not in str(refused.value)


@pytest.mark.parametrize(
    'url',
    [
        'mongodb://h1:27017,h2:27018/agents?replicaSet=rs',
        'mongodb://[::1]:27017,[::2]:27018/agents',
        'postgresql://app@h1:5432,h2:5433/db',
    ],
)
def test_a_url_naming_several_hosts_opens_as_the_driver_takes_it(url: str) -> None:
    store = open_step_store(url)
    assert type(store).__name__ == ('MongoStepStore' if url.startswith('mongodb') else 'PostgresStepStore')


@pytest.mark.parametrize(
    ('url', 'name'),
    [
        ('postgresql://app:s3cret@db/steps?table=a&table=b', 'table'),
        ('postgres://app:s3cret@db/steps?sslmode=require&application_name=x&sslmode=disable', 'sslmode'),
        ('postgresql://app@/steps?host=/run/a&password=s3cret&host=/run/b', 'host'),
        ('postgresql://app@db/steps?password=s3cret&password=s3cret2', 'password'),
        ('mongodb://app:s3cret@h/agents?replicaSet=a&replicaset=b', 'replicaset'),
        ('mongodb+srv://app:s3cret@cluster.example/agents?authSource=a;authSource=b', 'authSource'),
    ],
)
def test_a_query_parameter_given_twice_is_refused_naming_it(url: str, name: str) -> None:
    """A driver takes one of them (the last, mostly) without a word: which did the user mean?"""
    with pytest.raises(StoreUrlError, match=f"query parameter '{name}' is given more than once") as refused:
        open_step_store(url)
    message = str(refused.value)
    assert redacted_url(url) in message and 's3cret' not in message


def test_a_query_parameter_the_driver_takes_several_times_may_repeat() -> None:
    url = 'mongodb://h/agents?readPreference=secondary&readPreferenceTags=dc:ny&readPreferenceTags='
    assert resolve(url).target == url


@pytest.mark.parametrize(
    'url',
    [
        'postgresql://db/steps?application_name=a;table=b&table=c',  # libpq splits on `&` only: one table
        'postgresql://db/steps?Table=x&table=y',  # libpq names are as written: two parameters
    ],
)
def test_a_postgresql_query_is_read_as_libpq_reads_it(url: str) -> None:
    assert resolve(url).target == url


@pytest.mark.parametrize(
    ('url', 'shown'),
    [
        ('postgresql://app@db/steps?password=s3cret&table=t', 'postgresql://app@db/steps?password=***&table=t'),
        ('postgresql://db/steps?sslpassword=s3cret#top', 'postgresql://db/steps?sslpassword=***#top'),
        ('postgresql://db/steps?PassWord=s3cret', 'postgresql://db/steps?PassWord=***'),
        ('postgresql://db/steps?pass%77ord=s3cret', 'postgresql://db/steps?pass%77ord=***'),
        (
            'mongodb://h/agents?tlsCertificateKeyFilePassword=s3cret;authSource=admin',
            'mongodb://h/agents?tlsCertificateKeyFilePassword=***;authSource=admin',
        ),
        (
            'mongodb://h/agents?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:s3cret',
            'mongodb://h/agents?authMechanism=MONGODB-AWS&authMechanismProperties=***',
        ),
        ('postgresql://app:s3cret@db/steps?password=s3cret', 'postgresql://app:***@db/steps?password=***'),
        ('postgresql://db/steps?application_name=s3cret', 'postgresql://db/steps?application_name=s3cret'),
    ],
)
def test_redaction_hides_secret_query_parameters_too(url: str, shown: str) -> None:
    """libpq and asyncpg read `?password=`, pymongo a key file's password and AWS session tokens."""
    assert redacted_url(url) == shown


_MALFORMED_WITH_A_PASSWORD = [
    'postgresql:/u:S3cr3t@host/db',
    'postgresql:u:S3cr3t@host/db',
    'mongodb:/u:S3cr3t@host/db',
    ' postgresql://u:S3cr3t@host/db',
    'postgresql//u:S3cr3t@host/db',
]


@pytest.mark.parametrize('url', _MALFORMED_WITH_A_PASSWORD)
def test_a_malformed_url_is_refused_without_showing_its_password(url: str) -> None:
    with pytest.raises(StoreUrlError) as refused:
        open_step_store(url)
    assert 'S3cr3t' not in str(refused.value) and '***@host/db' in str(refused.value)


@pytest.mark.parametrize('url', _MALFORMED_WITH_A_PASSWORD)
def test_the_cli_refuses_a_malformed_url_without_showing_its_password(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(['runs', '--store', url])
    captured = capsys.readouterr()
    assert code != 0 and '***@host/db' in captured.err
    assert 'S3cr3t' not in captured.err and 'S3cr3t' not in captured.out


@pytest.mark.parametrize(
    ('url', 'shown'),
    [
        ('postgresql:/u:S3cr3t@host/db', 'postgresql:/u:***@host/db'),
        ('postgresql:u:S3cr3t@host/db', 'postgresql:***@host/db'),  # the scheme may be the user name
        (' postgresql://u:S3cr3t@host/db', ' postgresql://u:***@host/db'),
        ('postgresql//u:S3cr3t@host/db', 'postgresql//u:***@host/db'),
        ('https://u:S3cr3t@', 'https://u:***@'),
        ('u:S3cr3t@host', 'u:***@host'),
        ('/var/lib/steps.db', '/var/lib/steps.db'),
        ('data/steps.db', 'data/steps.db'),
        ('C:\\x\\steps.db', 'C:\\x\\steps.db'),
        ('/home/me@work/steps.db', '/home/me@work/steps.db'),
        ('C:\\Users\\me@work\\steps.db', 'C:\\Users\\me@work\\steps.db'),
    ],
)
def test_redaction_finds_the_password_whatever_the_shape_and_leaves_paths_readable(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.anyio
async def test_a_path_object_opens_the_store_it_names(tmp_path: Path) -> None:
    store = open_step_store(tmp_path / 'runs.db')
    assert isinstance(store, SqliteStepStore)
    await store.aclose()
    (tmp_path / 'dir').mkdir()
    store = open_step_store(tmp_path / 'dir')
    assert isinstance(store, FileStepStore)
    await store.aclose()


@pytest.mark.parametrize(('value', 'said'), [(b'runs.db', 'got bytes'), (None, 'got NoneType'), (5, 'got int')])
def test_a_store_url_of_another_type_is_refused_naming_the_type(value: object, said: str) -> None:
    with pytest.raises(StoreUrlError, match=f'a store URL must be a str \\(or a path\\), {said}'):
        open_step_store(value)  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize('url', ['postgresql://u:s3cret@db/agents', 'mongodb://u:s3cret@db/agents?tls=true'])
def test_a_parsed_location_shows_no_password_in_its_repr(url: str) -> None:
    location = resolve(url)
    assert location.target == url  # what the driver is given
    assert 's3cret' not in repr(location) and repr(location).endswith(f"url='{redacted_url(url)}')")


@pytest.mark.parametrize(
    'arguments',
    [
        ['runs', 'postgresql://u:s3cret@db/agents'],  # --store forgotten: an unrecognized argument
        ['postgresql://u:s3cret@db/agents', 'runs'],  # taken for the command
        ['runs', '--limit', 'mongodb://u:s3cret@db/agents'],  # a value argparse's own check refuses
        ['postgresql://u:s3\\cret@db/agents'],  # shown quoted, its backslash doubled
    ],
)
def test_a_usage_error_quoting_a_store_url_hides_its_password(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(arguments)
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert 'error: ' in error and 's3' not in error and 'cret' not in error and ':***@db/agents' in error
