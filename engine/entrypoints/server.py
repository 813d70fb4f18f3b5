"""A standalone OpenAI-compatible HTTP server for one engine (`tiergate engine`).

The openai client and litellm (`hosted_vllm/<name>` with `api_base`) talk to it as they
would to vLLM. Every error, FastAPI's own body validation included, leaves as an OpenAI
error body; nothing answers 422.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.api_key import RequireApiKey
from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from engine.entrypoints.choices import (
    Child,
    usage_of,
)
from engine.entrypoints.http import (
    CLIENT_CLOSED_REQUEST,
    OpenAIError,
    collect,
    engine_error,
    event_stream,
    install_error_handlers,
    json_response,
    sse_events,
    start_choices,
)
from engine.entrypoints.shutdown import serve_gracefully
from engine.errors import (
    PromptTooLongError,
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
    ModelCard,
    ModelList,
    chat_completion_id,
    completion_id,
    created_now,
)
from engine.tool_calls import ToolCallStream, as_deltas, split_answer

logger = logging.getLogger("tiergate.engine.server")


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
