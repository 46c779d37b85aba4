"""One invocation's output stream and the store it opened."""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..store.protocol import ManagedStepStore
from ..store.registry import StoreLocation
from . import _inspect
from ._errors import CliError
from ._render import Style, json_printable, terminal_safe, terminal_width
from ._stores import STORE_VARIABLE, open_existing


@dataclass
class Output:
    """One invocation's context: where a command writes (colour and table width follow the
    stream), and the stores it opened, which `close` releases when the command ends."""

    stream: TextIO
    style: Style
    width: int | None
    opened: list[ManagedStepStore] = field(default_factory=list['ManagedStepStore'])

    @classmethod
    def for_stream(cls, stream: TextIO) -> Output:
        return cls(stream, Style.for_stream(stream), terminal_width(stream))

    def write(self, text: str) -> None:
        """Every write to stdout goes through here (or `flush`), so a failed one is the CLI's error."""
        with writing('stdout'):
            self.stream.write(text)

    def flush(self) -> None:
        with writing('stdout'):
            self.stream.flush()

    def line(self, text: str = '') -> None:
        """Write `text` and a newline; a control character that reached it unescaped is escaped here."""
        self.write(terminal_safe(text) + '\n')

    def json(self, value: Any) -> None:
        self.write(json_printable(json.dumps(value, indent=2, ensure_ascii=False)) + '\n')

    async def open_store(self, args: argparse.Namespace) -> tuple[StoreLocation, ManagedStepStore]:
        value: str | None = args.store
        if not value:
            raise CliError(
                'no store given: pass --store URL (for example --store sqlite:///steps-demo.db) '
                f'or set {STORE_VARIABLE}'
            )
        location, store = await open_existing(value)
        self.opened.append(store)
        return location, store

    async def open_run(self, args: argparse.Namespace) -> tuple[StoreLocation, ManagedStepStore, str]:
        """The store and the full id of the run `args.run` names (an id or a unique prefix)."""
        location, store = await self.open_store(args)
        run_id, _ = await _inspect.resolve_run(store, args.run, location.url)
        return location, store, run_id

    async def close(self) -> None:
        while self.opened:
            await self.opened.pop().aclose()


Command = Callable[[argparse.Namespace, Output], Awaitable[None]]


class ClosedStdout(io.StringIO):
    """The stdout of a process started without one (`>&-`, where Python's is `None`): writing to it
    fails as writing to a closed descriptor does, while a command that writes elsewhere (`-o FILE`) runs."""

    def write(self, text: str, /) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


def unwritable(target: str, error: OSError) -> CliError:
    """`cannot write TARGET: REASON`, the reason in the system's words (`No space left on device`)."""
    return CliError(f'cannot write {target}: {error.strerror or error}')


@contextlib.contextmanager
def writing(target: str) -> Generator[None]:
    """Writes to `target` (`stdout`, `--output 'x'`): one that fails (a full disk, a closed
    descriptor) is `unwritable`, not an unexpected error. A closed pipe stays a `BrokenPipeError`:
    its reader left (`| head`), and `_app.main` ends quietly on it, as Unix tools do."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise unwritable(target, error) from None
