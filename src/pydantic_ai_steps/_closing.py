"""`AsyncClosing`: `async with store:` for every store, closing it on the way out."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """Gives a class with an `aclose()` the `async with` form (`aclose()` on exit, however it ends)."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
