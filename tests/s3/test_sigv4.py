"""SigV4 proof: the reference vectors, and hundreds of generated requests compared with botocore.

botocore's `S3SigV4Auth` is the reference (test-only): it is what AWS's own SDK signs S3 requests
with. The generic `SigV4Auth` is deliberately not used: it double-encodes S3 paths.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from unittest.mock import patch

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydantic_ai_steps.media import _sigv4

MiB = 1024 * 1024
NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


# ----------------------------------------------------------------------------- reference vectors


def test_vector_put_with_content_type_and_metadata() -> None:
    headers = _sigv4.sign(
        method='PUT',
        host='s3.us-east-1.amazonaws.com',
        path=_sigv4.encode_path('/my-bucket/media/abc.bin'),
        headers={'content-type': 'image/png', 'X-Amz-Meta-Tag': 'v  1'},
        payload_sha256=hashlib.sha256(b'hello').hexdigest(),
        region='us-east-1',
        access_key_id='AKIDEXAMPLE',
        secret_access_key='wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY',
        now=NOW,
    )
    assert headers['x-amz-content-sha256'] == '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824'
    assert headers['x-amz-date'] == '20240102T030405Z'
    assert headers['x-amz-meta-tag'] == 'v  1'  # sent raw; only the canonical form collapses it
    assert headers['authorization'] == (
        'AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240102/us-east-1/s3/aws4_request, '
        'SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-meta-tag, '
        'Signature=4d3f7d02aa102266594c097ffe748bdbcb7601ec44144308a92b35ae2e5e61ed'
    )


def test_vector_lowercase_head_with_encoded_path_region_auto() -> None:
    headers = _sigv4.sign(
        method='head',
        host='h:9000',
        path=_sigv4.encode_path('/b/a b/@c'),
        payload_sha256=_sigv4.EMPTY_SHA256,
        region='auto',
        access_key_id='A',
        secret_access_key='S',
        now=NOW,
    )
    assert headers['x-amz-content-sha256'] == _sigv4.EMPTY_SHA256
    assert headers['authorization'].endswith(
        'SignedHeaders=host;x-amz-content-sha256;x-amz-date, '
        'Signature=20dc15d9b453a9c51071fbbbe223b4ada4bbb55725f4610c2b6a602678fd1d4b'
    )


def test_vector_plain_get() -> None:
    headers = _sigv4.sign(
        method='GET',
        host='h',
        path=_sigv4.encode_path('/b/k'),
        payload_sha256=_sigv4.EMPTY_SHA256,
        region='us-east-1',
        access_key_id='A',
        secret_access_key='S',
        now=datetime(2024, 1, 1, tzinfo=UTC),
    )
    assert headers['authorization'].endswith(
        'Signature=0fb91138b1d7eb9edfaaf370aeee28dbd229db32e09a258aad3d943ee63cdbae'
    )


def test_vector_path_encoding_is_single_and_keeps_empty_segments() -> None:
    assert _sigv4.encode_path('/b/a b/@c~d(e)=f') == '/b/a%20b/%40c~d%28e%29%3Df'
    assert _sigv4.encode_path('/b//x') == '/b//x'
    assert _sigv4.encode_path('/b/100%') == '/b/100%25'  # a literal % is data, not an escape


def test_now_in_another_timezone_is_converted_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    local = _sign_simple(now=NOW.astimezone(plus_two))
    assert local == _sign_simple(now=NOW)


def test_canonical_query_sorts_encoded_names_and_keeps_empty_values() -> None:
    assert _sigv4.canonical_query([('uploadId', 'a+b/c'), ('partNumber', '2'), ('uploads', '')]) == (
        'partNumber=2&uploadId=a%2Bb%2Fc&uploads='
    )


@pytest.mark.parametrize(
    ('overrides', 'message'),
    [
        ({'now': datetime(2024, 1, 1)}, 'timezone-aware'),
        ({'payload_sha256': 'ABC'}, 'payload_sha256'),
        ({'payload_sha256': 'g' * 64}, 'payload_sha256'),
        ({'host': ''}, 'host'),
        ({'path': 'b/k'}, 'path'),
        ({'headers': {'Host': 'evil'}}, 'set by the signer'),
        ({'headers': {'Authorization': 'x'}}, 'set by the signer'),
        ({'headers': {'x-amz-meta-a': '1', 'X-Amz-Meta-A': '2'}}, 'given twice'),
    ],
)
def test_bad_input_is_rejected_with_the_reason(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _sign_simple(**overrides)


def _sign_simple(**overrides: object) -> dict[str, str]:
    arguments: dict[str, object] = {
        'method': 'GET',
        'host': 'h',
        'path': '/b/k',
        'payload_sha256': _sigv4.EMPTY_SHA256,
        'region': 'us-east-1',
        'access_key_id': 'A',
        'secret_access_key': 'S',
        'now': NOW,
    }
    arguments.update(overrides)
    return _sigv4.sign(**arguments)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- against botocore

# Characters that trip hand-written signers: reserved URL characters, %, spaces, unicode.
_KEY_CHARS = st.one_of(
    st.sampled_from(list(" +=,;@~%&?#!$'()*:[]/-_.")),
    st.characters(codec='utf-8', categories=['L', 'N', 'S', 'Zs', 'M']),
)
_keys = st.text(_KEY_CHARS, min_size=1, max_size=40)
_buckets = st.from_regex(r'[a-z0-9][a-z0-9.-]{1,20}[a-z0-9]', fullmatch=True)
_meta_keys = st.from_regex(r'[A-Za-z0-9-]{1,12}', fullmatch=True)
# Header values with odd whitespace: leading, trailing, runs of spaces and tabs.
_meta_values = st.text(st.sampled_from([*' \t', *(chr(c) for c in range(0x21, 0x7F))]), max_size=30)
_bodies = st.one_of(
    st.just(b''),
    st.binary(max_size=64),
    st.sampled_from([1, 5 * MiB + 1]).map(lambda size: b'\x00' * size),
)
_tokens = st.none() | st.text(st.sampled_from('ABCDEFabcdef0123456789+/='), min_size=1, max_size=80)
_secrets = st.text(st.sampled_from('ABCXYZabcxyz0189+/'), min_size=1, max_size=40)
_query = st.sampled_from(['none', 'uploads', 'part', 'complete'])
_times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC))

GENERATED_CASES = 400


def test_generated_requests_sign_exactly_like_botocore() -> None:
    """Hundreds of requests; our Authorization (and every signed header) equals botocore's."""
    seen: list[int] = []

    @settings(max_examples=GENERATED_CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        method=st.sampled_from(['GET', 'HEAD', 'PUT', 'POST', 'DELETE']),
        bucket=_buckets,
        prefix=st.sampled_from(['', 'media/', 'a b/', 'ü/', '+=/', '%2F/']),
        key=_keys,
        media_type=st.none() | st.sampled_from(['image/png', 'text/plain; charset=utf-8', 'application/x  y']),
        metadata=st.dictionaries(_meta_keys.map(str.lower), _meta_values, max_size=4),
        body=_bodies,
        region=st.sampled_from(['us-east-1', 'auto', 'eu-central-1']),
        access_key=st.from_regex(r'AKIA[A-Z0-9]{16}', fullmatch=True),
        secret=_secrets,
        token=_tokens,
        query_kind=_query,
        upload_id=st.text(st.sampled_from('abc123+/=._-~ '), min_size=1, max_size=30),
        now=_times,
        port=st.sampled_from(['', ':9000', ':443']),
    )
    def check(
        method: str,
        bucket: str,
        prefix: str,
        key: str,
        media_type: str | None,
        metadata: dict[str, str],
        body: bytes,
        region: str,
        access_key: str,
        secret: str,
        token: str | None,
        query_kind: str,
        upload_id: str,
        now: datetime,
        port: str,
    ) -> None:
        seen.append(1)
        host = f's3.example.com{port}'
        raw_path = f'/{bucket}/{prefix}{key}'
        params = {
            'none': [],
            'uploads': [('uploads', '')],
            'part': [('partNumber', '7'), ('uploadId', upload_id)],
            'complete': [('uploadId', upload_id)],
        }[query_kind]
        headers = {f'x-amz-meta-{name}': value for name, value in metadata.items()}
        if media_type is not None:
            headers['content-type'] = media_type

        ours = _sigv4.sign(
            method=method,
            host=host,
            path=_sigv4.encode_path(raw_path),
            query=_sigv4.canonical_query(params),
            headers=headers,
            payload_sha256=hashlib.sha256(body).hexdigest(),
            region=region,
            access_key_id=access_key,
            secret_access_key=secret,
            session_token=token,
            now=now,
        )

        # botocore gets the raw parts and encodes them itself: path as botocore's S3 serializer
        # does (percent_encode, safe='/~'), query from raw params.
        request = AWSRequest(
            method=method,
            url=f'http://{host}{percent_encode(raw_path, safe="/~")}',
            data=body,
            headers={'host': host, **headers},
            params=dict(params),
        )
        with patch('botocore.auth.get_current_datetime', return_value=now.replace(tzinfo=None)):
            S3SigV4Auth(Credentials(access_key, secret, token), 's3', region).add_auth(request)
        theirs = {name.lower(): value for name, value in request.headers.items()}

        assert ours['authorization'] == theirs['authorization']
        assert ours == theirs

    check()
    assert len(seen) >= GENERATED_CASES * 3 // 4, f'only {len(seen)} generated cases ran'


def test_botocore_generic_signer_would_disagree_on_s3_paths() -> None:
    """Guards the reference choice: generic SigV4 double-encodes, so it must not be the oracle."""
    from botocore.auth import SigV4Auth

    def signed_with(auth_class: type[SigV4Auth]) -> str:
        request = AWSRequest(method='GET', url='http://h/b/a%20b', headers={'host': 'h'})
        with patch('botocore.auth.get_current_datetime', return_value=NOW.replace(tzinfo=None)):
            auth_class(Credentials('A', 'S'), 's3', 'us-east-1').add_auth(request)
        return request.headers['Authorization']

    ours = _sign_simple(path=_sigv4.encode_path('/b/a b'))['authorization']
    assert ours == signed_with(S3SigV4Auth)
    assert ours != signed_with(SigV4Auth)
