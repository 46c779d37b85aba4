"""The error every media store raises when stored bytes do not hash to the URI they are read by, and
the refusal of a table that is not a blob table."""

from __future__ import annotations

from collections.abc import Collection
from typing import Self

__all__ = ['MediaIntegrityError']


class MediaIntegrityError(FileNotFoundError):
    """The bytes stored under a `media+sha256://` URI do not hash to its digest.

    A `FileNotFoundError`: the blob the URI names is not there, only damaged bytes are, so code
    that handles a missing blob handles this too. `uri` and `size` (the byte count read) say which
    blob and how much of it was found. Stores raise it through `MediaIntegrityError.damaged` (or,
    for a store with its own error family, a subclass such as `S3IntegrityError`).
    """

    uri: str | None = None
    size: int | None = None

    @classmethod
    def damaged(cls, uri: str, size: int, where: str, detail: str = '') -> Self:
        """The error for `size` bytes read `where` (`stored at <path>`) under `uri`, plus any `detail`."""
        error = cls(integrity_message(uri, size, where, detail))
        error.uri, error.size = uri, size
        return error


def integrity_message(uri: str, size: int, where: str, detail: str = '') -> str:
    """The one wording every store uses: the URI, the byte count and that they do not match."""
    return (
        f'media {uri} is damaged: the {size} bytes {where} do not match its sha256 digest'
        + (f' ({detail})' if detail else '')
        + '; it reads as missing'
    )


BLOB_TABLE_COLUMNS = frozenset({'sha256', 'bytes', 'size_bytes'})
"""The columns every layout of a SQL blob table has (the upstream package's one-row table too)."""


def check_blob_table(table: str, columns: Collection[str], where: str = '') -> None:
    """Refuse an existing table that holds something else (a step store's runs, say) before it is widened.

    `where` names the database, for a store that can tell (` in SQLite database '/path/x.db'`).
    """
    missing = BLOB_TABLE_COLUMNS.difference(columns) if columns else frozenset[str]()
    if missing:
        raise ValueError(
            f'table {table!r} is not a media table{where} (it has no {", ".join(sorted(missing))} column); nothing '
            "was changed. Give the media store a table of its own with table= (the default is 'media')"
        )
