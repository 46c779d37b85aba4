"""Running the File and SQLite stores' blocking work without stalling the event loop, cheaply.

A step makes several store calls, each a short burst of file or SQLite I/O (tens of
microseconds). Handing each to a worker thread costs more than the work: two thread wake-ups
(measured in `docs/design.md`). So the per-step calls are first
tried *on the event loop* in a mode where they may not wait for anything (`run_soon`): every
lock they would wait on (a thread lock, `flock`, SQLite's write lock) is only tried, and if one
is taken the attempt raises `WouldBlock` before it has written anything, and the call goes to a
worker thread instead, where waiting is harmless. Either way the loop never waits on another
writer. A call that must flush to disk (`durable` stores) is tried there too while the store's
flushes are measured to take no longer than `FlushTimer.LIMIT`: a hand-off costs the run about as
much (two thread wake-ups and the loop's turns between them), and a disk that is slower than that
sends them to a worker, so a slow disk never holds the loop up for long.

The worker hand-off (`run_blocking`): on asyncio a small pool of long-lived worker threads fed
through a `SimpleQueue`, waking the loop with `call_soon_threadsafe` (cheaper than
`anyio.to_thread.run_sync`, which is used under any other event loop, e.g. trio).

Semantics match `anyio.to_thread.run_sync` without `abandon_on_cancel`: a call that has started
always runs to completion, and a cancellation that arrives meanwhile is delivered after it, so
a cancelled caller never races its own still-running write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.to_thread

_R = TypeVar('_R')
_Args = TypeVarTuple('_Args')
_MAX_THREADS = 32
"""Upper bound on worker threads (anyio's default limiter allows 40)."""

_attempt = threading.local()


class WouldBlock(BaseException):
    """Raised by a call tried on the event loop at the first point where it would have to wait.

    Raise it only before the call has changed anything: the call is then run again, in full, on
    a worker thread. A `BaseException`, so that no `except Exception` in a store swallows it.
    """


def may_wait() -> bool:
    """Whether the running call may block: false while `run_soon` tries it on the event loop."""
    return not getattr(_attempt, 'active', False)


def acquire(lock: threading.Lock) -> None:
    """Take `lock`; under `run_soon`'s attempt only if it is free (else `WouldBlock`)."""
    if not lock.acquire(blocking=may_wait()):
        raise WouldBlock


@contextlib.contextmanager
def held(lock: threading.Lock) -> Generator[None]:
    """`with lock:`, except that under `run_soon`'s attempt a taken lock raises `WouldBlock`."""
    acquire(lock)
    try:
        yield
    finally:
        lock.release()


class FlushTimer:
    """How long a store's flushing calls take lately (a moving average), and so where they run."""

    LIMIT = 0.001
    """Seconds a flushing call may hold the event loop: about what a hand-off to a worker and back
    costs a running agent (measured in `docs/design.md`)."""

    def __init__(self) -> None:
        self._seconds = 0.0

    @property
    def fits_the_loop(self) -> bool:
        return self._seconds <= self.LIMIT

    def measured(self, seconds: float) -> None:
        """One more flushing call took `seconds`: a single slow one moves the calls to a worker,
        and a few fast ones bring them back."""
        self._seconds += (seconds - self._seconds) / 4


_Job = tuple[asyncio.AbstractEventLoop, 'asyncio.Future[Any]', Callable[..., Any], tuple[Any, ...]]


class _Pool:
    """Daemon worker threads, started on demand while every existing one is busy."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Start empty. Also run in a forked child, which inherits none of the parent's threads."""
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0

    def submit(self, job: _Job) -> None:
        with self._lock:
            self._busy += 1
            start = self._busy > self._threads and self._threads < _MAX_THREADS
            if start:
                self._threads += 1
        if start:
            threading.Thread(target=self._work, name='pydantic-ai-steps-store', daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            loop, future, function, args = self._jobs.get()
            try:
                result = function(*args)
            except BaseException as error:
                outcome: tuple[bool, Any] = (False, error)
            else:
                outcome = (True, result)
            with self._lock:
                self._busy -= 1
            with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
                loop.call_soon_threadsafe(_settle, future, outcome)
            del future, function, args, outcome


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # pragma: no cover - only if someone cancelled the inner future itself
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


_pool = _Pool()
if hasattr(os, 'register_at_fork'):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_pool._reset)  # pyright: ignore[reportPrivateUsage]


async def run_soon(function: Callable[[Unpack[_Args]], _R], *args: *_Args, inline: bool = True) -> _R:
    """Run `function(*args)` right here if it can finish without waiting, else on a worker thread.

    `function` must check `may_wait()` (or use `acquire`) before anything that can wait, and raise
    `WouldBlock` there. `inline=False` skips the attempt (for calls that flush to disk or read
    without bound).
    """
    if inline and may_wait():
        _attempt.active = True
        try:
            return function(*args)
        except WouldBlock:
            pass
        finally:
            _attempt.active = False
    return await run_blocking(function, *args)


async def run_blocking(function: Callable[[Unpack[_Args]], _R], *args: *_Args) -> _R:
    """Run `function(*args)` on a worker thread and return its result (or raise its error)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (e.g. trio): anyio's own thread pool
        return await anyio.to_thread.run_sync(function, *args)
    future: asyncio.Future[_R] = loop.create_future()
    _pool.submit((loop, future, function, args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Let the call finish, as anyio.to_thread.run_sync does, then deliver the cancellation.
        with anyio.CancelScope(shield=True):
            await asyncio.wait([future])
        raise
