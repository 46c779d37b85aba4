"""`export`: a run as JSON lines, to stdout or to a file that is replaced only once it is whole.

The file handling is the part that needs care: a failed export (a full disk, a store gone away)
leaves what was there, a link is followed to the file it leads to, and what the shell opened
(`/dev/stdout`, a pipe) is written through.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TextIO

from .._files import fsync_dir
from ..store.codec import effect_dict, event_dict, run_dict
from ..store.registry import StoreLocation
from . import _inspect
from ._commands import snapshot_dict
from ._errors import CliError
from ._output import Output, unwritable, writing
from ._render import ProgressLine, json_printable, printable


async def cmd_export(args: argparse.Namespace, out: Output) -> None:
    """One JSON object per line: the run record, its events, its tool effects, every snapshot.

    Each line carries `"type"` (`run`, `event`, `tool_effect`, `snapshot`), so `jq 'select(.type ==
    "event")'` and friends work without knowing the order.
    """
    location, store = await out.open_store(args)
    run_id, record = await _inspect.resolve_run(store, args.run, location.url)
    output: str | None = None if args.output == '-' else args.output  # `-o -`: stdout, as Unix tools read it
    if output is not None:
        _check_export_target(location, output)
    # A blocking file in an async command is fine here: the CLI runs nothing else concurrently.
    target = _replacing(output) if output is not None else contextlib.nullcontext(out.write)
    with target as write, ProgressLine(f'exporting {run_id}') as progress:
        if record is not None:
            _jsonl(write, {'type': 'run', **run_dict(record)})
        progress(1, 4)
        for event in await store.list_events(run_id=run_id):
            _jsonl(write, {'type': 'event', **event_dict(event)})
        progress(2, 4)
        for effect in await _inspect.tool_effects(store, run_id, unresolved_only=False):
            _jsonl(write, {'type': 'tool_effect', **effect_dict(effect)})
        progress(3, 4)
        for snapshot in await store.list_snapshots(run_id=run_id, include_interrupted=True):
            _jsonl(write, {'type': 'snapshot', **snapshot_dict(snapshot)})
        progress(4, 4)
    if output is not None and sys.stderr is not None:  # `None` when started with `2>&-`
        sys.stderr.write(f'exported run {printable(run_id)} to {printable(output)}\n')


_SQLITE_SIDECARS = ('', '-wal', '-shm', '-journal')


def _check_export_target(location: StoreLocation, output: str) -> None:
    """Refuse an `--output` that names no file (`-o "$UNSET"` is a mistake, not a request for stdout),
    or that is the store itself: the SQLite file (or its WAL, shared memory and journal files), or
    anything inside a File store's directory."""
    if not output:
        raise CliError(
            "--output '' names no file: name the file to write the export to, or leave out --output for stdout"
        )
    kind = location.scheme.scheme
    if kind not in ('sqlite', 'file'):
        return
    target = os.path.realpath(output)
    store = os.path.realpath(location.target)
    if kind == 'sqlite':
        clash = target in {store + suffix for suffix in _SQLITE_SIDECARS} or _same_file(output, location.target)
    else:
        clash = target == store or target.startswith(store.rstrip(os.sep) + os.sep)
    if clash:
        raise CliError(f'--output {output!r} is part of the store at {location.url}: write the export elsewhere')


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)  # a hard link to the database
    except OSError:
        return False


@contextlib.contextmanager
def _replacing(path: str) -> Generator[Callable[[str], None]]:
    """Writes to a regular file that becomes `path` only once it is written whole: an export that
    fails part way (the disk fills, the store goes away) removes its temporary file and leaves what
    was there, never a file cut short that looks complete. The file keeps the mode of the one it
    replaces (a new file is private, as the stores' own files are), and one the user may not write
    is refused, as the shell's `>` refuses it. A link to a file is followed, and the file it leads
    to replaced the same way. Anything else (`/dev/stdout`, a pipe, a device) is written through,
    as `open` would. A directory, or a path that cannot be written (at the start or part way), is a
    `CliError` naming it."""
    if path.endswith(('/', os.sep)) or os.path.isdir(path):
        raise CliError(f'--output {path!r} names a directory: name the file to write the export to')
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as error:  # a folder on the way is a file, or may not be searched
        raise _unwritable(path, error) from None
    replaced = path
    if info is not None and stat.S_ISLNK(info.st_mode) and not _leads_to_a_descriptor(path):
        replaced = os.path.realpath(path)  # the link stays, and leads to the new file
        try:
            info = os.lstat(replaced)
        except FileNotFoundError:
            info = None
        except OSError as error:
            raise _unwritable(path, error) from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        try:
            # Appending: `-o /dev/stdout >> log` adds to the log, and `>` has emptied the file already.
            through = open(path, 'a', encoding='utf-8')  # noqa: SIM115 - `_written` closes it
        except OSError as error:
            raise _unwritable(path, error) from None
        with _written(through, path) as write:
            yield write
        return
    if info is not None and not os.access(replaced, os.W_OK):  # a rename would replace what `>` may not write
        raise _unwritable(path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
    directory = os.path.dirname(os.path.abspath(replaced))
    try:
        descriptor, name = tempfile.mkstemp(dir=directory, prefix='.export-', suffix='.tmp')
    except OSError as error:
        raise _unwritable(path, error) from None
    try:
        if info is not None:
            os.chmod(name, stat.S_IMODE(info.st_mode))
        with _written(os.fdopen(descriptor, 'w', encoding='utf-8'), path, synced=True) as write:
            yield write
        try:
            os.replace(name, replaced)
            fsync_dir(Path(directory))
        except OSError as error:
            raise _unwritable(path, error) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def _leads_to_a_descriptor(path: str) -> bool:
    """Whether the link at `path` leads, link by link, through a descriptor (`_DESCRIPTOR`): `/dev/stdout`,
    `/dev/fd/1`, `/proc/self/fd/1` (or a link to one) name what the shell opened (a pipe, or a file
    opened for appending), written through, never replaced. A link to a file that merely lies under
    `/dev` (`/dev/shm`) is a file like any other."""
    where = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        where = os.path.join(os.path.realpath(os.path.dirname(where)), os.path.basename(where))
        if _DESCRIPTOR.fullmatch(where):
            return True
        try:
            where = os.path.normpath(os.path.join(os.path.dirname(where), os.readlink(where)))
        except OSError:  # not a link: the end of the chain
            return False
    return False


_DESCRIPTOR = re.compile(r'/proc/[^/]+/fd/[0-9]+|/dev/fd/[0-9]+')
"""Linux's descriptor links, and the BSDs' and macOS's `/dev/fd` (not links to `/proc` there)."""


def _unwritable(path: str, error: OSError) -> CliError:
    return unwritable(f'--output {path!r}', error)


@contextlib.contextmanager
def _written(handle: TextIO, path: str, *, synced: bool = False) -> Generator[Callable[[str], None]]:
    """Writes to `handle`, then closes it: a write or the close (the last buffered lines may not fit
    either) that fails is the error naming `path`. After a failure, what is still buffered is dropped.
    `synced` flushes the file to disk before it is closed: a file renamed over another must be whole
    on disk first, or a power cut right after the export can leave it empty or short."""
    target = f'--output {path!r}'

    def write(text: str) -> None:
        with writing(target):
            handle.write(text)

    try:
        yield write
        with writing(target):
            if synced:
                handle.flush()
                os.fsync(handle.fileno())
            handle.close()
    finally:
        with contextlib.suppress(OSError):
            handle.close()


def _jsonl(write: Callable[[str], None], value: dict[str, Any]) -> None:
    write(json_printable(json.dumps(value, ensure_ascii=False, separators=(',', ':'))) + '\n')
