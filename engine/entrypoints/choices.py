"""`n` choices of one request: one engine request each, run side by side.

The siblings share the prompt's KV pages through the prefix cache: they carry the same
prompt and salt, and a sibling admitted while the first one's prompt pages are still being
computed waits for them (the scheduler's `next_in_flight`), so the full pages are computed
once and counted as prefix-cache hits. A seeded request gives choice i the seed + i.
"""

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import anyio

from engine.entrypoints.openai.protocol import Usage
from engine.errors import EngineError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

Outputs = AsyncGenerator[RequestOutput, None]
Child = tuple[RequestOutput, Outputs]  # a choice's first output and the rest of its stream


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s settings: a seeded request's choices differ, yet the whole answer
    repeats."""
    if index and params.seed is not None:
        return dataclasses.replace(params, seed=params.seed + index)
    return params


async def close_outputs(outputs: Outputs) -> None:
    # Closing the engine's generator aborts the request and frees its KV pages at once.
    # Shielded: this often runs inside a task that a client disconnect is cancelling.
    with anyio.CancelScope(shield=True):
        await outputs.aclose()


async def close_all(children: list[Child]) -> None:
    for _, outputs in children:
        await close_outputs(outputs)


async def start_children(start: Callable[[int], Awaitable[Child]], n: int) -> list[Child]:
    """Start choices 0..n-1 (each raises its admission error); all or none."""
    children: list[Child] = []
    try:
        for index in range(n):
            children.append(await start(index))
    except BaseException:
        await close_all(children)
        raise
    return children


async def interleave(children: list[Child]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Every choice's outputs as they come, tagged with its index; the first outputs first."""
    for index, (first, _) in enumerate(children):
        yield index, first
    if len(children) == 1:  # no tasks needed for the common case
        first, outputs = children[0]
        if not first.finished:
            async for out in outputs:
                yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, outputs: Outputs) -> None:
        try:
            async for out in outputs:
                await queue.put((index, out))
        except EngineError as exc:
            await queue.put((index, exc))
        await queue.put((index, None))

    live = [i for i, (first, _) in enumerate(children) if not first.finished]
    tasks = [asyncio.create_task(pump(i, children[i][1])) for i in live]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)


async def drain(first: RequestOutput, outputs: Outputs) -> RequestOutput:
    """A choice run to its end; the returned output holds the whole text and logprobs."""
    texts, last = [first.text], first
    logprobs = list(first.logprobs or [])
    if not first.finished:
        async for out in outputs:
            texts.append(out.text)
            logprobs.extend(out.logprobs or [])
            last = out
    whole_logprobs = logprobs if first.logprobs is not None else None
    return dataclasses.replace(last, text="".join(texts), logprobs=whole_logprobs)


def usage_of(outs: list[RequestOutput]) -> Usage:
    """The prompt once (the choices share it), the completions summed."""
    completion = sum(out.completion_tokens for out in outs)
    return Usage.of(outs[0].prompt_tokens, completion, outs[0].cached_tokens)
