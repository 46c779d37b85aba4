"""Shared test fixtures.

Tests that need a live server read its address from environment variables that `scripts/test`
exports after starting the servers. Without them a test skips with the reason, except under
`CI=true`, where a missing server is a failure: CI must never pass by skipping.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return 'asyncio'


def require_env(*names: str) -> dict[str, str]:
    """Return the named environment variables, or skip (fail under CI) when one is missing."""
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        reason = f'live server not configured: {", ".join(missing)} unset (run the suite through scripts/test)'
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(reason)
        pytest.skip(reason)
    return {name: os.environ[name] for name in names}
