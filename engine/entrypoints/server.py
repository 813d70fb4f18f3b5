"""A standalone OpenAI-compatible HTTP server for one engine (`tiergate engine`).

The openai client and litellm (`hosted_vllm/<name>` with `api_base`) talk to it as they
would to vLLM. Every error, FastAPI's own body validation included, leaves as an OpenAI
error body; nothing answers 422.
"""

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.api_key import RequireApiKey
from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from engine.entrypoints.choices import (
    Child,
    close_all,
    drain,
    interleave,
    start_children,
    usage_of,
)
from engine.entrypoints.shutdown import serve_gracefully
from engine.errors import (
    EngineDeadError,
    EngineError,
    PromptTooLongError,
    QueueFullError,
    RequestFailedError,
)
from engine.logprob_shapes import chat_logprobs, completion_logprobs
from engine.outputs import RequestOutput
from engine.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    DeltaMessage,
    EngineChatCompletionRequest,
    EngineCompletionRequest,
    ModelCard,
    ModelList,
    chat_completion_id,
    completion_id,
    created_now,
    error_response_body,
    to_sampling_params,
    validation_error_message,
)
from engine.tool_calls import ToolCallStream, as_deltas, split_answer

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
        request_id = f"{request_id}-{index}"
        if params.seed is not None:  # the choices differ, yet the whole answer repeats
            params = dataclasses.replace(params, seed=params.seed + index)
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


async def render_chat(engine: AsyncEngine, body: ChatCompletionRequest) -> str:
    messages = [message.template_dict() for message in body.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    try:
        return await engine.apply_chat_template(messages, tools)
    except PromptTooLongError as exc:
        raise engine_error(exc) from exc
    except Exception as exc:
        # The template runs over client data (and may `raise_exception` on bad role
        # orders); whatever fails there is the request's fault.
        message = f"Could not apply the chat template: {exc}"
        raise OpenAIError(400, message, param="messages") from exc


async def chat_completion(
    engine: AsyncEngine, model: str, body: ChatCompletionRequest, request: Request
) -> Response:
    request_id = chat_completion_id()
    prompt = await render_chat(engine, body)
    children = await start_choices(engine, prompt, request_id, body)
    head: dict[str, Any] = {"id": request_id, "created": created_now(), "model": model}
    tools = body.callable_tools()
    if body.stream:
        return event_stream(chat_events(head, children, body.include_usage, tools))
    finals = await collect(request, children)
    if finals is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    choices = []
    for index, final in enumerate(finals):
        content, calls, reason = split_answer(final.text, final.finish_reason or "stop", tools)
        message = AssistantMessage(content=content, tool_calls=calls)
        logprobs = None if final.logprobs is None else chat_logprobs(final.logprobs)
        choices.append(
            ChatChoice(index=index, message=message, finish_reason=reason, logprobs=logprobs)
        )
    return json_response(ChatCompletion(**head, choices=choices, usage=usage_of(finals)))


def chat_renderer(
    head: dict[str, Any], first: RequestOutput, index: int, tools: set[str]
) -> Callable[[RequestOutput], ChatCompletionChunk | None]:
    """One choice's chunks: the role on its first, tool calls parsed at its end."""
    calls = ToolCallStream(tools) if tools else None

    def render(out: RequestOutput) -> ChatCompletionChunk | None:
        text, tool_calls, reason = out.text, None, out.finish_reason
        if calls is not None:
            text = calls.feed(text)
            if out.finished:
                end = calls.finish()
                text += end.content or ""
                if end.tool_calls:
                    tool_calls = as_deltas(end.tool_calls)
                    reason = "tool_calls" if reason == "stop" else reason
        if not text and not out.logprobs and not out.finished and out is not first:
            return None
        role = "assistant" if out is first else None
        content = text or (None if out.finished else "")
        delta = DeltaMessage(role=role, content=content, tool_calls=tool_calls)
        logprobs = chat_logprobs(out.logprobs) if out.logprobs else None
        choice = ChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=logprobs)
        return ChatCompletionChunk(**head, choices=[choice])

    return render


def chat_events(
    head: dict[str, Any], children: list[Child], include_usage: bool, tools: set[str]
) -> AsyncIterator[str]:
    renderers = [chat_renderer(head, first, i, tools) for i, (first, _) in enumerate(children)]

    def usage_event(lasts: list[RequestOutput]) -> ChatCompletionChunk:
        return ChatCompletionChunk(**head, choices=[], usage=usage_of(lasts))

    render = lambda index, out: renderers[index](out)  # noqa: E731
    return sse_events(children, render, usage_event if include_usage else None)


# ------------------------------------------------------------------------ text completions


async def text_completion(
    engine: AsyncEngine, model: str, body: CompletionRequest, request: Request
) -> Response:
    request_id = completion_id()
    children = await start_choices(engine, body.prompt, request_id, body)
    head: dict[str, Any] = {"id": request_id, "created": created_now(), "model": model}
    if body.stream:
        return event_stream(completion_events(head, children, body.include_usage))
    finals = await collect(request, children)
    if finals is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    choices = [
        CompletionChoice(
            index=index,
            text=final.text,
            finish_reason=final.finish_reason,
            logprobs=None if final.logprobs is None else completion_logprobs(final.logprobs),
        )
        for index, final in enumerate(finals)
    ]
    return json_response(Completion(**head, choices=choices, usage=usage_of(finals)))


def completion_events(
    head: dict[str, Any], children: list[Child], include_usage: bool
) -> AsyncIterator[str]:
    sent = [0] * len(children)  # token text sent per choice: where its next text_offset starts

    def render(index: int, out: RequestOutput) -> Completion | None:
        if not out.text and not out.logprobs and not out.finished:
            return None
        logprobs = None
        if out.logprobs:
            logprobs = completion_logprobs(out.logprobs, sent[index])
            sent[index] += sum(len(e.chosen.token) for e in out.logprobs)
        choice = CompletionChoice(
            index=index, text=out.text, finish_reason=out.finish_reason, logprobs=logprobs
        )
        return Completion(**head, choices=[choice])

    def usage_event(lasts: list[RequestOutput]) -> Completion:
        return Completion(**head, choices=[], usage=usage_of(lasts))

    return sse_events(children, render, usage_event if include_usage else None)


# ---------------------------------------------------------------------------------- app


def check_model(requested: str, served_name: str) -> None:
    if requested != served_name:
        message = f"The model `{requested}` does not exist; this server serves `{served_name}`."
        raise OpenAIError(404, message, param="model", code="model_not_found")


def create_engine_app(
    engine: AsyncEngine,
    served_name: str,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The OpenAI-compatible API over one running engine (started and stopped by the caller).

    With `api_key` every route but /health (for load-balancer probes) needs it as a bearer.
    """
    app = FastAPI(title="tiergate engine", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    if api_key is not None:
        app.add_middleware(RequireApiKey, key=api_key, open_paths=frozenset({"/health"}))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(
        body: EngineChatCompletionRequest, request: Request
    ) -> Response:
        check_model(body.model, served_name)
        return await chat_completion(engine, served_name, body, request)

    @app.post("/v1/completions")
    async def create_completion(body: EngineCompletionRequest, request: Request) -> Response:
        check_model(body.model, served_name)
        return await text_completion(engine, served_name, body, request)

    @app.get("/v1/models")
    async def list_models() -> Response:
        card = ModelCard(id=served_name, max_model_len=engine.max_model_len)
        return json_response(ModelList(data=[card]))

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_running:
            return OpenAIError(503, "The engine is not running.", code="engine_dead").response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def run_engine_server(
    config: EngineConfig,
    host: str,
    port: int,
    served_name: str | None,
    shutdown_grace_s: float,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Load the model, start the engine and serve it until interrupted (`tiergate engine`).

    SIGTERM drains: requests in flight get `shutdown_grace_s`, then the engine stops and
    those left end with an error (an SSE error event in a stream); a second SIGTERM exits.
    """
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without --api-key: anyone who reaches it can use it", host)
    engine = AsyncEngine(config)
    app = create_engine_app(engine, served_name or config.model, api_key, max_body_bytes)
    engine.start()

    async def abort_the_rest() -> None:
        await asyncio.to_thread(engine.shutdown)  # every request left gets EngineDeadError

    try:
        # lifespan off: the engine's life is managed here, and a Ctrl-C would otherwise
        # surface as a traceback from the idle lifespan task.
        serve_gracefully(
            app, host, port, shutdown_grace_s, abort_the_rest, log_level="info", lifespan="off"
        )
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it caught once it has shut down gracefully
    finally:
        engine.shutdown()
