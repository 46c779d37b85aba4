"""`make_static_public_url`: our keyword `base_url=`, upstream's `base=`, or the URL positionally."""

from __future__ import annotations

from typing import Any

import pytest

from pydantic_ai_steps.media import MediaContext, make_static_public_url, media_uri_for

URI = media_uri_for(b'x')
DIGEST = URI.removeprefix('media+sha256://')


@pytest.mark.parametrize(
    'call',
    [
        lambda: make_static_public_url('https://cdn.example/', key_prefix='m/'),
        lambda: make_static_public_url(base_url='https://cdn.example/', key_prefix='m/'),
        lambda: make_static_public_url(base='https://cdn.example/', key_prefix='m/'),
    ],
    ids=['positional', 'base_url', 'base'],
)
def test_base_url_by_position_by_our_keyword_or_by_upstreams(call: Any) -> None:
    resolve = call()
    assert resolve(URI, MediaContext()) == f'https://cdn.example/m/{DIGEST}.bin'


def test_base_and_base_url_together_are_refused() -> None:
    with pytest.raises(TypeError, match=r"got base_url='https://a.example' and base='https://b.example'"):
        make_static_public_url(base_url='https://a.example', base='https://b.example')
    with pytest.raises(TypeError, match='not both'):
        make_static_public_url('https://a.example', base='https://a.example')


def test_a_base_url_is_required() -> None:
    with pytest.raises(TypeError, match=r'needs the base URL: pass base_url= \(or base=, the upstream name\)'):
        make_static_public_url()


@pytest.mark.parametrize(('bad', 'error'), [('', ValueError), (b'https://cdn.example', TypeError), (42, TypeError)])
def test_the_base_url_must_be_a_non_empty_string(bad: object, error: type[Exception]) -> None:
    with pytest.raises(
        error, match=rf"base URL must be a non-empty string such as 'https://cdn.example/media', got {bad!r}"
    ):
        make_static_public_url(base=bad)  # type: ignore[arg-type]
