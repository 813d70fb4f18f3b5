"""A bounded load driver: the shared core of tests/test_load.py and bench/load.py.
(The engines' state at rest, read from /metrics, is tests/pool_state.py.)

It sends a seeded mix of chat requests to an OpenAI-compatible server (the gateway or
`tiergate engine` alone) at a fixed concurrency: whole and streamed answers through the
official `openai` client, streams and whole answers the client abandons midway and
invalid requests (bad bodies, unknown model, bad key) through raw httpx. Every answer is
checked: valid ones complete and well-formed, invalid ones an OpenAI error body with the
right status, nothing ever 5xx. Every valid request sets `ignore_eos`, so each yields
exactly `max_tokens` tokens and two servers given the same jobs do the same work.
"""

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

VALID = ("whole", "stream")
# Shares of the mix: mostly valid traffic, some abandoned, some invalid.
DEFAULT_MIX = {
    "whole": 0.40,
    "stream": 0.40,
    "cancel_stream": 0.07,
    "cancel_whole": 0.03,
    "bad_body": 0.04,
    "unknown_model": 0.03,
    "bad_key": 0.03,
}
EXPECTED_STATUS = {"bad_body": 400, "unknown_model": 404, "bad_key": 401}
BAD_BODIES: tuple[bytes, ...] = (
    b"{not json",
    b'{"model": "M"}',  # no messages
    b'{"model": "M", "messages": []}',
    b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
    b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
    b'{"model": "M", "messages": [{"role": "wizard", "content": "hi"}]}',
    b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "top_k": 9e99}',
)


@dataclass(frozen=True)
class Job:
    kind: str  # a key of DEFAULT_MIX
    question: str
    max_tokens: int
    cancel_after: int  # cancel_stream: pieces read before closing; cancel_whole: ms waited
    variant: int  # bad_body: which of BAD_BODIES


@dataclass(frozen=True)
class Target:
    base_url: str  # http://127.0.0.1:PORT
    model: str
    api_key: str
    metrics_key: str  # for /metrics


@dataclass
class Outcome:
    kind: str
    status: int | None  # None: the client left before any status (cancel_whole)
    seconds: float
    output_tokens: int = 0
    cancelled: bool = False  # the client really left before the end
    problem: str | None = None


@dataclass
class LoadRun:
    outcomes: list[Outcome]
    seconds: float

    @property
    def problems(self) -> list[str]:
        return [f"{o.kind}: {o.problem}" for o in self.outcomes if o.problem]

    def summary(self) -> dict[str, Any]:
        valid = [o for o in self.outcomes if o.kind in VALID and o.problem is None]
        latencies = sorted(o.seconds for o in valid)
        tokens = sum(o.output_tokens for o in valid)
        return {
            "requests": len(self.outcomes),
            "seconds": round(self.seconds, 2),
            "requests_per_s": round(len(self.outcomes) / self.seconds, 2),
            "valid_answered": len(valid),
            "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / self.seconds, 1),
            "latency_p50_s": round(_percentile(latencies, 50), 3),
            "latency_p99_s": round(_percentile(latencies, 99), 3),
            "kinds": dict(Counter(o.kind for o in self.outcomes)),
            "statuses": {str(k): v for k, v in Counter(o.status for o in self.outcomes).items()},
            "cancelled_midway": sum(o.cancelled for o in self.outcomes),
            "problems": len(self.problems),
        }


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def make_jobs(
    questions: Sequence[str],
    count: int,
    seed: int = 0,
    mix: dict[str, float] = DEFAULT_MIX,
    max_tokens: tuple[int, int] = (32, 64),
) -> list[Job]:
    """`count` jobs drawn with a fixed seed: the same list for every target of a run."""
    rng = random.Random(seed)
    kinds, weights = list(mix), list(mix.values())
    return [
        Job(
            kind=rng.choices(kinds, weights)[0],
            question=rng.choice(questions),
            max_tokens=rng.randint(*max_tokens),
            cancel_after=rng.randint(2, 6),
            variant=rng.randrange(len(BAD_BODIES)),
        )
        for _ in range(count)
    ]


def _messages(job: Job) -> list[dict[str, str]]:
    return [{"role": "user", "content": job.question}]


def _body(target: Target, job: Job, stream: bool) -> dict[str, Any]:
    return {
        "model": target.model,
        "messages": _messages(job),
        "max_tokens": job.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


class Clients:
    """One openai client and one raw httpx client, both pooled for `concurrency`."""

    def __init__(self, target: Target, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        timeout = httpx.Timeout(600, connect=30)
        self.target = target
        self.raw = httpx.AsyncClient(base_url=target.base_url, limits=limits, timeout=timeout)
        self.openai = openai.AsyncOpenAI(
            base_url=f"{target.base_url}/v1",
            api_key=target.api_key,
            max_retries=0,  # a retried 5xx or 429 would hide what the server did
            http_client=httpx.AsyncClient(limits=limits, timeout=timeout),
        )
        self.auth = {"Authorization": f"Bearer {target.api_key}"}

    async def aclose(self) -> None:
        await self.raw.aclose()
        await self.openai.close()


# ---------------------------------------------------------------- one job each


async def _whole(c: Clients, job: Job) -> Outcome:
    start = time.perf_counter()
    try:
        reply = await c.openai.chat.completions.create(
            model=c.target.model,
            messages=_messages(job),
            max_tokens=job.max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    except openai.APIStatusError as exc:
        return Outcome(job.kind, exc.status_code, time.perf_counter() - start, problem=str(exc))
    seconds = time.perf_counter() - start
    choice = reply.choices[0]
    tokens = reply.usage.completion_tokens if reply.usage else 0
    problem = None
    if not isinstance(choice.message.content, str) or choice.finish_reason != "length":
        problem = f"finish_reason {choice.finish_reason!r}, content {choice.message.content!r:.80}"
    elif tokens != job.max_tokens:
        problem = f"{tokens} completion tokens, asked for {job.max_tokens}"
    return Outcome(job.kind, 200, seconds, tokens, problem=problem)


async def _stream(c: Clients, job: Job) -> Outcome:
    """Streamed through the openai client's raw-response view, so [DONE] can be checked."""
    start = time.perf_counter()
    api = c.openai.chat.completions.with_streaming_response
    try:
        async with api.create(
            model=c.target.model,
            messages=_messages(job),
            max_tokens=job.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ) as response:
            lines = [line async for line in response.iter_lines()]
            datas = [line[5:].strip() for line in lines if line.startswith("data:")]
            status = response.status_code
    except openai.APIStatusError as exc:
        return Outcome(job.kind, exc.status_code, time.perf_counter() - start, problem=str(exc))
    seconds = time.perf_counter() - start
    tokens, problem = check_stream(datas, job.max_tokens)
    return Outcome(job.kind, status, seconds, tokens, problem=problem)


def check_stream(datas: list[str], max_tokens: int) -> tuple[int, str | None]:
    """(completion tokens, problem) of a whole SSE answer given its `data:` payloads."""
    if not datas or datas[-1] != "[DONE]":
        return 0, f"stream did not end with [DONE] (last: {datas[-1:]!r:.120})"
    reasons, tokens = [], 0
    for data in datas[:-1]:
        try:
            chunk = ChatCompletionChunk.model_validate_json(data)
        except ValueError:
            return 0, f"malformed piece {data!r:.120}"
        reasons += [ch.finish_reason for ch in chunk.choices if ch.finish_reason]
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if reasons != ["length"]:
        return tokens, f"finish reasons {reasons!r}, expected one 'length'"
    if tokens != max_tokens:
        return tokens, f"{tokens} completion tokens, asked for {max_tokens}"
    return tokens, None


async def _cancel_stream(c: Clients, job: Job) -> Outcome:
    """Read a few SSE pieces, then close the connection."""
    start = time.perf_counter()
    body = _body(c.target, job, stream=True)
    pieces, finished, problem = 0, False, None
    async with c.raw.stream("POST", "/v1/chat/completions", json=body, headers=c.auth) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            return Outcome(job.kind, r.status_code, time.perf_counter() - start, problem=text[:200])
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            finished = data == "[DONE]"
            if '"error"' in data:
                problem = f"error event {data[:200]}"
            pieces += 1
            if finished or pieces >= job.cancel_after:
                break
    seconds = time.perf_counter() - start
    return Outcome(job.kind, 200, seconds, cancelled=not finished, problem=problem)


async def _cancel_whole(c: Clients, job: Job) -> Outcome:
    """Ask for a whole answer and hang up after `cancel_after` x 10 ms unless it came."""
    start = time.perf_counter()
    body = _body(c.target, job, stream=False)
    post = c.raw.post("/v1/chat/completions", json=body, headers=c.auth)
    try:
        r = await asyncio.wait_for(post, timeout=job.cancel_after / 100)
    except TimeoutError:
        return Outcome(job.kind, None, time.perf_counter() - start, cancelled=True)
    problem = None if r.status_code == 200 and r.json()["choices"] else r.text[:200]
    return Outcome(job.kind, r.status_code, time.perf_counter() - start, problem=problem)


async def _invalid(c: Clients, job: Job) -> Outcome:
    start = time.perf_counter()
    headers = {**c.auth, "Content-Type": "application/json"}
    if job.kind == "bad_body":
        content = BAD_BODIES[job.variant].replace(b'"M"', json.dumps(c.target.model).encode())
    else:
        body = _body(c.target, job, stream=False)
        if job.kind == "unknown_model":
            body["model"] = "no-such-model"
        else:
            headers["Authorization"] = "Bearer sk-wrong-key-0000000000"
        content = json.dumps(body).encode()
    r = await c.raw.post("/v1/chat/completions", content=content, headers=headers)
    expected = EXPECTED_STATUS[job.kind]
    problem = None
    if r.status_code != expected or not is_openai_error(r):
        problem = f"expected {expected} + OpenAI error body, got {r.status_code}: {r.text:.200}"
    return Outcome(job.kind, r.status_code, time.perf_counter() - start, problem=problem)


def is_openai_error(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


_HANDLERS = {
    "whole": _whole,
    "stream": _stream,
    "cancel_stream": _cancel_stream,
    "cancel_whole": _cancel_whole,
    "bad_body": _invalid,
    "unknown_model": _invalid,
    "bad_key": _invalid,
}


async def _one(c: Clients, job: Job) -> Outcome:
    start = time.perf_counter()
    try:
        outcome = await _HANDLERS[job.kind](c, job)
    except (httpx.HTTPError, openai.APIError, ValueError) as exc:  # a dropped or garbled answer
        outcome = Outcome(job.kind, None, time.perf_counter() - start, problem=repr(exc)[:300])
    if outcome.status is not None and outcome.status >= 500 and outcome.problem is None:
        outcome.problem = f"HTTP {outcome.status}"
    return outcome


async def run_load(target: Target, jobs: Sequence[Job], concurrency: int) -> LoadRun:
    """Send every job with `concurrency` in flight; never raises on a bad answer."""
    clients = Clients(target, concurrency)
    todo = iter(jobs)
    outcomes: list[Outcome] = []

    async def worker() -> None:
        for job in todo:
            outcomes.append(await _one(clients, job))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await clients.aclose()
    return LoadRun(outcomes, time.perf_counter() - start)
