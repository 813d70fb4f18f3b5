"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions, /v1/models.

One flow for both completion endpoints, one request context through it:
authenticate -> parse -> features -> cache lookup -> route -> open -> respond -> after-
response hooks (the cache stores the whole answer there). A cache hit is a served answer
like any deployment's, so shaping and streaming are one code path (`respond.py`). The body
is validated by hand with the engine's protocol models so a bad body is OpenAI's 400,
never FastAPI's 422.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from engine.entrypoints.openai.shapes import ChatShape, Shape, TextShape
from engine.entrypoints.streaming import CLIENT_CLOSED_REQUEST, unless_disconnected
from engine.sampling_params import SamplingParams
from gateway.api.cache_step import CacheControl, CacheStep, matched_text, scope_of
from gateway.api.deps import (
    State,
    admit,
    authenticate,
    check_model_allowed,
    drain_of,
    key_terms,
    parse_body,
)
from gateway.api.embeddings import embedding_model_cards
from gateway.api.respond import Call, Payer, backend_error, streamed, whole
from gateway.backends.base import (
    INTERACTIVE,
    BackendError,
    GenerationRequest,
    OpenAIRequest,
)
from gateway.backends.fallback import Served
from gateway.cache.semantic import CacheQuery
from gateway.embedding.shared import embed_once
from gateway.limits import NOT_LIMITED, Admission
from gateway.pricing import batch_price
from gateway.routing.features import PromptFeatures, extract_features
from gateway.routing.router import Embed, RoutingInput
from gateway.state import GatewayState, Runtime

router = APIRouter()
EXPLAIN_HEADER = "x-tiergate-explain"  # "1": the answer carries the routing decision
_TEMPLATE_TOKENS = 64  # what a chat template adds to the messages' text, at most, usually


def _features(body: OpenAIRequest) -> PromptFeatures:
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return extract_features(messages, None)
    prompt = body.prompt if isinstance(body.prompt, str) else None
    return extract_features(None, prompt)


@dataclass
class RequestContext:
    """What one request carries from authentication to its last after-response hook."""

    request: Request
    state: GatewayState
    runtime: Runtime  # one policy for the whole request, even across a reload
    tenant: str
    body: OpenAIRequest
    features: PromptFeatures
    admission: Admission = field(default_factory=lambda: NOT_LIMITED)
    started: float = field(default_factory=time.perf_counter)
    cache: CacheStep | None = None
    # The request's one embedding (of the last user message), shared by cache and router.
    embed: Embed | None = None

    @property
    def route(self) -> str:
        return self.body.model if self.body.model in self.runtime.policy.routes else "-"

    def payer(self) -> Payer:
        terms = key_terms(self.request)
        key = terms.label if terms is not None else "-"
        return Payer(self.tenant, key, self.runtime.policy.pricing)

    def mark(self, **values: str) -> None:
        """Response headers' values (tier, model, cache), written when the answer starts."""
        for key, value in values.items():
            setattr(self.request.state, key, value)


def _not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist. GET /v1/models lists the names served.",
        param="model",
        code="model_not_found",
    )


def _completion_budget(body: OpenAIRequest) -> int:
    """The most the answer may generate, reserved under tokens_per_minute until it ends:
    max_tokens (unset: the engine's default) for each answer generated (n, or best_of)."""
    most = getattr(body, "max_completion_tokens", None) or body.max_tokens
    return (most or SamplingParams.max_tokens) * body.candidates()


def _cache_step(ctx: RequestContext) -> CacheStep | None:
    """The request's use of the cache, or None (header `off` or `bypass` says why)."""
    cache, policy = ctx.state.cache, ctx.runtime.policy
    if cache is None:
        return None
    settings = policy.cache.for_route(policy.routes.get(ctx.route))
    if not settings.enabled:
        return None
    ctx.mark(cache="bypass")
    text = matched_text(ctx.body)
    temperature = 1.0 if ctx.body.temperature is None else ctx.body.temperature
    control = CacheControl.from_headers(ctx.request.headers)
    if text is None or temperature > policy.cache.max_temperature:
        return None
    if ctx.body.candidates() > 1:  # one cached answer is neither n choices nor best_of
        return None
    if control.no_cache and control.no_store:
        return None
    max_tokens = getattr(ctx.body, "max_completion_tokens", None) or ctx.body.max_tokens
    headers = ctx.runtime.router.answer_headers(_routing_input(ctx))
    scope = scope_of(ctx.tenant, ctx.body, headers)
    query = CacheQuery(scope, ctx.tenant, ctx.route, text, max_tokens, temperature)
    return CacheStep(cache, policy, settings, query, control, ctx.embed)


async def _from_cache(ctx: RequestContext) -> Call | None:
    step = ctx.cache
    if step is None:
        return None
    lookup = await step.lookup()
    ctx.state.stats.cache_lookup(ctx.route, ctx.tenant, lookup.outcome, lookup.refused)
    hit = lookup.outcome in ("exact", "semantic") and lookup.answer is not None
    ctx.mark(cache="hit" if hit else lookup.outcome if lookup.outcome == "bypass" else "miss")
    if not hit:
        return None
    if lookup.similarity is not None:
        ctx.mark(similarity=f"{lookup.similarity:.4f}")
    if lookup.entry_id is not None:
        ctx.mark(cache_entry=lookup.entry_id)
    stats, tokens = ctx.state.stats, ctx.features.approx_tokens
    served = step.served(tokens)
    ctx.mark(tier=served.tier, model=served.model)
    answer = lookup.answer
    avoided = Usage.of(answer.prompt_tokens, answer.completion_tokens)
    ctx.state.stats.cache_saved(ctx.route, served.tier, served.model, avoided, served.price)
    call = Call(stats, served, ctx.route, tokens, ctx.started, ctx.admission, cached=True)
    call.payer = ctx.payer()
    return call


def _routing_input(ctx: RequestContext) -> RoutingInput:
    body = ctx.body
    return RoutingInput(
        model=body.model,
        features=ctx.features,
        embed=ctx.embed,
        headers=ctx.request.headers,
        tenant=ctx.tenant,
        key_digest=getattr(ctx.request.state, "key_digest", None),
        max_tokens=getattr(body, "max_completion_tokens", None) or body.max_tokens,
        tools=bool(getattr(body, "tools", None)),
    )


async def _open(ctx: RequestContext) -> Served:
    """Route the request and find a deployment that starts answering it."""
    decision = await ctx.runtime.router.decide(_routing_input(ctx))
    if decision is None:
        raise _not_found(ctx.body.model)
    ctx.mark(tier=decision.tier)
    if ctx.request.headers.get(EXPLAIN_HEADER) == "1":
        ctx.mark(explain=json.dumps(decision.explain(), separators=(",", ":")))
    ctx.state.stats.routed(decision)
    priority = getattr(ctx.request.state, "priority", INTERACTIVE)  # batch lines set it
    generation = GenerationRequest(ctx.request.state.request_id, ctx.body, ctx.tenant, priority)
    try:
        served: Served = await ctx.runtime.chain.open(
            generation, decision.tier, decision.deployment
        )
    except BackendError as exc:
        raise backend_error(exc) from None
    ctx.mark(tier=served.tier, model=served.model)
    if priority != INTERACTIVE:  # a batch line's tokens are priced at the batch discount
        served.price = batch_price(served.price, ctx.runtime.policy.batch)
    if decision.deployment is None and served.tier != decision.tier:
        ctx.state.stats.fallback(decision.tier, served.tier)
    return served


async def _from_tier(ctx: RequestContext) -> Call:
    drain = drain_of(ctx.request)
    served = await drain.opening(_open(ctx))
    served.pieces = drain.pieces(served.pieces)  # ends with an error if a shutdown expires
    ctx.state.stats.first_token(served.tier, time.perf_counter() - ctx.started)
    stats, tokens = ctx.state.stats, ctx.features.approx_tokens
    call = Call(stats, served, ctx.route, tokens, ctx.started, ctx.admission)
    call.payer = ctx.payer()
    if ctx.cache is not None and not ctx.cache.control.no_store:
        call.after.append(ctx.cache.store_hook(served.tier, served.model, ctx.state.background))
    return call


async def _answered(ctx: RequestContext) -> Call | None:
    """The cache's answer or a tier's first piece; None if the client leaves first.

    Uvicorn does not cancel a handler whose client left, so the cache lookup, routing, the
    retries and the wait in an engine's queue for the first token are cancelled here: the
    upstream request is aborted (an engine frees its pages) and the caller frees the slot.
    """
    call: Call | None = None
    error: Exception | None = None

    async def open_call() -> None:
        nonlocal call, error
        try:
            call = await _from_cache(ctx) or await _from_tier(ctx)
        except Exception as exc:  # raised out here, not as a task group's ExceptionGroup
            error = exc

    finished = await unless_disconnected(ctx.request, open_call)
    if error is not None:
        raise error
    return call if finished else None


ShapeOf = Callable[[str, OpenAIRequest], Shape]


async def _complete(
    request: Request, state: GatewayState, model: type[OpenAIRequest], shape_of: ShapeOf
) -> Response:
    runtime = state.runtime
    try:
        tenant = await authenticate(request, runtime)
        body = await parse_body(request, model)
    except OpenAIError as exc:
        state.stats.request_done("-", "-", "-", exc.status)
        raise
    return await serve(request, state, tenant, body, shape_of)


async def serve(
    request: Request, state: GatewayState, tenant: str, body: OpenAIRequest, shape_of: ShapeOf
) -> Response:
    """An authenticated, parsed request through the pipeline: limits, cache, router, tier.
    The translating surfaces (/v1/responses, /v1/messages) hand their chat body in here."""
    runtime = state.runtime
    ctx: RequestContext | None = None
    try:
        asked = body.model if body.model in runtime.policy.routes else "-"
        state.stats.tenant_request(asked, tenant)
        if body.model not in runtime.router.model_names():  # before the cache can answer
            raise _not_found(body.model)
        check_model_allowed(request, body.model)
        ctx = RequestContext(request, state, runtime, tenant, body, _features(body))
        ctx.embed = embed_once(state.embedder.current, ctx.features.last_user_text)
        tokens = ctx.features.approx_tokens
        most = _completion_budget(body)
        bound = ctx.features.chars + _TEMPLATE_TOKENS  # a token per character at most, nearly
        ctx.admission = await admit(request, runtime, tenant, tokens, most, bound)
        ctx.cache = _cache_step(ctx)
        call = await _answered(ctx)
    except OpenAIError as exc:  # refused before any answer: counted under the tier, if any
        route = ctx.route if ctx is not None else "-"
        state.stats.request_done(route, getattr(request.state, "tier", "-"), "-", exc.status)
        if ctx is not None:
            await ctx.admission.finish()
        raise
    except BaseException:  # a bug or a cancellation must not keep the request's slot
        if ctx is not None:
            with anyio.CancelScope(shield=True):
                await ctx.admission.finish()
        raise
    if call is None:  # the client left before the answer started: nobody is left to read
        tier = getattr(request.state, "tier", "-")
        state.stats.request_done(ctx.route, tier, "-", CLIENT_CLOSED_REQUEST)
        await ctx.admission.finish()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    shape = shape_of(call.served.model, ctx.body)
    if ctx.body.stream:
        return streamed(call, shape, ctx.body.include_usage, ctx.body.n or 1)
    return await whole(call, shape, request)


def chat_shape(model: str, body: OpenAIRequest) -> Shape:
    return ChatShape(model, body.callable_tools())  # tool calls parsed out of the answer


def text_shape(model: str, body: OpenAIRequest) -> Shape:
    return TextShape(model)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: State) -> Response:
    return await _complete(request, state, ChatCompletionRequest, chat_shape)


@router.post("/v1/completions")
async def completions(request: Request, state: State) -> Response:
    return await _complete(request, state, CompletionRequest, text_shape)


@router.get("/v1/models")
async def list_models(request: Request, state: State) -> dict:
    runtime = state.runtime
    await authenticate(request, runtime)
    policy = runtime.policy
    owners = {name: "tiergate-route" for name in policy.routes}
    owners |= {name: "tiergate-tier" for name in policy.tiers}
    cards = [
        ModelCard(id=name, owned_by=owners.get(name, "tiergate-deployment"))
        for name in runtime.router.model_names()
    ]
    terms = key_terms(request)
    allowed = terms.allowed_models if terms is not None else None
    cards = [c for c in cards + embedding_model_cards() if allowed is None or c.id in allowed]
    return ModelList(data=cards).model_dump()
