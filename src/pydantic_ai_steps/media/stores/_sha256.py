"""Hashing a payload off the event loop, or on a thread of its own while the store writes or reads it."""

from __future__ import annotations

import hashlib
import queue
import threading

import anyio.to_thread

HASH_ON_A_THREAD_BYTES = 1 << 20
"""Payloads at least this large are hashed on a thread of their own, overlapping their I/O."""


async def sha256_hex(data: bytes) -> str:
    """Hash off the event loop when it would block it noticeably (hashlib releases the GIL)."""
    if len(data) < HASH_ON_A_THREAD_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await anyio.to_thread.run_sync(lambda: hashlib.sha256(data).hexdigest())


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


class Sha256Feed:
    """SHA-256 of buffers handed over one at a time, computed on a thread of its own.

    For reads: a store fetching a large blob piece by piece feeds each piece here as it arrives,
    so hashing the first pieces overlaps fetching the next ones, and verifying a read costs little
    more than the read. A fed buffer must not change afterwards. Call `hexdigest()` (or `close()`,
    to abandon it) exactly once; either ends the thread.
    """

    def __init__(self) -> None:
        self._pieces: queue.SimpleQueue[bytes | memoryview | None] = queue.SimpleQueue()
        self._hash = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name='pydantic-ai-steps-media-sha256-feed', daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (piece := self._pieces.get()) is not None:
            if self._error is None:
                try:
                    self._hash.update(piece)
                except BaseException as error:  # handed to the caller by hexdigest()
                    self._error = error

    def update(self, piece: bytes | memoryview) -> None:
        self._pieces.put(piece)

    def close(self) -> None:
        """Stop the thread once it has hashed what it was given."""
        if self._thread.is_alive():
            self._pieces.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()
