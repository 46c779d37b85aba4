"""Hashing a large payload on a thread of its own while the store writes it."""

from __future__ import annotations

import hashlib
import threading


class Sha256Thread:
    """SHA-256 of a buffer, computed on a thread of its own (`hashlib` releases the GIL for large inputs).

    A media store must know a payload's digest to name it, and hashing costs about as much as
    writing. Started before the write, the hash runs on a second core while the caller writes
    the bytes under a provisional name; `hexdigest()` then waits for it.
    """

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data
        self._digest: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name='pydantic-ai-steps-media-sha256', daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            assert self._data is not None
            self._digest = hashlib.sha256(self._data).hexdigest()
        except BaseException as error:  # handed to the caller by hexdigest()
            self._error = error
        finally:
            self._data = None

    def join(self) -> None:
        self._thread.join()

    def hexdigest(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest
