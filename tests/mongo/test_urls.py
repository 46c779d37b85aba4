"""A MongoDB URL pymongo rejects is `StoreUrlError` when the store is made, naming the URL without its
password: `mongodb+srv://` URLs too (before, only `mongodb://` ones were checked and the rest reached
the first call as pymongo's own error), and what the client finds when it is made (credentials)."""

from __future__ import annotations

import pytest

from pydantic_ai_steps.cli import main
from pydantic_ai_steps.media import MongoMediaStore
from pydantic_ai_steps.step_persistence import MongoStepStore, StoreUrlError, open_step_store

BAD_URLS = {
    'mongodb+srv://app:s3cret@127.0.0.1/agents': 'not an IP address',
    'mongodb+srv://app:s3cret@[::1]/agents': 'not an IP address',
    'mongodb+srv://app:s3cret@cluster.example:27017/agents': 'must not include a port number',
    'mongodb+srv://app:s3cret@a.example,b.example/agents': 'one, and only one, hostname',
    'mongodb+srv://app:s3cret@cluster.example/agents?directConnection=true': 'directConnection=true',
    'mongodb+srv://app:s3cret@cluster.example/agents?nosuchoption=1': "unknown option 'nosuchoption'",
    'mongodb://127.0.0.1:27017/agents?authMechanism=SCRAM-SHA-256&tlsCertificateKeyFilePassword=s3cret': (
        'SCRAM-SHA-256 requires a username'
    ),
}


@pytest.mark.parametrize(('url', 'said'), BAD_URLS.items(), ids=list(BAD_URLS.values()))
def test_a_url_pymongo_rejects_is_a_store_url_error_without_the_password(url: str, said: str) -> None:
    for make in (
        lambda: MongoStepStore(db_url=url, database='agents'),
        lambda: MongoMediaStore(db_url=url, database='agents'),
        lambda: open_step_store(url),
    ):
        with pytest.raises(StoreUrlError, match=r'is not a usable URL|bad mongodb store URL') as raised:
            make()
        message = str(raised.value)
        assert said in message and 's3cret' not in message and '***' in message
        assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_the_command_line_names_an_srv_url_with_an_ip_address_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = 'mongodb+srv://app:s3cret@127.0.0.1/agents'
    assert main(['runs', '--store', url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pydantic-ai-steps: error: bad mongodb store URL 'mongodb+srv://app:***@127.0.0.1/agents': ")
    assert 'not an IP address' in err and 's3cret' not in err and '--debug' not in err and err.count('\n') == 1


def test_a_good_srv_url_is_left_to_its_dns_lookup_at_the_first_call() -> None:
    store = MongoStepStore(db_url='mongodb+srv://app:s3cret@cluster.example/agents?retryWrites=true', database='a')
    assert 'cluster.example' in repr(store)
