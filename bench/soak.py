"""Soak: mixed traffic against one real gateway for `--minutes` (default 30), resident memory
sampled throughout (issue 29: "a soak of mixed traffic for 30 minutes with resident memory
flat").

The gateway runs as `tiergate serve` on loopback with the default policy (both bundled local
tiers, the embedded cache store; `--redis` puts the cache on a redis-server started for the
run), three tenants' keys (one with a requests_per_minute limit) and a fresh cache folder.
`--concurrency` clients send bench/soak_traffic.py's seeded mix through the official openai
client: whole and streamed chats, repeats and rewordings (cache hits), /v1/completions,
/v1/embeddings of 24-48 inputs, JSON-schema output, tool requests, clients that leave early,
bad requests. The RSS of the gateway's process tree is sampled every `--sample-s`.

Figures: RSS at the end of the warm-up (the first 20% of the run) and at the end, the
slope over the post-warm-up samples (least squares, MB per 10 min), requests per status
per kind, p50/p95 latency per kind. Goals: RSS growth after warm-up <= 5% of the warm RSS,
no 5xx, no malformed answer, /ready at the end. Requests with no answer at all count as
`error:<type>` (a client-side race on a reused keep-alive connection shows there too).

    python -m bench.soak [--minutes 30] [--concurrency 4] [--redis] [--seed 29]
"""

import argparse
import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench import common
from bench.servers import RssSampler
from bench.soak_traffic import Outcome, Traffic
from tests.servers import free_port, redis_server, stop_session

DEFAULT_POLICY = common.ROOT / "router_policies" / "default.yaml"
KEYS = {"sk-soak-tenant-a-0001": "a", "sk-soak-tenant-b-0002": "b", "sk-soak-tenant-c-0003": "c"}
ADMIN_KEY = "sk-soak-admin-0123456789"
WARMUP_SHARE = 0.2
GOALS = {"rss_growth_share": 0.05}
_MB = 1_000_000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long traffic runs")
    p.add_argument("--concurrency", type=int, default=4, help="clients sending at once")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--redis", action="store_true", help="the cache on a redis-server")
    p.add_argument("--seed", type=int, default=29, help="seed of the traffic mix")
    return p.parse_args()


# ---------------------------------------------------------------- the gateway


def soak_policy(cache_dir: Path, redis_url: str | None) -> dict[str, Any]:
    """The default policy with the soak's tenants; its relative paths made absolute (the
    copy lives in a temp folder)."""
    policy = yaml.safe_load(DEFAULT_POLICY.read_text())
    policy["server"]["reload_interval_s"] = 0
    policy["auth"] = {
        "mode": "keys",
        "keys": [{"key": k, "tenant": t, "tier_override": True} for k, t in KEYS.items()],
        "admin_key": ADMIN_KEY,
    }
    policy["limits"]["tenants"] = {"c": {"requests_per_minute": 120}}  # so 429s happen too
    examples = policy["difficulty"]["examples"]
    policy["difficulty"]["examples"] = [str(DEFAULT_POLICY.parent / e) for e in examples]
    policy["cache"]["path"] = str(cache_dir / "semantic-cache.sqlite3")
    if redis_url:
        policy["cache"].update(store="redis", redis_url=redis_url)
    return policy


@contextlib.contextmanager
def gateway(policy: dict[str, Any], folder: Path) -> Iterator[tuple[str, int]]:
    """`tiergate serve` in its own session; yields (base URL, pid) once it answers."""
    path = folder / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(path)]
    cmd += ["--port", str(port), "--log-level", "warning"]
    log = folder / "gateway.log"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}  # models and kernels: the usual cache
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        yield url, proc.pid
    finally:
        stop_session(proc, grace_s=30)
        print(f"gateway log: {log} (last lines below)\n{log.read_text()[-1500:]}", flush=True)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, deadline_s: float = 900) -> None:
    deadline = time.monotonic() + deadline_s  # both models and the embedder load first
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"gateway not ready after {deadline_s} s")


class TreeRss(RssSampler):
    """RssSampler over the whole process tree (a server's children count too)."""

    def rss(self) -> int:
        root = psutil.Process(self.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total


# ---------------------------------------------------------------- the run


async def drive(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    traffic = Traffic(url, list(KEYS))
    sampler = TreeRss(pid, args.sample_s)
    outcomes: list[Outcome] = []
    start = time.monotonic()
    deadline = start + args.minutes * 60

    async def client(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        while time.monotonic() < deadline:
            outcomes.append(await traffic.one(rng))

    sampler.start()
    try:
        await asyncio.gather(*(client(i) for i in range(args.concurrency)))
        await asyncio.sleep(args.sample_s)  # one sample after the last request
    finally:
        await sampler.stop()
        await traffic.close()
    samples = [(t - start, rss) for t, rss in sampler.samples]
    return {"memory": memory_figures(samples, args.minutes * 60), **traffic_figures(outcomes)}


def memory_figures(samples: list[tuple[float, int]], run_s: float) -> dict[str, Any]:
    after = [(t, rss) for t, rss in samples if t >= WARMUP_SHARE * run_s]
    if len(after) < 2:
        raise RuntimeError("too few RSS samples after the warm-up: run longer")
    warm, end = after[0][1], after[-1][1]
    return {
        "rss_start_mb": round(samples[0][1] / _MB, 1),
        "rss_after_warmup_mb": round(warm / _MB, 1),
        "rss_end_mb": round(end / _MB, 1),
        "rss_peak_mb": round(max(r for _, r in samples) / _MB, 1),
        "rss_growth_mb": round((end - warm) / _MB, 1),
        "rss_growth_share": round((end - warm) / warm, 4),
        "slope_mb_per_10min": round(slope(after) * 600 / _MB, 2),
        "warmup_s": round(WARMUP_SHARE * run_s),
        "samples": [(round(t, 1), round(r / _MB, 1)) for t, r in samples],
    }


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of y over t (bytes per second)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


def traffic_figures(outcomes: list[Outcome]) -> dict[str, Any]:
    statuses: dict[str, Counter] = defaultdict(Counter)
    latency: dict[str, list[float]] = defaultdict(list)
    problems: Counter = Counter()
    for o in outcomes:
        statuses[o.kind][o.status] += 1
        if o.status == "200":
            latency[o.kind].append(o.seconds)
        if o.problem:
            problems[f"{o.kind}: {o.problem}"] += 1
    total = Counter(o.status for o in outcomes)
    return {
        "requests": len(outcomes),
        "status_counts": dict(sorted(total.items())),
        "status_counts_per_kind": {k: dict(sorted(c.items())) for k, c in sorted(statuses.items())},
        "latency_s": {
            k: {"n": len(v), "p50": common.percentile(v, 50), "p95": common.percentile(v, 95)}
            for k, v in sorted(latency.items())
        },
        "problems": dict(problems),
        "server_errors": sum(n for s, n in total.items() if s.startswith("5")),
    }


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="tiergate-soak-") as tmp:
        folder = Path(tmp)
        with contextlib.ExitStack() as stack:
            redis_url = stack.enter_context(redis_server()).url if args.redis else None
            url, pid = stack.enter_context(gateway(soak_policy(folder, redis_url), folder))
            print(f"gateway ready at {url} (pid {pid}); soaking {args.minutes} min", flush=True)
            result = asyncio.run(drive(url, pid, args))
            result["healthy_after"] = httpx.get(f"{url}/ready", timeout=10).status_code == 200
    mem = result["memory"]
    result["settings"] = {k: getattr(args, k) for k in ("minutes", "concurrency", "redis", "seed")}
    result["goals"] = {
        "rss_growth_share": common.goal(
            mem["rss_growth_share"], GOALS["rss_growth_share"], higher_is_better=False
        ),
        "server_errors": common.goal(result["server_errors"], 0, higher_is_better=False),
        "problems": common.goal(sum(result["problems"].values()), 0, higher_is_better=False),
        "healthy_after": common.goal(float(result["healthy_after"]), 1.0),
    }
    summary = {k: v for k, v in mem.items() if k != "samples"}
    print(f"memory: {summary}")
    print(f"statuses: {result['status_counts']}  problems: {result['problems']}")
    for kind, lat in result["latency_s"].items():
        print(f"  {kind:14} n={lat['n']:4} p50={lat['p50']:.2f}s p95={lat['p95']:.2f}s")
    common.write_result("soak", result)


if __name__ == "__main__":
    main()
