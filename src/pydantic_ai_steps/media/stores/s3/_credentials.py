"""Keeping credentials out of what a failure leaves behind: reprs, pickles, chained httpx errors.

The signed headers themselves never leave `S3Transport._attempt`; what is here covers the rest:
the secret and token held in a wrapper that prints and pickles as nothing, an access key shown
masked, and httpx's errors copied without the request headers that carry a signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, SupportsIndex

import httpx

_CREDENTIAL_HEADERS = frozenset({'authorization', 'x-amz-security-token'})


class Secret:
    """Holds a credential so that no repr, vars() dump, traceback local or pickle shows it."""

    __slots__ = ('_value',)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return '<redacted>'

    __str__ = __repr__

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError('a credential cannot be pickled or copied')


def mask(access_key_id: str) -> str:
    """`AKIA…WXYZ`: enough to tell keys apart in a message, too little to be one."""
    return f'{access_key_id[:4]}…{access_key_id[-4:]}' if len(access_key_id) >= 12 else '…'


def _redacted_request(request: httpx.Request) -> httpx.Request:
    """Method, URL and headers of `request`, credential headers reading `<redacted>`; no body."""
    headers = [
        (name, '<redacted>' if name.lower() in _CREDENTIAL_HEADERS else value)
        for name, value in request.headers.multi_items()
    ]
    return httpx.Request(request.method, request.url, headers=headers)


def without_credentials(exc: httpx.RequestError, redact: Callable[[str], str]) -> httpx.RequestError:
    """A copy of `exc` that is safe to chain: same type and message, a redacted request, no traceback.

    The original is dropped: its `.request` carries the signed headers, and its traceback (and the
    httpcore error chained to it) runs through frames whose locals hold them.
    """
    try:
        request: httpx.Request | None = _redacted_request(exc.request)
    except RuntimeError:  # `.request` raises when the error was created without one
        request = None
    message = redact(str(exc))
    for cls in type(exc).__mro__:  # the first class, from httpx's own, whose constructor is the usual one
        if issubclass(cls, httpx.RequestError) and (cls is type(exc) or cls.__module__.startswith('httpx')):
            try:
                return cls(message, request=request)
            except TypeError:
                continue
    return httpx.RequestError(message, request=request)  # pragma: no cover  (httpx's own class always fits)
