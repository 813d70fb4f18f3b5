"""The requests a gateway benchmark sends (bench/gateway_overhead.py): the targets, the
questions (one fixed, a new one each request, or people's rewordings of stored questions),
one request, latencies at concurrency 1 and throughput at concurrency N."""

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from bench.servers import tree_cpu_seconds
from training.artifacts import REAL_PAIRS

KEY = "sk-bench-0123456789"  # the same bearer key for both gateways
MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]


@dataclass
class Target:
    name: str
    url: str  # base URL ending in /v1
    model: str
    pid: int | None  # the server process whose CPU time is counted (None: not a gateway)
    questions: Iterator[str] | None = None  # one per request; None: always MESSAGES


def unique_questions() -> Iterator[str]:
    """A new question each request: every one a cache miss (a number veto decides any
    neighbour, so the verifier's model is rarely asked)."""
    for n in itertools.count():
        parity = "odd" if n % 2 else "even"
        yield f"Question {n}: what is {n} times {n + 7}, and why is it {parity}?"


def body(target: Target, stream: bool) -> dict[str, Any]:
    messages = MESSAGES
    if target.questions is not None:
        messages = [{"role": "user", "content": next(target.questions)}]
    req: dict[str, Any] = {"model": target.model, "messages": messages, "max_tokens": 32}
    if stream:
        req["stream"] = True
    return req


async def one_request(session: aiohttp.ClientSession, target: Target, stream: bool) -> float:
    """Seconds to the full answer (last byte of the stream); raises on a non-200."""
    start = time.perf_counter()
    async with session.post(f"{target.url}/chat/completions", json=body(target, stream)) as r:
        data = await r.read()
        if r.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {r.status}: {data[:300]!r}")
        if stream and b"[DONE]" not in data:
            raise RuntimeError(f"{target.name}: stream ended without [DONE]")
    return time.perf_counter() - start


def new_session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    headers = {"Authorization": f"Bearer {KEY}"}
    timeout = aiohttp.ClientTimeout(total=60)
    return aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)


async def latencies_interleaved(
    targets: list[Target], count: int, stream: bool
) -> dict[str, list[float]]:
    """Concurrency 1, targets taken in turn: drift on the shared machine hits all alike."""
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    async with new_session(1) as session:
        for t in targets:  # warm the connection and the gateway's first-call paths
            for _ in range(5):
                await one_request(session, t, stream)
        for _ in range(count):
            for t in targets:
                out[t.name].append(await one_request(session, t, stream))
    return out


async def send(
    session: aiohttp.ClientSession, target: Target, count: int, concurrency: int
) -> None:
    """`count` requests, `concurrency` in flight."""
    queue = iter(range(count))

    async def worker() -> None:
        for _ in queue:
            await one_request(session, target, stream=False)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def throughput(target: Target, count: int, concurrency: int) -> dict[str, float]:
    """Requests/s with `concurrency` clients in flight, and the server's CPU per request."""
    async with new_session(concurrency) as session:
        await asyncio.gather(*(one_request(session, target, False) for _ in range(concurrency)))
        cpu0 = tree_cpu_seconds(target.pid) if target.pid else 0.0
        start = time.perf_counter()
        await send(session, target, count, concurrency)
        seconds = time.perf_counter() - start
        cpu = tree_cpu_seconds(target.pid) - cpu0 if target.pid else 0.0
    return {
        "requests": count,
        "seconds": round(seconds, 3),
        "requests_per_s": round(count / seconds, 1),
        "cpu_ms_per_request": round(cpu / count * 1000, 3) if target.pid else None,
    }


def reworded_pairs() -> tuple[list[str], list[str]]:
    """The train pairs' stored questions and, in the same order, the questions asked."""
    rows = [json.loads(line) for line in REAL_PAIRS.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["split"] == "train" and r["a"] != r["b"]]
    return [r["b"] for r in rows], [r["a"] for r in rows]


async def store_first(target: Target, questions: list[str], concurrency: int = 16) -> None:
    """Ask each question once, so the measured requests find them stored."""
    async with new_session(concurrency) as session:
        feed = replace(target, questions=iter(questions))
        await send(session, feed, len(questions), concurrency)
