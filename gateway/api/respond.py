"""Writing an answer back: whole (JSON) or streamed (SSE), from any `Served` source.

A deployment's answer and a cache hit are both a `Served` with pieces, so shaping,
streaming and the per-call record are one code path. The `Call` record sees every piece;
when an answer completes it hands the whole text to the after-response hooks (the cache
stores it there), and whatever the outcome it counts the request in the stats.
"""

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
from fastapi import Request
from fastapi.responses import Response

from engine.entrypoints.openai_errors import OpenAIError
from engine.entrypoints.shapes import Shape
from engine.entrypoints.streaming import (
    CLIENT_CLOSED_REQUEST,
    ClosingStreamingResponse,
    sse,
    unless_disconnected,
)
from engine.protocol import Usage, error_response_body
from gateway.backends.base import BackendError, Piece
from gateway.backends.fallback import Served
from gateway.limits import NOT_LIMITED, Admission
from gateway.stats import Stats

_CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Answer:
    """A complete, successful answer: what after-response hooks receive."""

    text: str
    finish_reason: str
    usage: Usage


AfterHook = Callable[[Answer], None]


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

    def usage_or_estimate(self, usage: Usage | None, text: str) -> Usage:
        # A remote that reports no usage still gets counted (roughly) rather than for free.
        if usage is not None:
            return usage
        return Usage.of(self.approx_prompt_tokens, -(-len(text) // _CHARS_PER_TOKEN))

    async def done(self, status: int, usage: Usage | None = None) -> None:
        served = self.served
        if usage is not None and not self.cached:
            self.stats.usage(served.tier, served.model, usage, served.price)
        self.stats.latency(served.tier, time.perf_counter() - self.started)
        self.stats.request_done(self.route, served.tier, served.model, status)
        # Token limits count what a tier generated: a cache hit generated nothing.
        tokens = 0 if self.cached else usage.total_tokens if usage is not None else None
        await self.admission.finish(tokens)

    async def completed(self, text: str, last: Piece) -> Usage:
        """The answer ended well: count it and hand it to the hooks."""
        usage = self.usage_or_estimate(last.usage, text)
        await self.done(200, usage)
        answer = Answer(text, last.finish_reason or "stop", usage)
        for hook in self.after:
            hook(answer)
        return usage


def backend_error(exc: BackendError) -> OpenAIError:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    return OpenAIError(exc.status, exc.message, code=exc.code, param=exc.param, headers=headers)


def _merge(last: Piece, piece: Piece) -> Piece:
    """What is known so far about an answer's end (finish reason, usage) and its logprobs."""
    logprobs = last.logprobs
    if piece.logprobs:
        logprobs = [*(logprobs or []), *piece.logprobs]
    reason = piece.finish_reason or last.finish_reason
    return Piece("", reason, piece.usage or last.usage, logprobs)


async def _collect(call: Call, request: Request) -> tuple[list[str], Piece] | None:
    """All pieces of a non-streamed answer; None (upstream aborted) if the client leaves."""
    texts: list[str] = []
    last, error = Piece(), None

    async def read() -> None:
        nonlocal last, error
        try:
            async for piece in call.served.pieces:
                texts.append(piece.text)
                last = _merge(last, piece)
        except BackendError as exc:  # raised out here, not as a task group's ExceptionGroup
            error = exc

    try:
        finished = await unless_disconnected(request, read)
    finally:
        with anyio.CancelScope(shield=True):
            await call.served.pieces.aclose()
    if error is not None:
        raise error
    return (texts, last) if finished else None


async def _drain(call: Call, request: Request) -> tuple[list[str], Piece]:
    texts, last = [], Piece()
    try:
        async for piece in call.served.pieces:  # already received: this does not wait
            texts.append(piece.text)
            last = _merge(last, piece)
    finally:
        await call.served.pieces.aclose()  # lets the upstream connection go back to its pool
    return texts, last


async def whole(call: Call, shape: Shape, request: Request) -> Response:
    try:
        # An answer that came whole (a non-streamed remote, a cache hit) needs no watcher.
        collect = _drain if call.served.complete else _collect
        collected = await collect(call, request)
    except BackendError as exc:
        await call.done(exc.status)
        raise backend_error(exc) from None
    if collected is None:
        await call.done(CLIENT_CLOSED_REQUEST)
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is left to read it
    texts, last = collected
    text = "".join(texts)
    usage = await call.completed(text, last)
    body = shape.whole(text, last.finish_reason or "stop", usage, last.logprobs)
    return Response(body, media_type="application/json")


async def _stream(call: Call, shape: Shape, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE pieces as they come; a disconnect cancels this generator, which aborts upstream."""
    status, texts, last = CLIENT_CLOSED_REQUEST, [], Piece()
    try:
        if (opening := shape.opening()) is not None:
            yield opening
        async for piece in call.served.pieces:
            if piece.text or piece.logprobs:
                texts.append(piece.text)
                yield shape.delta(piece.text, piece.logprobs)
            last = _merge(last, piece)
        yield shape.finish(last.finish_reason or "stop")
        if include_usage:
            yield shape.usage(call.usage_or_estimate(last.usage, "".join(texts)))
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
                await call.completed("".join(texts), last)
            else:
                await call.done(status, call.usage_or_estimate(last.usage, "".join(texts)))


def streamed(call: Call, shape: Shape, include_usage: bool) -> Response:
    return ClosingStreamingResponse(_stream(call, shape, include_usage), call.served.pieces)
