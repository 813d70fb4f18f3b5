"""What limits and the shutdown drain add to each request, measured in one run.

Per request: `Limiter.admit` + `Admission.finish` with no limits (the baseline: what every
request pays), with tenant + key limits kept in process, and kept in a real redis-server
over loopback. Per streamed piece: an answer's pieces read through `Drain.pieces` against
the same pieces read directly. Writes bench/results/limits_overhead.json.

    python -m bench.limits_overhead [--quick]
"""

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bench import common
from gateway.backends.base import Piece
from gateway.drain import Drain
from gateway.limits import Limiter
from gateway.limits.terms import KeyTerms
from gateway.policy import key_digest, parse_policy
from tests.servers import run_redis

KEY = "sk-bench-limits-key"
TERMS = KeyTerms(key_digest(KEY.encode()), "bench")
POLICY = f"""
auth: {{keys: [{{key: {KEY}, tenant: bench}}]}}
tiers: {{small: {{deployments: [{{model: smollm2-135m}}]}}}}
limits:
  default: {{requests_per_minute: 100000000, tokens_per_minute: 1000000000, max_concurrent: 64}}
  keys: {{{key_digest(KEY.encode())}: {{requests_per_minute: 100000000, max_concurrent: 64}}}}
"""


async def per_call_us(n: int, call: Callable[[], Awaitable[None]]) -> float:
    for _ in range(min(n, 200)):  # warm-up: connections, scripts loaded
        await call()
    start = time.perf_counter()
    for _ in range(n):
        await call()
    return (time.perf_counter() - start) / n * 1e6


async def limiter_costs(n: int, redis_url: str) -> dict[str, float]:
    limited = parse_policy(POLICY, env={})
    unlimited = limited.model_copy(update={"limits": type(limited.limits)()})
    in_redis = limited.model_copy(
        update={"limits": limited.limits.model_copy(update={"redis_url": redis_url})}
    )
    limiter = Limiter()

    def request(policy: Any) -> Callable[[], Awaitable[None]]:
        async def once() -> None:
            admission = await limiter.admit(policy, "bench", TERMS, 100)
            await admission.finish(150)

        return once

    out = {
        "no_limits_us": await per_call_us(n, request(unlimited)),
        "in_process_us": await per_call_us(n, request(limited)),
        "redis_us": await per_call_us(n, request(in_redis)),
    }
    await limiter.close()
    return out


class Pieces:
    """An answer's pieces with nothing behind them: only the reading is measured."""

    def __init__(self, n: int) -> None:
        self.left = n

    def __aiter__(self) -> "Pieces":
        return self

    async def __anext__(self) -> Piece:
        if not self.left:
            raise StopAsyncIteration
        self.left -= 1
        await asyncio.sleep(0)  # a real upstream yields to the loop between pieces
        return Piece("x")

    async def aclose(self) -> None:
        pass


async def read_all(pieces: AsyncIterator[Piece]) -> None:
    async for _ in pieces:
        pass


async def drain_costs(n: int) -> dict[str, float]:
    drain = Drain()
    timings = {}
    for name, wrap in (("direct", lambda p: p), ("drained", drain.pieces)):
        start = time.perf_counter()
        await read_all(wrap(Pieces(n)))
        timings[f"{name}_us_per_piece"] = (time.perf_counter() - start) / n * 1e6
    return timings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    args = p.parse_args()
    n = 2_000 if args.quick else 10_000
    with run_redis() as redis_url:
        limits = asyncio.run(limiter_costs(n, redis_url))
    pieces = asyncio.run(drain_costs(n * 10))
    result = {
        "cpu_model": common.cpu_model(),
        "requests": n,
        "limiter": limits,
        "limiter_added_in_process_us": limits["in_process_us"] - limits["no_limits_us"],
        "limiter_added_redis_us": limits["redis_us"] - limits["no_limits_us"],
        "drain": pieces,
        "drain_added_us_per_piece": pieces["drained_us_per_piece"] - pieces["direct_us_per_piece"],
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    common.write_result("limits_overhead", result)


if __name__ == "__main__":
    main()
