"""A standalone OpenAI-compatible HTTP server for one engine (`tiergate engine`).

The openai client and litellm (`hosted_vllm/<name>` with `api_base`) talk to it as they
would to vLLM. Every error, FastAPI's own body validation included, leaves as an OpenAI
error body; nothing answers 422.
"""

import asyncio
import logging
from collections.abc import Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.api_key import RequireApiKey
from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from engine.entrypoints.choices import Child, usage_of
from engine.entrypoints.http import (
    collect,
    event_stream,
    json_response,
    sse_events,
    start_choices,
    started,
)
from engine.entrypoints.openai.best_of import pick_best
from engine.entrypoints.openai.chat_template import prompt_ids
from engine.entrypoints.openai.errors import OpenAIError, engine_error, install_error_handlers
from engine.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    DeltaMessage,
    ModelCard,
    ModelList,
)
from engine.entrypoints.openai.shapes import ChatShape, Ended, TextShape, chat_shapes, text_shapes
from engine.entrypoints.shutdown import serve_gracefully
from engine.entrypoints.streaming import CLIENT_CLOSED_REQUEST
from engine.errors import EngineError
from engine.outputs import RequestOutput

logger = logging.getLogger("tiergate.engine.server")


async def respond(
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    shapes: Sequence[ChatShape] | Sequence[TextShape],
    children: list[Child],
    render: Callable[[int, RequestOutput], BaseModel | list[BaseModel] | None],
) -> Response:
    """A request's answer from its started choices: streamed (`render` dresses each engine
    output of choice i as an event), or whole once every choice has ended (the best of
    them with `best_of`; usage counts them all)."""
    if body.stream:
        usage = lambda lasts: shapes[0].usage_chunk(usage_of(lasts))  # noqa: E731
        usage_event = usage if body.include_usage else None
        so_far = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        events = sse_events(children, render, usage_event, so_far)
        return event_stream(events, children)
    finals = await collect(request, children)
    if finals is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    choices = [
        shape.choice(Ended(final.text, final.finish_reason or "stop", final.logprobs))
        for shape, final in zip(shapes, pick_best(finals, body), strict=True)
    ]
    return json_response(shapes[0].answer(choices, usage_of(finals)))  # type: ignore[arg-type]


async def _prompt(
    engine: AsyncEngine, body: ChatCompletionRequest | CompletionRequest
) -> list[int]:
    try:
        return await prompt_ids(engine, body)
    except (EngineError, ValueError) as exc:
        prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise engine_error(exc, prompt_param) from exc


async def _start(
    engine: AsyncEngine, body: ChatCompletionRequest | CompletionRequest, answer_id: str
) -> list[Child]:
    """The prompt's tokens, then its choices started (both watched for a client that leaves)."""
    return await start_choices(engine, await _prompt(engine, body), answer_id, body)


async def chat_completion(
    engine: AsyncEngine, model: str, body: ChatCompletionRequest, request: Request
) -> Response:
    shapes = chat_shapes(model, body.callable_tools(), body.n or 1)
    children = await started(request, lambda: _start(engine, body, shapes[0].id))
    if children is None:  # the client left before the first token
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    firsts = [first for first, _ in children]
    renderers = [chat_renderer(shape, first) for shape, first in zip(shapes, firsts, strict=True)]
    return await respond(request, body, shapes, children, lambda i, out: renderers[i](out))


def chat_renderer(
    shape: ChatShape, first: RequestOutput
) -> Callable[[RequestOutput], list[ChatCompletionChunk] | None]:
    """One choice's chunks: the role on its first, each tool call once it closes."""

    def render(out: RequestOutput) -> list[ChatCompletionChunk] | None:
        (text, tool_calls), reason = shape.feed(out.text), out.finish_reason
        if out.finished:
            held, last_calls, reason = shape.end(reason)
            text += held or ""
            tool_calls = (tool_calls or []) + (last_calls or []) or None
        if not (text or tool_calls or out.logprobs or out.finished) and out is not first:
            return None
        role = "assistant" if out is first else None
        content = text or (None if out.finished or tool_calls else "")
        delta = DeltaMessage(role=role, content=content, tool_calls=tool_calls)
        return shape.chunks(delta, reason, out.logprobs)

    return render


async def text_completion(
    engine: AsyncEngine, model: str, body: CompletionRequest, request: Request
) -> Response:
    shapes = text_shapes(model, body.n or 1)
    children = await started(request, lambda: _start(engine, body, shapes[0].id))
    if children is None:  # the client left before the first token
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    def render(index: int, out: RequestOutput) -> Completion | None:
        if not out.text and not out.logprobs and not out.finished:
            return None
        return shapes[index].chunk(out.text, out.finish_reason, out.logprobs)

    return await respond(request, body, shapes, children, render)


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
    async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model, served_name)
        return await chat_completion(engine, served_name, body, request)

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request) -> Response:
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
