"""`DiskMediaStore`: blobs as files under one directory, `<sha256>.bin` by default.

Every write goes to a uniquely named temporary file in the target's directory and is renamed
over the target, so a reader never sees a half-written blob or sidecar and concurrent writers of
the same bytes cannot corrupt each other. Files are created readable by the owner only (0o600)
and the directories the store creates are 0o700: media often holds user uploads. The store's
directory and the folders under it are checked by the rule the File step store uses (`_files`)
before every call goes through them: a link or another user's folder planted there is refused,
so no blob is written, read or deleted elsewhere.

`put` hands the caller's buffer to `hashlib` and `os.write` as it is, with no intermediate copies.
A payload of `concurrent_put_bytes` (1 MiB) or more is hashed on a helper thread while the
calling worker thread writes it to a temporary file in the store's root (both release the GIL),
and the file is then renamed to the name its digest gives, so storing a large blob costs little
more than hashing it. If a blob of that digest is already there, the temporary file is removed
and the stored blob is left as it is. Smaller payloads are hashed first and written only when
their blob is missing. Either way a stored file of another size than the payload (cut short, or
grown) is damaged: it is replaced. A file of the right size is trusted as it is: checking it
would read and hash the whole file on every put of stored bytes.

`get` hashes the bytes it read (on its worker thread, never the event loop) and raises
`MediaIntegrityError` (a `FileNotFoundError`) when they do not match the URI's digest: a damaged
blob reads as a missing one. `exists` only looks for the file.

Garbage collection (`list_blobs`, `delete`): a blob's file modification time is when it was last
put. A put of bytes already stored rewrites nothing but sets that time to now (`os.utime`), so
a blob that a writer has just put again is never collected. `delete(uri, stored_before=t)`
first renames the blob to a temporary name in its directory, so no put can refresh it any
longer, then reads its modification time: at or after `t` it is renamed back, otherwise the
file and its sidecar are removed. A put racing the deletion either refreshed the blob before the
rename (it is kept) or finds it gone and writes it again.

A process killed inside a put or a delete leaves its temporary file. A collection (never a dry
run: `prepare_collection`) tidies one an hour after its last change (`_disk_files.tidy_leftover`),
never sooner, since a running put or delete may hold it: a put's is removed, a delete's is put
back under its blob's name (it may hold a blob a writer put again meanwhile, still referenced),
or removed if a whole copy is there. A delete killed between removing a blob and its sidecar leaves
the sidecar: a collection removes it while its blob is absent (`_disk_files.tidy_sidecar`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from datetime import datetime
from pathlib import Path

import anyio.to_thread

from ..._closing import AsyncClosing
from ..._errors import check_bool
from ..._files import UnsafeEntryError, check_directory, fsync_dir, store_path
from ...store.maintenance import BlobInfo
from .._context import EMPTY_CONTEXT, MediaContext
from .._errors import MediaIntegrityError
from .._protocol import (
    KeyStrategy,
    PublicUrlResolver,
    check_stored_before,
    decode_metadata,
    default_key_strategy,
    encode_metadata,
    resolve_public_url,
    uris_named_in_key,
    utc_from_timestamp,
)
from .._uri import parse_media_uri, uri_for_digest
from ._disk_files import (
    TEMP_NAME,
    hash_file,
    is_regular,
    read_regular,
    refresh,
    sidecar,
    temp_name,
    tidy_leftover,
    tidy_sidecar,
    write_atomic,
    write_new_file,
)
from ._disk_keys import SIDECAR_SUFFIX, check_lengths, fits, safe_relative_key
from ._sha256 import Sha256Thread

__all__ = ['DiskMediaStore']

logger = logging.getLogger('pydantic_ai_steps.media')

_DIR_MODE = 0o700
_LIST_BATCH = 512
"""`list_blobs` walks the directory on a worker thread and hands blobs over this many at a time."""


class DiskMediaStore(AsyncClosing):
    """A `MediaStore` keeping each blob in its own file under `directory`.

    `key_strategy` maps a URI (and the operation's `MediaContext`) to a path relative to
    `directory`; it must stay inside it, so absolute paths and `..` segments are rejected with
    `ValueError` and nothing is stored (a large put may have created the root directory by then),
    and so are keys the file system would refuse as too long: a file name over 245 bytes in UTF-8
    (255 less the sidecar's `.meta.json`), a directory name over 255, or a whole path over the OS
    limit (4095 bytes, 1023 on macOS) less 41 bytes of room for sidecar and temporary files.
    A strategy that depends on the context needs the same context on reads. Non-empty
    `context.metadata` is kept in a `<blob>.meta.json` sidecar; a later put with non-empty metadata
    replaces it, a later put without metadata leaves it. `media_type` and `filename` are not
    persisted. The directory is created on the first put. The store holds no open resources;
    `aclose()` and `async with` exist so every media store can be closed the same way.

    Every put is atomic, so a process crash leaves a blob whole or absent. `durable=True` also
    flushes each new file and the directory entries it adds to disk before `put` returns, so a
    blob survives power loss too; the step stores pass their own `durable` setting on.

    The directory and every folder under it must be real directories of the user the process runs
    as: every call refuses one that is a link or another user's with a `PermissionError` (the
    directories above it may be links). `list_blobs()` and `delete()` serve media garbage
    collection. The listing walks the directory without following symbolic links, skips a folder
    the calls would refuse (with a warning), and skips sidecars and temporary files (a collection
    tidies those a killed process left: see the module notes). A file's URI comes from a 64-hex digest in its
    path relative to `directory` (the default key is `<sha256>.bin`); a file whose path holds
    none, with a key strategy other than the default, is hashed to find it. Either way a file is
    listed only if the key strategy, given that URI and an empty `MediaContext`, names exactly
    that file, because `delete(uri)` finds the file the same way: garbage collection with a key
    strategy that depends on the context is not supported (such blobs are not listed, so never
    collected). Other files in the directory are left alone.
    """

    concurrent_put_bytes: int = 1 << 20
    """Payloads at least this large are written to a temporary file while a helper thread hashes them."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        key_strategy: KeyStrategy = default_key_strategy,
        public_url: PublicUrlResolver | None = None,
        durable: bool = False,
    ) -> None:
        self._root = Path(store_path(directory, 'DiskMediaStore', directory=True))
        self.durable = check_bool(durable, 'durable')
        self._key_strategy = key_strategy
        self._public_url = public_url

    @property
    def directory(self) -> Path:
        """The root every blob lives under."""
        return self._root

    def __repr__(self) -> str:
        return f'{type(self).__name__}({str(self._root)!r})'

    async def aclose(self) -> None:
        """Nothing to release (every call opens and closes its own files); here so every store closes alike."""

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        return await anyio.to_thread.run_sync(self._put_sync, data, context)

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        path = self._path(uri, context)
        return await anyio.to_thread.run_sync(self._read_blob, path, uri)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        path = self._path(uri, context)
        return await anyio.to_thread.run_sync(self._exists, path)

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        path = self._path(uri, context)
        return await anyio.to_thread.run_sync(self._read_metadata, path, uri)

    async def list_blobs(self) -> AsyncIterator[BlobInfo]:
        """Every blob under the directory, with its size and when it was last put (its mtime, UTC)."""
        walk = self._walk()
        try:
            while batch := await anyio.to_thread.run_sync(_next_batch, walk):
                for blob in batch:
                    yield blob
        finally:
            walk.close()

    async def prepare_collection(self) -> None:
        """Before a collection (never a dry run) lists the blobs: tidy what killed puts and deletes left."""
        await anyio.to_thread.run_sync(self._tidy)

    async def delete(self, uri: str, *, stored_before: datetime | None = None) -> bool:
        """Remove the blob of `uri` and its sidecar; with `stored_before`, only if not put at or after it.

        `True` if a blob was removed; `False` if there was none, or it was put since. The blob's
        path comes from the key strategy with an empty `MediaContext`.
        """
        cutoff = check_stored_before(stored_before)
        path = self._path(uri, EMPTY_CONTEXT)
        return await anyio.to_thread.run_sync(self._delete_sync, path, cutoff)

    # -- blocking bodies, run on worker threads --------------------------------------------------

    def _put_sync(self, data: bytes, context: MediaContext) -> str:
        if len(data) >= self.concurrent_put_bytes:
            uri, path = self._put_large(data, context)
        else:
            uri = uri_for_digest(hashlib.sha256(data).hexdigest())
            path = self._path(uri, context)
            self._enter(path.parent, create=True)
            if not refresh(path, len(data)):
                write_atomic(path, data, self.durable)
        if context.metadata:
            write_atomic(sidecar(path), encode_metadata(context.metadata).encode('utf-8'), self.durable)
        return uri

    def _put_large(self, data: bytes, context: MediaContext) -> tuple[str, Path]:
        """Write `data` to a temp file in the root while a helper thread hashes it, then move it into place."""
        digest = Sha256Thread(data)
        temp = self._root / temp_name('put')
        try:
            self._enter(self._root, create=True)
            write_new_file(temp, data, self.durable)
            uri = uri_for_digest(digest.hexdigest())
            path = self._path(uri, context)
            self._enter(path.parent, create=True)
            if not refresh(path, len(data)):  # first put wins: a whole stored blob is only refreshed
                try:
                    os.replace(temp, path)
                except OSError as error:
                    if error.errno != errno.EXDEV:
                        raise
                    write_atomic(path, data, self.durable)  # the key strategy put it on another file system
                else:
                    if self.durable:
                        fsync_dir(path.parent)
            return uri, path
        finally:
            digest.join()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def _read_blob(self, path: Path, uri: str) -> bytes:
        if not self._enter(path.parent, create=False):
            raise FileNotFoundError(f'media not found: {uri}')
        data = read_regular(path)
        if data is None:
            raise FileNotFoundError(f'media not found: {uri}')
        # On this worker thread, after the read: hashing pieces on a second thread while the
        # next ones are read was measured slower for files (the final copy and the page faults
        # of a preallocated buffer cost more than the overlap saves).
        if hashlib.sha256(data).hexdigest() != parse_media_uri(uri):
            raise MediaIntegrityError.damaged(uri, len(data), f'stored at {path}')
        return data

    def _exists(self, path: Path) -> bool:
        return self._enter(path.parent, create=False) and is_regular(path)

    def _read_metadata(self, path: Path, uri: str) -> dict[str, str]:
        if not self._exists(path):
            raise FileNotFoundError(f'media not found: {uri}')
        raw = read_regular(sidecar(path))
        if raw is None:
            return {}
        try:
            return decode_metadata(raw.decode('utf-8'))
        except ValueError as exc:
            raise ValueError(f'unreadable metadata sidecar for {uri} at {sidecar(path)}: {exc}') from exc

    def _walk(self) -> Generator[BlobInfo]:
        """The blobs among the files under the root (`_files`)."""
        for path, key, info in _files(self._root):
            if TEMP_NAME.fullmatch(os.path.basename(path)):
                continue
            try:
                uri = self._uri_of(path, key)
            except FileNotFoundError:  # gone since it was listed
                continue
            if uri is not None:
                yield BlobInfo(uri=uri, size=info.st_size, stored_at=utc_from_timestamp(info.st_mtime))

    def _tidy(self) -> None:
        """Tidy the temporary files and sidecars killed puts and deletes left (see the module notes)."""
        for path, key, info in _files(self._root, sidecars=True):
            if TEMP_NAME.fullmatch(os.path.basename(path)):
                tidy_leftover(path, info, lambda uri: self._path(uri, EMPTY_CONTEXT), self.durable)
            elif key.endswith(SIDECAR_SUFFIX):
                blob, blob_key = path.removesuffix(SIDECAR_SUFFIX), key.removesuffix(SIDECAR_SUFFIX)
                if any(self._addresses(uri, blob, blob_key) for uri in uris_named_in_key(blob_key)):
                    tidy_sidecar(path, blob, self.durable)  # the sidecar of a blob of this store

    def _uri_of(self, path: str, key: str) -> str | None:
        """The URI whose key (with an empty context) is `key`, the file's path relative to the root.

        From a digest in the key or, for a key strategy other than the default, the file's bytes.
        """
        named = False
        for uri in uris_named_in_key(key):
            named = True
            if self._addresses(uri, path, key):
                return uri
        if named or self._key_strategy is default_key_strategy:
            return None  # the default key always holds the digest: a file without one is not a blob
        digest = hash_file(path)
        if digest is None:
            return None
        uri = uri_for_digest(digest)
        return uri if self._addresses(uri, path, key) else None

    def _addresses(self, uri: str, path: str, key: str) -> bool:
        """Whether `uri`'s key, with an empty context, is the file at `path` (whose relative key is `key`).

        Compared under the store's own directory, not against `path`: the walk's paths are absolute,
        and the directory may be relative (and mean another place once the working directory changes).
        """
        if self._key_strategy(uri, EMPTY_CONTEXT) == key and fits(path):
            return True  # the usual case, without the cost of parsing paths
        try:
            return self._path(uri, EMPTY_CONTEXT) == self._root / key
        except ValueError:  # a key this store refuses: no blob can be stored under it
            return False

    def _delete_sync(self, path: Path, stored_before: datetime | None) -> bool:
        if not self._enter(path.parent, create=False):
            return False
        if stored_before is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
        else:
            # Renamed first, so that no put can refresh the blob between the check and the unlink:
            # a put from now on finds no blob and writes it again.
            doomed = path.with_name(temp_name('gc'))
            try:
                os.rename(path, doomed)
            except FileNotFoundError:
                return False
            try:
                put_at = utc_from_timestamp(os.lstat(doomed).st_mtime)
            except BaseException:
                os.replace(doomed, path)
                raise
            if put_at >= stored_before:
                # Put again meanwhile: back it goes. A copy a racing put wrote there holds the same bytes.
                os.replace(doomed, path)
                if self.durable:
                    fsync_dir(path.parent)
                return False
            os.unlink(doomed)
        if not path.exists():  # unless it was put again meanwhile, with metadata of its own
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sidecar(path))
        return True

    # -- paths ------------------------------------------------------------------------------------

    def _path(self, uri: str, context: MediaContext) -> Path:
        parse_media_uri(uri)  # validate before the strategy sees it
        key = safe_relative_key(self._key_strategy(uri, context), uri)
        path = self._root / key
        check_lengths(key, self._root, uri)
        return path

    def _enter(self, directory: Path, *, create: bool) -> bool:
        """Whether the store's directory and each folder below it down to `directory` are there,
        each checked by the rule of `_files` (a link, or a folder of another user, is
        `UnsafeEntryError`), so no blob is read, written or deleted through a link planted in the
        store. With `create`, missing folders are made, 0o700 (and the directories above the
        store's own too, unchecked: those are the caller's choice)."""
        folders = [self._root]
        for part in directory.relative_to(self._root).parts:
            folders.append(folders[-1] / part)
        for folder in folders:
            if check_directory(folder, 'media folder'):
                continue
            if not create:
                return False
            if folder is self._root:
                self._make_dirs(folder.parent)
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=_DIR_MODE)
            if self.durable:
                fsync_dir(folder.parent)
            check_directory(folder, 'media folder')  # what a racing process made there
        return True

    def _make_dirs(self, directory: Path) -> None:
        """Create `directory` and its missing parents, each 0o700 (`os.makedirs` gives the mode to the leaf only)."""
        missing: list[Path] = []
        current = directory
        while not current.is_dir():
            missing.append(current)
            if current.parent == current:
                break
            current = current.parent
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=_DIR_MODE)
            if self.durable:
                fsync_dir(folder.parent)


def _next_batch(blobs: Iterator[BlobInfo]) -> list[BlobInfo]:
    return [blob for _, blob in zip(range(_LIST_BATCH), blobs, strict=False)]


def _files(root: Path, *, sidecars: bool = False) -> Generator[tuple[str, str, os.stat_result]]:
    """`(path, path relative to root, lstat)` of every regular file under `root` (sidecars only if
    asked), depth first, never into a symbolic link or a folder `check_directory` refuses (skipped
    with a warning); what vanishes during the walk is skipped."""
    pending = [(os.path.abspath(root), '')]  # a directory, and its path relative to the root ('a/b/')
    while pending:
        directory, relative = pending.pop()
        try:
            if not check_directory(directory, 'media folder'):
                continue
            entries = os.scandir(directory)
        except UnsafeEntryError as error:
            logger.warning('not listing the blobs in %s', error)
            continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((entry.path, f'{relative}{entry.name}/'))
                    elif entry.is_file(follow_symlinks=False) and (sidecars or not entry.name.endswith(SIDECAR_SUFFIX)):
                        yield entry.path, relative + entry.name, entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
