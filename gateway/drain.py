"""The end of a graceful shutdown: abort what is still running once the grace period ends.

Uvicorn stops accepting on SIGTERM and waits for in-flight requests
(engine/entrypoints/shutdown.py gives it the grace period); when that runs out it calls
`Drain.expire`. Each request waits for its upstream only inside `Drain.opening` or
`Drain.pieces`, whose waits expire cancels: the upstream request is aborted (an engine
frees its pages), a stream ends with an SSE error event and a whole answer with a 503,
through the handlers' usual error paths.
"""

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Protocol, TypeVar

import anyio

from engine.entrypoints.openai.errors import OpenAIError
from gateway.backends.base import BackendError, Piece

T = TypeVar("T")
SHUTTING_DOWN = "The server is shutting down and could not finish this request; retry it."


class _Expired(Exception):
    pass


class Drain:
    def __init__(self) -> None:
        self.expired = False
        # The waits in progress. asyncio's own timeouts, never set until expiry: per streamed
        # piece they cost about half of an anyio cancel scope.
        self._waits: set[asyncio.Timeout] = set()

    def expire(self) -> None:
        """Abort every request waiting on its upstream now, and any that waits later.

        Call it on the event loop.
        """
        self.expired = True
        now = asyncio.get_running_loop().time()
        for wait in list(self._waits):
            wait.reschedule(now)

    async def _wait(self, awaitable: Awaitable[T]) -> T:
        """`await awaitable`, or _Expired if the drain expires first (or had already)."""
        if self.expired:  # even one that would not have to wait
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started: no "was never awaited" warning
            raise _Expired
        try:
            async with asyncio.timeout(None) as wait:
                self._waits.add(wait)
                try:
                    return await awaitable
                finally:
                    self._waits.discard(wait)
        except TimeoutError:
            if wait.expired():  # ours, not one from upstream
                raise _Expired from None
            raise

    async def opening(self, opened: Awaitable[T]) -> T:
        """Await the routing and first piece of a request; 503 if shutdown aborts it."""
        try:
            return await self._wait(opened)
        except _Expired:
            raise OpenAIError(503, SHUTTING_DOWN, code="shutting_down") from None

    def pieces(self, upstream: "Pieces") -> "DrainedPieces":
        return DrainedPieces(self, upstream)


class Pieces(Protocol):
    """An answer's pieces (fallback._Answer): closing them aborts the request upstream."""

    def __aiter__(self) -> "Pieces": ...

    async def __anext__(self) -> Piece: ...

    async def aclose(self) -> None: ...


class DrainedPieces:
    """An answer's pieces that end with a 503 BackendError once the drain expires.

    A class, like fallback._Answer: aclose() must reach upstream even if never iterated.
    """

    def __init__(self, drain: Drain, upstream: Pieces) -> None:
        self._drain, self._upstream = drain, upstream

    def __aiter__(self) -> "DrainedPieces":
        return self

    async def __anext__(self) -> Piece:
        try:
            return await self._drain._wait(anext(self._upstream))
        except _Expired:
            with anyio.CancelScope(shield=True):
                await self._upstream.aclose()  # aborts upstream: the engine frees its pages
            raise BackendError(503, SHUTTING_DOWN, retry=False, fallback=False) from None

    async def aclose(self) -> None:
        await self._upstream.aclose()
