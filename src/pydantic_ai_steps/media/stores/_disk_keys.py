"""Which keys `DiskMediaStore` can keep a blob under: relative paths inside its directory, short
enough for the file system, the blob's sidecar and the temporary files beside it."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..._errors import shortened

SIDECAR_SUFFIX = '.meta.json'
_NAME_MAX_BYTES = 255
"""The longest file or directory name common file systems take (ext4, XFS, APFS, NTFS...)."""
_PATH_MAX_BYTES = 1023 if sys.platform == 'darwin' else 4095
"""The longest path the OS takes (`PATH_MAX` less its terminating NUL)."""
_TEMP_NAME_BYTES = len(f'put-{uuid.UUID(int=0).hex}.tmp')
"""Temporary files are named `put-<32 hex>.tmp`, whatever the name of the file they become."""


def safe_relative_key(key: object, uri: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f'key_strategy must return a str relative path, got {type(key).__name__} for {uri}')
    posix = PurePosixPath(key)
    windows = PureWindowsPath(key)
    if (
        not key
        or '\x00' in key
        or posix.is_absolute()
        or windows.is_absolute()
        or windows.drive
        or key.startswith(('/', '\\'))
        or '..' in windows.parts  # Windows parsing splits on both separators
        or posix.name in ('', '.')
    ):
        raise ValueError(
            f'key_strategy produced traversal-unsafe path: {key!r} for {uri}; keys must be relative file paths '
            "inside the store directory, without '..' segments"
        )
    return key


def check_lengths(key: str, root: Path, uri: str) -> None:
    """Refuse a key the file system would refuse with ENAMETOOLONG, before anything is written.

    The blob's own name leaves room for the `.meta.json` sidecar beside it, and the whole path for
    the sidecar and for a temporary file in the blob's directory.
    """
    parts = Path(key).parts
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        limit = _NAME_MAX_BYTES - len(SIDECAR_SUFFIX) if last else _NAME_MAX_BYTES
        size = len(_fs_bytes(part, key, uri))
        if size > limit:
            what = 'file name' if last else 'directory name'
            reason = f"{_NAME_MAX_BYTES}, the file-system limit, less the {SIDECAR_SUFFIX!r} sidecar's suffix"
            raise ValueError(
                f'key_strategy produced a key with a {what} of {size} bytes in UTF-8; a {what} may have at most '
                f'{limit} bytes ({reason if last else "the file-system limit"}): {shortened(key)} for {uri}'
            )
    limit = _PATH_MAX_BYTES - max(len(SIDECAR_SUFFIX), _TEMP_NAME_BYTES + 1)
    size = len(_fs_bytes(os.path.abspath(root / key), key, uri))
    if size > limit:
        raise ValueError(
            f'key_strategy produced a key giving a path of {size} bytes in UTF-8; a path may have at most {limit} '
            f'bytes (the OS limit of {_PATH_MAX_BYTES} less room for the sidecar and temporary files beside the '
            f'blob): {shortened(key)} in store directory {shortened(str(root))} for {uri}'
        )


def _fs_bytes(text: str, key: str, uri: str) -> bytes:
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        raise ValueError(
            f'key_strategy produced a key the file system cannot name (not encodable as UTF-8): {shortened(key)} '
            f'for {uri}'
        ) from None


def fits(path: str) -> bool:
    """The length checks of `check_lengths` for a file that exists (its directory names fit already)."""
    try:
        name = os.path.basename(path)
        return len(os.fsencode(name)) <= _NAME_MAX_BYTES - len(SIDECAR_SUFFIX) and len(
            os.fsencode(path)
        ) <= _PATH_MAX_BYTES - max(len(SIDECAR_SUFFIX), _TEMP_NAME_BYTES + 1)
    except UnicodeEncodeError:
        return False
