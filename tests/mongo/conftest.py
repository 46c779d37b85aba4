"""Fixtures for the MongoDB stores: the test server (SecantusDB, started by scripts/test), a fresh
database per test (dropped afterwards), and a command listener that counts round trips."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pymongo
import pytest
from pymongo import AsyncMongoClient, monitoring

from ..conftest import require_env

_numbers = itertools.count()


def mongo_url() -> str:
    return require_env('TEST_MONGODB_URL')['TEST_MONGODB_URL']


class Commands(monitoring.CommandListener):
    """Every command a client sent (a command is one round trip), by name."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        del event

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        del event

    def clear(self) -> None:
        self.names.clear()

    def __len__(self) -> int:
        return len(self.names)


def new_database_name(prefix: str = 't') -> str:
    return f'{prefix}_{os.getpid()}_{next(_numbers)}_{uuid.uuid4().hex[:6]}'


@pytest.fixture
def url() -> str:
    return mongo_url()


@pytest.fixture
def database_name(url: str) -> Iterator[str]:
    """A database no other test uses, dropped afterwards (through a client of its own, on no event loop)."""
    name = new_database_name()
    yield name
    with pymongo.MongoClient(url, serverSelectionTimeoutMS=10_000) as client:
        client.drop_database(name)


@pytest.fixture
async def client(url: str) -> AsyncIterator[AsyncMongoClient[dict[str, Any]]]:
    """A caller-owned client on the test's event loop."""
    opened: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, serverSelectionTimeoutMS=10_000)
    yield opened
    await opened.close()
