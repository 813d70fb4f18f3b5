"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions, /v1/models.

One flow for both completion endpoints: authenticate, validate, route, open the fallback
chain, then answer whole or as an SSE stream. The body is validated by hand with the
engine's protocol models so a bad body is OpenAI's 400, never FastAPI's 422.
"""

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
    error_response_body,
    validation_error_message,
)
from gateway.api.shapes import ChatShape, Shape, TextShape, sse
from gateway.backends.base import BackendError, GenerationRequest, OpenAIRequest, Piece
from gateway.backends.fallback import Served
from gateway.embedding import embed_once
from gateway.errors import ApiError
from gateway.routing.router import Decision, PromptFeatures, RoutingInput, extract_features
from gateway.state import GatewayState, Runtime
from gateway.stats import Stats

router = APIRouter()

EXPLAIN_HEADER = "x-tiergate-explain"  # "1": the answer carries the routing decision
_CLIENT_CLOSED = 499  # nginx's status for "client closed the request", used in stats only
_CHARS_PER_TOKEN = 4
# Proxies (nginx) buffer responses unless told otherwise; a buffered stream is no stream.
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI runs a plain-def dependency in its thread pool, a hop per request.
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]


def _mask(key: str) -> str:
    return f"{key[:6]}...{key[-4:]}" if len(key) > 12 else "***"


def authenticate(request: Request, runtime: Runtime) -> str:
    """The caller's tenant; with no keys in the policy everyone is tenant "default"."""
    if not runtime.tenants:
        return "default"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    tenant = runtime.tenants.get(token)
    if tenant is None:
        raise ApiError(401, f"Incorrect API key provided: {_mask(token)}.", code="invalid_api_key")
    return tenant


async def parse_body(request: Request, model: type[OpenAIRequest]) -> OpenAIRequest:
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise ApiError(400, message, param=param) from None


def _features(body: OpenAIRequest) -> PromptFeatures:
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return extract_features(messages, None)
    prompt = body.prompt if isinstance(body.prompt, str) else None
    return extract_features(None, prompt)


def backend_error(exc: BackendError) -> ApiError:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    return ApiError(exc.status, exc.message, headers=headers)


@dataclass
class Call:
    """One request's bookkeeping, from routing to the last byte."""

    stats: Stats
    served: Served
    route: str
    features: PromptFeatures
    started: float

    def usage_or_estimate(self, usage: Usage | None, text: str) -> Usage:
        # A remote that reports no usage still gets counted (roughly) rather than for free.
        if usage is not None:
            return usage
        return Usage.of(self.features.approx_tokens, -(-len(text) // _CHARS_PER_TOKEN))

    def done(self, status: int, usage: Usage | None = None) -> None:
        served = self.served
        if usage is not None:
            self.stats.usage(served.tier, served.model, usage, served.price)
        self.stats.latency(served.tier, time.perf_counter() - self.started)
        self.stats.request_done(self.route, served.tier, served.model, status)


def _routing_input(
    request: Request,
    state: GatewayState,
    body: OpenAIRequest,
    tenant: str,
    features: PromptFeatures,
) -> RoutingInput:
    embedder = state.embedder.current if state.embedder is not None else None
    _, _, key = request.headers.get("authorization", "").partition(" ")
    return RoutingInput(
        model=body.model,
        features=features,
        embed=embed_once(embedder, features.last_user_text),
        headers=request.headers,
        tenant=tenant,
        api_key=key.strip() or None,
        max_tokens=getattr(body, "max_completion_tokens", None) or body.max_tokens,
        tools=bool(getattr(body, "tools", None)),
    )


async def _open(
    request: Request,
    runtime: Runtime,
    body: OpenAIRequest,
    tenant: str,
    inp: RoutingInput,
    stats: Stats,
) -> tuple[Served, Decision]:
    """Route the request and find a deployment that starts answering it."""
    decision = await runtime.router.decide(inp)
    if decision is None:
        raise ApiError(
            404,
            f"The model `{body.model}` does not exist. GET /v1/models lists the names served.",
            param="model",
            code="model_not_found",
        )
    request.state.tier = decision.tier
    if request.headers.get(EXPLAIN_HEADER) == "1":
        request.state.explain = json.dumps(decision.explain(), separators=(",", ":"))
    stats.routed(decision)
    generation = GenerationRequest(request.state.request_id, body, tenant)
    try:
        served = await runtime.chain.open(generation, decision.tier, decision.deployment)
    except BackendError as exc:
        raise backend_error(exc) from None
    request.state.tier, request.state.model = served.tier, served.model
    return served, decision


async def _complete(
    request: Request,
    state: GatewayState,
    model: type[OpenAIRequest],
    shape_of: Callable[[str], Shape],
) -> Response:
    started = time.perf_counter()
    runtime = state.runtime  # one policy for the whole request, even across a reload
    try:
        tenant = authenticate(request, runtime)
        body = await parse_body(request, model)
        features = _features(body)
        inp = _routing_input(request, state, body, tenant, features)
        served, decision = await _open(request, runtime, body, tenant, inp, state.stats)
    except ApiError as exc:  # refused before any answer: counted under the tier, if any
        state.stats.request_done("-", getattr(request.state, "tier", "-"), "-", exc.status)
        raise
    state.stats.first_token(served.tier, time.perf_counter() - started)
    call = Call(state.stats, served, decision.route or "-", features, started)
    shape = shape_of(served.model)
    if body.stream:
        stream = _stream(call, shape, body.include_usage)
        return ClosingStreamingResponse(stream, upstream=served.pieces)
    return await _whole(call, shape, request)


async def _collect(call: Call, request: Request) -> tuple[list[str], Piece] | None:
    """All pieces of a non-streamed answer; None (upstream aborted) if the client leaves."""
    texts: list[str] = []
    last, finished, error = Piece(), False, None

    async def watch_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        group.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(watch_disconnect)
            try:
                async for piece in call.served.pieces:
                    texts.append(piece.text)
                    last = _merge(last, piece)
                finished = True
            except BackendError as exc:  # raised out here, not as a task group's ExceptionGroup
                error = exc
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await call.served.pieces.aclose()
    if error is not None:
        raise error
    return (texts, last) if finished else None


def _merge(last: Piece, piece: Piece) -> Piece:
    """What is known so far about the end of an answer: its finish reason and usage."""
    return Piece("", piece.finish_reason or last.finish_reason, piece.usage or last.usage)


async def _drain(call: Call, request: Request) -> tuple[list[str], Piece]:
    texts, last = [], Piece()
    try:
        async for piece in call.served.pieces:  # already received: this does not wait
            texts.append(piece.text)
            last = _merge(last, piece)
    finally:
        await call.served.pieces.aclose()  # lets the upstream connection go back to its pool
    return texts, last


async def _whole(call: Call, shape: Shape, request: Request) -> Response:
    try:
        # An answer that came whole (a non-streamed remote) needs no disconnect watcher.
        collect = _drain if call.served.complete else _collect
        collected = await collect(call, request)
    except BackendError as exc:
        call.done(exc.status)
        raise backend_error(exc) from None
    if collected is None:
        call.done(_CLIENT_CLOSED)
        return Response(status_code=_CLIENT_CLOSED)  # nobody is left to read it
    texts, last = collected
    text = "".join(texts)
    usage = call.usage_or_estimate(last.usage, text)
    call.done(200, usage)
    body = shape.whole(text, last.finish_reason or "stop", usage)
    return Response(body, media_type="application/json")


async def _stream(call: Call, shape: Shape, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE pieces as they come; a disconnect cancels this generator, which aborts upstream."""
    status, texts, last = _CLIENT_CLOSED, [], Piece()
    try:
        if (opening := shape.opening()) is not None:
            yield opening
        async for piece in call.served.pieces:
            if piece.text:
                texts.append(piece.text)
                yield shape.delta(piece.text)
            last = _merge(last, piece)
        yield shape.finish(last.finish_reason or "stop")
        if include_usage:
            yield shape.usage(call.usage_or_estimate(last.usage, "".join(texts)))
        status = 200
        yield sse("[DONE]")
    except BackendError as exc:  # headers are gone already: the error travels in the stream
        status = exc.status
        yield sse(json.dumps(error_response_body(exc.status, exc.message)))
        yield sse("[DONE]")
    finally:
        # Starlette cancels this task on disconnect; shield so the abort itself can run.
        with anyio.CancelScope(shield=True):
            await call.served.pieces.aclose()
        call.done(status, call.usage_or_estimate(last.usage, "".join(texts)))


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body iterator and the upstream answer however the response ends.

    On a disconnect Starlette cancels the sending task; if that happens while the body
    waits at a `yield`, the generator would be left to the garbage collector and the
    engine would keep generating. A body that never started cannot run its own cleanup,
    so the upstream answer (`upstream`) is closed here too.
    """

    def __init__(self, content: AsyncIterator[bytes], upstream: AsyncIterator[Piece]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self._upstream.aclose()  # a no-op when the body already closed it


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: State) -> Response:
    return await _complete(request, state, ChatCompletionRequest, ChatShape)


@router.post("/v1/completions")
async def completions(request: Request, state: State) -> Response:
    return await _complete(request, state, CompletionRequest, TextShape)


@router.get("/v1/models")
async def list_models(request: Request, state: State) -> dict:
    runtime = state.runtime
    authenticate(request, runtime)
    policy = runtime.policy
    owners = {name: "tiergate-route" for name in policy.routes}
    owners |= {name: "tiergate-tier" for name in policy.tiers}
    cards = [
        ModelCard(id=name, owned_by=owners.get(name, "tiergate-deployment"))
        for name in runtime.router.model_names()
    ]
    return ModelList(data=cards).model_dump()


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: State) -> JSONResponse:
    dead = [name for name, e in state.engines.all().items() if not _alive(e)]
    if dead:
        return JSONResponse({"status": "unavailable", "dead_engines": dead}, status_code=503)
    return JSONResponse({"status": "ready"})


def _alive(engine: object) -> bool:
    # A test double that cannot tell counts as alive; a dead engine raises EngineDeadError.
    return bool(getattr(engine, "is_running", True))
