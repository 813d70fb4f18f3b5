"""Writing an answer back: whole (JSON) or streamed (SSE), from any `Served` source.

A deployment's answer and a cache hit are both a `Served` with pieces, so shaping,
streaming and the per-call record are one code path. The `Call` record sees every piece;
when an answer completes it hands the whole answer (text, a remote's tool calls and
refusal) to the after-response hooks (the cache stores it there), and whatever the
outcome it counts the request in the stats.
"""

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import Response

from engine.entrypoints.openai.error_bodies import error_response_body
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import Usage
from engine.entrypoints.openai.shapes import Ended, Shape
from engine.entrypoints.openai.tool_calls import ToolCallDelta, merge_deltas
from engine.entrypoints.streaming import (
    CLIENT_CLOSED_REQUEST,
    ClosingStreamingResponse,
    sse,
    unless_disconnected,
)
from engine.outputs import TokenLogprobs
from gateway.backends.base import BackendError, Piece
from gateway.backends.fallback import Served
from gateway.limits import NOT_LIMITED, Admission
from gateway.policy import PricingSettings
from gateway.pricing import spend_usd
from gateway.stats.counters import Stats

_CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Answer:
    """A complete, successful answer: what after-response hooks receive."""

    text: str
    finish_reason: str
    usage: Usage
    tool_calls: list[dict[str, Any]] | None = None  # a remote's structured calls, whole
    refusal: str | None = None


AfterHook = Callable[[Answer], None]


@dataclass(frozen=True)
class Payer:
    """Whom a request's spend is counted to, and how the policy prices it."""

    tenant: str = "-"
    key: str = "-"  # the key's label (a name, a managed key's id or a hash prefix)
    pricing: PricingSettings = field(default_factory=PricingSettings)


@dataclass
class Call:
    """One request's bookkeeping, from the first piece to the last byte."""

    stats: Stats
    served: Served
    route: str
    approx_prompt_tokens: int
    started: float
    # the request's share of its rate limits; NOT_LIMITED is shared and never changed
    admission: Admission = field(default_factory=lambda: NOT_LIMITED)
    cached: bool = False  # answered from the semantic cache: no tier was paid
    after: list[AfterHook] = field(default_factory=list)
    payer: "Payer" = field(default_factory=lambda: Payer())

    def usage_or_estimate(self, usage: Usage | None, text: str) -> Usage:
        # A remote that reports no usage still gets counted (roughly) rather than for free.
        if usage is not None:
            return usage
        return Usage.of(self.approx_prompt_tokens, -(-len(text) // _CHARS_PER_TOKEN))

    async def done(self, status: int, usage: Usage | None = None) -> None:
        served, payer, cost = self.served, self.payer, 0.0
        if usage is not None:
            cost = spend_usd(usage, served.price, payer.pricing, self.cached)
            if not self.cached:
                self.stats.usage(served.tier, served.model, usage, served.price, cost)
            self.stats.spent(payer.tenant, payer.key, self.route, cost)
        self.stats.latency(served.tier, time.perf_counter() - self.started)
        self.stats.request_done(self.route, served.tier, served.model, status)
        # Token limits count what a tier generated: a cache hit generated nothing.
        tokens = 0 if self.cached else usage.total_tokens if usage is not None else None
        await self.admission.finish(tokens, cost)

    async def completed(self, answer: "Gathered") -> Usage:
        """The answer ended well: count it and hand it to the hooks (choice 0's text: the
        cache, the only hook, never takes requests for more than one choice)."""
        first = answer.ended()[0]
        usage = self.usage_or_estimate(answer.usage, answer.all_text())
        await self.done(200, usage)
        for hook in self.after:
            hook(Answer(first.text, first.reason, usage, first.tool_calls, first.refusal))
        return usage


def backend_error(exc: BackendError) -> OpenAIError:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    return OpenAIError(exc.status, exc.message, code=exc.code, param=exc.param, headers=headers)


@dataclass
class Gathered:
    """An answer's pieces so far, per choice: text, finish reason, logprobs, the structure
    (tool-call deltas, refusal, reasoning); the usage."""

    texts: dict[int, list[str]] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    calls: dict[int, list[ToolCallDelta]] = field(default_factory=dict)
    refusals: dict[int, list[str]] = field(default_factory=dict)
    reasonings: dict[int, list[str]] = field(default_factory=dict)
    usage: Usage | None = None

    def add(self, piece: Piece) -> None:
        self.texts.setdefault(piece.index, []).append(piece.text)
        if piece.logprobs is not None:  # asked for: kept even when empty
            self.logprobs.setdefault(piece.index, []).extend(piece.logprobs)
        if piece.tool_calls:
            self.calls.setdefault(piece.index, []).extend(piece.tool_calls)
        if piece.refusal:
            self.refusals.setdefault(piece.index, []).append(piece.refusal)
        if piece.reasoning:
            self.reasonings.setdefault(piece.index, []).append(piece.reasoning)
        if piece.finish_reason is not None:
            self.reasons[piece.index] = piece.finish_reason
        self.usage = piece.usage or self.usage

    def check_ended(self, model: str) -> None:
        """A choice that started and never got its finish reason was cut (an upstream that
        answers fewer choices than asked is not: it is passed on as it is)."""
        if self.texts.keys() - self.reasons.keys():
            raise BackendError(502, f"{model}: a choice of the answer was cut", False, False)

    def all_text(self) -> str:
        return "".join("".join(t) for t in self.texts.values())

    def ended(self) -> list[Ended]:
        """Every choice in index order (at least choice 0, for an answer with no text)."""
        indexes = sorted(self.texts.keys() | self.reasons.keys() | {0})
        return [
            Ended(
                "".join(self.texts.get(i, [])),
                self.reasons.get(i, "stop"),
                self.logprobs.get(i),
                merge_deltas(self.calls[i]) if i in self.calls else None,
                "".join(self.refusals[i]) if i in self.refusals else None,
                "".join(self.reasonings[i]) if i in self.reasonings else None,
            )
            for i in indexes
        ]


async def _collect(call: Call, request: Request) -> Gathered | None:
    """All pieces of a non-streamed answer; None (upstream aborted) if the client leaves."""
    answer, error = Gathered(), None

    async def read() -> None:
        nonlocal error
        try:
            async for piece in call.served.pieces:
                answer.add(piece)
        except BackendError as exc:  # raised out here, not as a task group's ExceptionGroup
            error = exc

    try:
        finished = await unless_disconnected(request, read)
    finally:
        with anyio.CancelScope(shield=True):
            await call.served.pieces.aclose()
    if error is not None:
        raise error
    return answer if finished else None


async def _drain(call: Call, request: Request) -> Gathered:
    answer = Gathered()
    try:
        async for piece in call.served.pieces:  # already received: this does not wait
            answer.add(piece)
    finally:
        await call.served.pieces.aclose()  # lets the upstream connection go back to its pool
    return answer


async def whole(call: Call, shape: Shape, request: Request) -> Response:
    try:
        # An answer that came whole (a non-streamed remote, a cache hit) needs no watcher.
        collect = _drain if call.served.complete else _collect
        answer = await collect(call, request)
        if answer is not None:
            answer.check_ended(call.served.model)
    except BackendError as exc:
        await call.done(exc.status)
        raise backend_error(exc) from None
    if answer is None:
        await call.done(CLIENT_CLOSED_REQUEST)
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is left to read it
    usage = await call.completed(answer)
    return Response(shape.whole(answer.ended(), usage), media_type="application/json")


async def _stream(call: Call, shape: Shape, include_usage: bool, n: int) -> AsyncIterator[bytes]:
    """SSE pieces as they come; a disconnect cancels this generator, which aborts upstream."""
    status, answer = CLIENT_CLOSED_REQUEST, Gathered()
    try:
        if (opening := shape.opening(n)) is not None:
            yield opening
        async for piece in call.served.pieces:
            answer.add(piece)
            if piece.says:
                yield shape.delta(
                    piece.text,
                    piece.logprobs,
                    piece.index,
                    tool_calls=piece.tool_calls,
                    refusal=piece.refusal,
                    reasoning=piece.reasoning,
                )
            if piece.finish_reason is not None:
                yield shape.finish(piece.finish_reason, piece.index)
        answer.check_ended(call.served.model)
        if include_usage:
            yield shape.usage(call.usage_or_estimate(answer.usage, answer.all_text()))
        status = 200
        yield sse("[DONE]")
    except BackendError as exc:  # headers are gone already: the error travels in the stream
        status = exc.status
        yield sse(error_response_body(exc.status, exc.message))
        yield sse("[DONE]")
    finally:
        # Starlette cancels this task on disconnect; shield so the abort itself can run.
        with anyio.CancelScope(shield=True):
            await call.served.pieces.aclose()
            if status == 200:  # only an answer the client received whole is complete
                await call.completed(answer)
            else:
                await call.done(status, call.usage_or_estimate(answer.usage, answer.all_text()))


def streamed(call: Call, shape: Shape, include_usage: bool, n: int = 1) -> Response:
    body = _stream(call, shape, include_usage, n)
    return ClosingStreamingResponse(body, call.served.pieces)
