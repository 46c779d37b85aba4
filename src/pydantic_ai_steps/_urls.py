"""Connection URLs in messages and reprs: every secret they may carry replaced by `***`.

A URL can carry a secret in two places: the password of its user info (`user:secret@host`), and
query parameters that drivers read as secrets (libpq's and asyncpg's `?password=`, `sslpassword=`,
pymongo's `tlsCertificateKeyFilePassword=`, the AWS session token inside
`authMechanismProperties=`). Both are hidden wherever a store or the CLI shows a URL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

_SECRET_PARAMETER = re.compile(r'password|secret|token|authmechanismproperties', re.IGNORECASE)
"""Query parameter names whose value is hidden (matched anywhere in the decoded name)."""


def raw_userinfo(url: str) -> str | None:
    """What precedes the URL's last `@`, after `scheme://`: the user and password as typed, even
    with an unescaped `/`, `?` or `#` in them (which end the netloc early for `urlsplit`)."""
    scheme, separator, rest = url.partition('://')
    if not separator or not scheme or '@' not in rest:
        return None
    return rest.rpartition('@')[0]


def redacted_url(url: str) -> str:
    """`url` with its password and its secret query parameters replaced by `***`.

    Everything between the user name's `:` and the last `@` is the password, however `urlsplit`
    reads it: a password holding a raw `/` must not leak through a split that missed it (an `@`
    later in the URL only hides more than needed).
    """
    userinfo = raw_userinfo(url)
    if userinfo is not None and ':' in userinfo:
        scheme, _, rest = url.partition('://')
        user = userinfo.partition(':')[0]
        url = f'{scheme}://{user}:***@{rest[len(userinfo) + 1 :]}'
    return _without_secret_parameters(url)


def _without_secret_parameters(url: str) -> str:
    head, question, tail = url.partition('?')
    if not question:
        return url
    query, hash_mark, fragment = tail.partition('#')
    items = re.split(r'([&;])', query)  # pymongo accepts `;` between options as well as `&`
    for index in range(0, len(items), 2):
        name, equals, _ = items[index].partition('=')
        if equals and _SECRET_PARAMETER.search(unquote_plus(name)):
            items[index] = f'{name}=***'
    return f'{head}?{"".join(items)}{hash_mark}{fragment}'
