"""The engine server's HTTP plumbing: OpenAI errors (never a 422), starting requests and
their choices, disconnect watching, and server-sent events that close the engine's
streams however the response ends."""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from engine.engine import AsyncEngine
from engine.entrypoints.choices import (
    Child,
    choice_params,
    close_all,
    drain,
    interleave,
    start_children,
)
from engine.errors import (
    EngineDeadError,
    EngineError,
    PromptTooLongError,
    QueueFullError,
    RequestFailedError,
)
from engine.outputs import RequestOutput
from engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    error_response_body,
    to_sampling_params,
    validation_error_message,
)

logger = logging.getLogger("tiergate.engine.server")


RETRY_AFTER_SECONDS = 1
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"


# -------------------------------------------------------------------------------- errors


class OpenAIError(Exception):
    """An error the client should see as `{"error": {...}}` with this HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_response_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def engine_error(exc: EngineError, prompt_param: str = "messages") -> OpenAIError:
    """The HTTP error a client should see for an engine exception."""
    if isinstance(exc, PromptTooLongError):
        return OpenAIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, QueueFullError):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        message = str(exc) or "The engine's waiting queue is full; retry shortly."
        return OpenAIError(429, message, code="queue_full", headers=headers)
    if isinstance(exc, EngineDeadError):
        return OpenAIError(503, str(exc) or "The engine is not running.", code="engine_dead")
    if isinstance(exc, RequestFailedError):
        # The cause is in the server log; a client sees no internals.
        return OpenAIError(500, "The engine failed this request.", code="request_failed")
    return OpenAIError(500, f"Engine error: {exc}")


def install_error_handlers(app: FastAPI) -> None:
    async def on_openai_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIError)
        return exc.response()

    async def on_validation_error(_: Request, exc: Exception) -> Response:
        # OpenAI answers a bad body with 400, not FastAPI's 422.
        assert isinstance(exc, RequestValidationError)
        message, param = validation_error_message(exc.errors())
        return OpenAIError(400, message, param=param).response()

    async def on_http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        return JSONResponse(
            error_response_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=headers,
        )

    async def on_unexpected(_: Request, exc: Exception) -> Response:
        # Starlette logs the exception after this; the client gets OpenAI's shape without
        # the exception's text, which may name internals.
        return OpenAIError(500, "Internal server error.").response()

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)


# ----------------------------------------------------------------------- engine requests


async def start_outputs(
    engine: AsyncEngine,
    prompt: str | list[int] | list[str],  # a one-string list is unwrapped by validation
    request_id: str,
    body: ChatCompletionRequest | CompletionRequest,
    index: int = 0,
) -> Child:
    """Submit a request (choice `index` of it) and wait for its first output.

    The engine raises admission errors (too long, queue full, dead) before its first
    yield; pulling that output here turns them into HTTP statuses before any byte is sent.
    """
    # Without max_tokens the answer may run to the end of the context, as in vLLM and
    # OpenAI (the engine caps it at the room the prompt leaves).
    params = to_sampling_params(body, default_max_tokens=engine.max_model_len)
    if index:
        request_id, params = f"{request_id}-{index}", choice_params(params, index)
    prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    outputs = engine.generate(prompt, params, request_id, cache_salt=body.cache_salt)
    try:
        return await anext(outputs), outputs
    except EngineError as exc:
        raise engine_error(exc, prompt_param) from exc
    except ValueError as exc:  # the engine refused the prompt itself (empty, bad token ids)
        param = getattr(exc, "param", prompt_param)  # InvalidParamError names its field
        raise OpenAIError(400, str(exc), param=param) from exc
    except StopAsyncIteration:
        raise OpenAIError(500, "The engine ended the request without output.") from None


async def start_choices(
    engine: AsyncEngine,
    prompt: str | list[int] | list[str],
    request_id: str,
    body: ChatCompletionRequest | CompletionRequest,
) -> list[Child]:
    return await start_children(
        lambda index: start_outputs(engine, prompt, request_id, body, index), body.n or 1
    )


async def collect(request: Request, children: list[Child]) -> list[RequestOutput] | None:
    """Run a non-streamed request's choices to their end (texts whole, see `drain`).

    Returns None, having aborted the requests, if the client disconnects first.
    """
    finals: list[RequestOutput] = []
    failure: EngineError | None = None

    async def run() -> None:
        nonlocal finals, failure
        try:
            finals = list(await asyncio.gather(*(drain(f, o) for f, o in children)))
        except EngineError as exc:  # the engine died mid-request
            failure = exc

    try:
        await unless_disconnected(request, run)
    finally:
        await close_all(children)
    if failure is not None:
        raise engine_error(failure) from failure
    return finals if finals and all(f.finished for f in finals) else None


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work`, cancelling it if the client disconnects first.

    Uvicorn does not cancel a handler whose client left; without this a non-streamed
    request would keep the engine busy for an answer nobody reads.
    """

    async def watch_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch_disconnect)
        await work()
        group.cancel_scope.cancel()


def sse(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


async def sse_events(
    children: list[Child],
    render: Callable[[int, RequestOutput], BaseModel | None],
    usage_event: Callable[[list[RequestOutput]], BaseModel] | None,
) -> AsyncIterator[str]:
    """A stream's SSE events: one per engine output of any choice, then usage if asked,
    then [DONE]."""
    lasts = [first for first, _ in children]
    items = interleave(children)
    try:
        async for index, out in items:
            lasts[index] = out
            if (event := render(index, out)) is not None:
                yield sse(event)
        if usage_event is not None:
            yield sse(usage_event(lasts))
        yield "data: [DONE]\n\n"
    except EngineError as exc:
        # Headers are gone; the error travels in-band, as vLLM and OpenAI do.
        yield sse(engine_error(exc).body())
    finally:
        with anyio.CancelScope(shield=True):
            await items.aclose()
        await close_all(children)


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body iterator however the response ends.

    On a client disconnect Starlette cancels the sending task but leaves the iterator to
    the garbage collector; closing it here aborts the engine request (pages freed) at once.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return ClosingStreamingResponse(events, media_type="text/event-stream", headers=headers)


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


# ------------------------------------------------------------------------ chat completions
