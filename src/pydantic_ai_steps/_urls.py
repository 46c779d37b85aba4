"""Connection URLs in messages and reprs: every secret they may carry replaced by `***`.

A URL can carry a secret in two places: the password of its user info (`user:secret@host`), and
query parameters that drivers read as secrets (libpq's and asyncpg's `?password=`, `sslpassword=`,
pymongo's `tlsCertificateKeyFilePassword=`, the AWS session token inside
`authMechanismProperties=`). Both are hidden wherever a store or the CLI shows a URL, and in any
value an error quotes back, however malformed: `scheme:/user:secret@`, `scheme:user:secret@`,
`scheme//user:secret@` and a leading space all hide the password, while a path (`/var/lib/steps.db`,
`C:\\x\\steps.db`) shows as typed.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

_SECRET_PARAMETER = re.compile(r'password|secret|token|authmechanismproperties', re.IGNORECASE)
"""Query parameter names whose value is hidden (matched anywhere in the decoded name)."""

_USERINFO_PREFIX = re.compile(r'\s*[A-Za-z][A-Za-z0-9+.-]*:[/\\]+')
"""Leading spaces, `scheme:` and the slashes after it (or a drive's `C:\\`): what precedes a user name."""


def raw_userinfo(url: str) -> str | None:
    """What precedes the URL's last `@`, after `scheme://`: the user and password as typed, even
    with an unescaped `/`, `?` or `#` in them (which end the netloc early for `urlsplit`)."""
    scheme, separator, rest = url.partition('://')
    if not separator or not scheme or '@' not in rest:
        return None
    return rest.rpartition('@')[0]


def redacted_url(url: str) -> str:
    """`url` with its password and its secret query parameters replaced by `***`.

    The user info runs to the last `@`, from after `scheme:` and the slashes that follow it, or from
    the first non-space character when no slash follows a scheme (in `postgresql:u:pw@host` the
    scheme may as well be the user name). Everything between its first `:` and that `@` is the
    password, however `urlsplit` reads it: a raw `/` in a password must not leak through a split that
    missed it. An `@` later in the URL, or a `:` before an `@` in a path, only hides more than needed.
    """
    head, at, tail = url.rpartition('@')
    if at:
        prefix = _USERINFO_PREFIX.match(head)
        start = prefix.end() if prefix is not None else len(head) - len(head.lstrip())
        user, colon, _ = head[start:].partition(':')
        if colon:
            url = f'{head[:start]}{user}:***@{tail}'
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
