"""Batch on idle capacity (issue 28's goal): a batch of `--lines` requests (default 500)
completes while interactive p50 latency stays within 10% of the same traffic without it.

One `tiergate serve` on loopback, one local tier (SmolLM2-135M, one thread), the embedded
store (the route's cache off, so every interactive request and batch line is generated).
Interactive traffic arrives open-loop (Poisson, mean gap `--gap-s`) with its own distinct
prompts; the same traffic runs in three phases of one run: without a batch, while the batch
runs (from its creation until it completes), and without a batch again. The baseline is
the two batch-free phases together (so drift over the run cancels); the figure is the p50
(and p95) latency during the batch over that baseline, and how long the batch took.

    python -m bench.batch_idle [--lines 500] [--baseline-requests 40] [--gap-s 1.5]
"""

import argparse
import asyncio
import io
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import common
from bench.servers import wait_ready
from tests.servers import free_port, session_process, tiergate_serve

KEY, ADMIN = "sk-bench-batch-0001", "sk-bench-batch-admin"
GOAL_RATIO = 1.10  # interactive p50 with the batch over without: at most this


def policy(cache_path: Path, max_concurrent: int) -> str:
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: bench}}], admin_key: {ADMIN}}}
cache: {{enabled: true, store: embedded, path: {cache_path}}}
engines:
  {common.MODEL}: {{kv_cache_mb: 64, max_num_seqs: 8, max_model_len: 512, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {common.MODEL}}}], timeout_s: 120}}
routes:
  auto: {{default: small, cache: {{enabled: false}}}}
batch: {{max_concurrent: {max_concurrent}}}
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=500, help="requests in the batch")
    p.add_argument("--baseline-requests", type=int, default=40, help="per batch-free phase")
    p.add_argument("--gap-s", type=float, default=1.5, help="mean gap between interactive requests")
    p.add_argument("--max-tokens", type=int, default=16, help="interactive answers' length")
    p.add_argument("--batch-max-tokens", type=int, default=8, help="batch answers' length")
    p.add_argument("--max-concurrent", type=int, default=8, help="batch.max_concurrent")
    p.add_argument("--seed", type=int, default=28)
    return p.parse_args()


class Interactive:
    """Open-loop chat requests with distinct prompts; latencies kept per phase."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.rng = random.Random(args.seed)
        self.sent = 0
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}

    async def one(self, client: httpx.AsyncClient, phase: str) -> None:
        self.sent += 1
        body = {
            "model": "auto",
            "messages": [{"role": "user", "content": f"Tell me one fact about {self.sent}."}],
            "max_tokens": self.args.max_tokens,
            "temperature": 0,
        }
        start = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body)
        if response.status_code == 200:
            self.latencies.setdefault(phase, []).append(time.perf_counter() - start)
        else:
            self.errors[phase] = self.errors.get(phase, 0) + 1

    async def run(self, phase: str, until: Any) -> None:
        """Send until `until()` is true (an int: that many requests), then wait for them."""
        headers = {"authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=300) as client:
            tasks: list[asyncio.Task] = []
            while not until(len(tasks)):
                tasks.append(asyncio.create_task(self.one(client, phase)))
                await asyncio.sleep(self.rng.expovariate(1 / self.args.gap_s))
            await asyncio.gather(*tasks)


def _lines(count: int, max_tokens: int) -> bytes:
    rows = []
    for i in range(count):
        body = {
            "model": "auto",
            "messages": [{"role": "user", "content": f"Write a short line about topic {i}."}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        row = {"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions"}
        rows.append(json.dumps(row | {"body": body}) + "\n")
    return "".join(rows).encode()


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "requests": len(values),
        "p50_s": round(common.percentile(values, 50), 4),
        "p95_s": round(common.percentile(values, 95), 4),
    }


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    traffic = Interactive(url, args)
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=2)
    await traffic.run("warmup", lambda sent: sent >= 5)
    await traffic.run("before", lambda sent: sent >= args.baseline_requests)
    upload = await api.files.create(
        file=("batch.jsonl", io.BytesIO(_lines(args.lines, args.batch_max_tokens))),
        purpose="batch",
    )
    started = time.perf_counter()
    batch = await api.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    state = {"batch": batch}

    async def poll() -> None:
        while state["batch"].status not in ("completed", "failed", "cancelled", "expired"):
            await asyncio.sleep(1.0)
            state["batch"] = await api.batches.retrieve(batch.id)

    poller = asyncio.create_task(poll())
    await traffic.run("during", lambda _: poller.done())
    batch_s = time.perf_counter() - started
    await traffic.run("after", lambda sent: sent >= args.baseline_requests)
    done = state["batch"]
    baseline = traffic.latencies.get("before", []) + traffic.latencies.get("after", [])
    during = traffic.latencies.get("during", [])
    p50_ratio = common.ratio(common.percentile(during, 50), common.percentile(baseline, 50))
    p95_ratio = common.ratio(common.percentile(during, 95), common.percentile(baseline, 95))
    return {
        "interactive": {
            "without_batch": _stats(baseline),
            "before": _stats(traffic.latencies.get("before", [])),
            "after": _stats(traffic.latencies.get("after", [])),
            "during_batch": _stats(during),
            "errors": traffic.errors,
            "p50_ratio": p50_ratio,
            "p95_ratio": p95_ratio,
        },
        "batch": {
            "lines": args.lines,
            "status": done.status,
            "request_counts": done.request_counts.model_dump() if done.request_counts else None,
            "seconds": round(batch_s, 1),
            "lines_per_s": round(args.lines / batch_s, 2),
        },
        "settings": vars(args),
        "goals": {
            "batch_completed": common.goal(
                1.0 if done.status == "completed" and done.request_counts.failed == 0 else 0.0,
                1.0,
            ),
            "interactive_p50_ratio": common.goal(p50_ratio, GOAL_RATIO, higher_is_better=False),
        },
    }


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "policy.yaml"
        path.write_text(policy(work / "cache.sqlite3", args.max_concurrent))
        port = free_port()
        env = {"OMP_NUM_THREADS": "1"}
        with session_process(tiergate_serve(path, port), work / "gateway.log", env):
            url = f"http://127.0.0.1:{port}"
            try:
                asyncio.run(wait_ready(f"{url}/ready", 300))
                result = asyncio.run(measure(url, args))
            except BaseException:
                print((work / "gateway.log").read_text()[-3000:])
                raise
    print(json.dumps(result, indent=2))
    common.write_result("batch_idle", result)


if __name__ == "__main__":
    main()
