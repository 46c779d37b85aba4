"""File-system rules shared by the File step store and the Disk media store."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush `path`'s directory entries to disk, so a file created or renamed in it survives power loss.

    A no-op on Windows, where a directory cannot be opened (NTFS journals its metadata).
    """
    if sys.platform == 'win32':  # pragma: no cover - directories cannot be opened there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
