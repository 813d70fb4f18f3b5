"""The engine server's requests over HTTP: starting a request's choices (admission errors
become HTTP statuses before any byte is sent; a client gone meanwhile aborts them), running
them to their end unless the client leaves, and streaming them as server-sent events."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from engine.engine import AsyncEngine
from engine.entrypoints.choices import (
    Child,
    choice_params,
    close_all,
    drain,
    interleave,
    start_children,
    usage_of,
)
from engine.entrypoints.openai.best_of import candidate_params
from engine.entrypoints.openai.errors import OpenAIError, engine_error
from engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    to_sampling_params,
)
from engine.entrypoints.streaming import ClosingStreamingResponse, sse, unless_disconnected
from engine.errors import EngineError
from engine.outputs import RequestOutput


async def start_outputs(
    engine: AsyncEngine,
    prompt: str | list[int] | list[str],  # a one-string list is unwrapped by validation
    request_id: str,
    body: ChatCompletionRequest | CompletionRequest,
    index: int = 0,
) -> Child:
    """Submit a request (choice or `best_of` candidate `index` of it) and wait for its
    first output.

    The engine raises admission errors (too long, queue full, dead) before its first
    yield; pulling that output here turns them into HTTP statuses before any byte is sent.
    """
    # Without max_tokens the answer may run to the end of the context, as in vLLM and
    # OpenAI (the engine caps it at the room the prompt leaves).
    params = to_sampling_params(body, default_max_tokens=engine.max_model_len)
    params = candidate_params(params, body)
    if index:
        request_id, params = f"{request_id}-{index}", choice_params(params, index)
    prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    outputs = engine.generate(prompt, params, request_id, cache_salt=body.cache_salt)
    try:
        return await anext(outputs), outputs
    except (EngineError, ValueError) as exc:  # ValueError: the engine refused the prompt
        raise engine_error(exc, prompt_param) from exc
    except StopAsyncIteration:
        raise OpenAIError(500, "The engine ended the request without output.") from None


async def start_choices(
    engine: AsyncEngine,
    prompt: str | list[int] | list[str],
    request_id: str,
    body: ChatCompletionRequest | CompletionRequest,
) -> list[Child]:
    return await start_children(
        lambda index: start_outputs(engine, prompt, request_id, body, index), body.candidates()
    )


async def started(
    request: Request, start: Callable[[], Awaitable[list[Child]]]
) -> list[Child] | None:
    """`start()`'s choices, or None if the client leaves before their first outputs.

    Templating and the wait in the engine's queue are watched too, as vLLM does: a client
    gone before its first token aborts the request rather than leaving it queued.
    """
    children: list[Child] | None = None
    failure: Exception | None = None

    async def run() -> None:
        nonlocal children, failure
        try:
            children = await start()
        except Exception as exc:  # raised out here, not as a task group's ExceptionGroup
            failure = exc

    finished = await unless_disconnected(request, run)
    if failure is not None:
        raise failure
    return children if finished else None


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


async def sse_events(
    children: list[Child],
    render: Callable[[int, RequestOutput], BaseModel | list[BaseModel] | None],
    usage_event: Callable[[list[RequestOutput]], BaseModel] | None,
    continuous_usage: bool = False,
) -> AsyncIterator[bytes]:
    """A stream's SSE events: those of each engine output of any choice (one, or several
    for an output that closes tool calls), then usage if asked, then [DONE]. With
    `continuous_usage` (vLLM's `continuous_usage_stats`) each event carries its choice's
    usage so far: what a gateway needs to resume the stream elsewhere if this server dies."""
    lasts = [first for first, _ in children]
    items = interleave(children)
    try:
        async for index, out in items:
            lasts[index] = out
            event = render(index, out)
            for one in event if isinstance(event, list) else [event] if event else []:
                if continuous_usage:
                    one.usage = usage_of([out])
                yield sse(one)
        if usage_event is not None:
            yield sse(usage_event(lasts))
        yield sse("[DONE]")
    except EngineError as exc:
        # Headers are gone; the error travels in-band, as vLLM and OpenAI do.
        yield sse(engine_error(exc).body())
    finally:
        with anyio.CancelScope(shield=True):
            await items.aclose()
        await close_all(children)


def event_stream(events: AsyncIterator[bytes], children: list[Child]) -> Response:
    # The children too: a stream cancelled before its first byte never runs its cleanup.
    return ClosingStreamingResponse(events, *(outputs for _, outputs in children))


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")
