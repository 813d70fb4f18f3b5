"""Answers over HTTP for both servers: server-sent events, a streaming response that closes
what feeds it however it ends, and a watcher that stops work whose client went away."""

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"
# Proxies (nginx) buffer responses unless told otherwise; a buffered stream is no stream.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: BaseModel | dict[str, Any] | str) -> bytes:
    """One server-sent event; a str is sent as it is (`sse("[DONE]")`)."""
    if isinstance(payload, BaseModel):
        payload = payload.model_dump_json()
    elif isinstance(payload, dict):
        payload = json.dumps(payload)
    return f"data: {payload}\n\n".encode()


class Closable(Protocol):
    async def aclose(self) -> None: ...


class ClosingStreamingResponse(StreamingResponse):
    """An SSE response that closes its body and the answers feeding it however it ends.

    On a disconnect Starlette cancels the sending task; if that happens while the body
    waits at a `yield`, the generator would be left to the garbage collector and the
    engine would keep generating. A body that never started cannot run its own cleanup,
    so the upstream answers (`upstreams`) are closed here too.
    """

    def __init__(self, content: AsyncIterator[bytes], *upstreams: Closable) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._upstreams = upstreams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                for upstream in self._upstreams:
                    await upstream.aclose()  # a no-op when the body already closed it


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[None]]) -> bool:
    """Run `work`, cancelling it if the client disconnects first; True if it ran to its end.

    Uvicorn does not cancel a handler whose client left; without this a non-streamed
    request would keep the engine busy for an answer nobody reads. Catch what `work` may
    raise inside it: the task group would wrap it in an ExceptionGroup.
    """
    finished = False

    async def watch_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch_disconnect)
        await work()
        finished = True
        group.cancel_scope.cancel()
    return finished
