"""What one request costs Redis: commands, bytes and Redis CPU, cache misses and hits apart.

One gateway (semantic cache in a real redis-server, limits kept there too, as a scale-out
deployment runs them) in front of the stub backend. N new questions (each a miss: lookup,
backend call, store), then the same N again (each an exact hit), then the N reworded (each
a semantic hit: embedding, index search, verifier). Around each phase the script reads
Redis's INFO (commandstats, total_net_input/output_bytes, used_cpu_*, used_memory) and the
gateway's CPU time (its process tree), and divides by N. Redis runs its commands on one
thread, so Redis CPU per request bounds what one Redis can serve. Figures feed
bench/capacity.py. Writes bench/results/redis_usage.json.

    python -m bench.redis_usage [--quick] [--requests N] [--concurrency C]
"""

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench import common
from bench.servers import tree_cpu_seconds, wait_ready
from tests.servers import free_port, run_redis, session_process, tiergate_serve

KEY = "sk-bench-redis-usage"
ADMIN_KEY = "sk-bench-redis-admin"


def policy(stub_port: int, port: int, redis_url: str) -> str:
    return f"""
server: {{host: 127.0.0.1, port: {port}, reload_interval_s: 0}}
auth:
  keys: [{{key: {KEY}, tenant: bench}}]
  admin_key: {ADMIN_KEY}
cache: {{enabled: true, store: redis, redis_url: "{redis_url}"}}
limits:
  default: {{requests_per_minute: 100000000, tokens_per_minute: 1000000000, max_concurrent: 64}}
tiers:
  stub:
    deployments:
      - {{model: openai/stub-model, api_base: "http://127.0.0.1:{stub_port}/v1",
          api_key_env: STUB_API_KEY}}
    retries: 0
routes:
  auto:
    default: stub
"""


def question(i: int, reworded: bool = False) -> str:
    # Numbers differ between questions, so the verifier never lets one answer another;
    # the rewording keeps the meaning, so it finds the stored answer by its embedding.
    verb = "what's" if reworded else "what is"
    return f"Question {i}: {verb} {i} times {i + 7}, and why is it {'odd' if i % 2 else 'even'}?"


async def send_all(url: str, texts: list[str], concurrency: int) -> dict[str, int]:
    """Each text as one chat request; counts of x-tiergate-cache values (hit, miss...)."""
    outcomes: dict[str, int] = {}
    todo = iter(texts)
    headers = {"Authorization": f"Bearer {KEY}"}

    async def worker(client: httpx.AsyncClient) -> None:
        for text in todo:
            body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
            response = await client.post("/chat/completions", json=body)
            response.raise_for_status()
            outcome = response.headers.get("x-tiergate-cache", "?")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return outcomes


def redis_snapshot(client: redis.Redis) -> dict[str, Any]:
    info = client.info("all")
    calls = {
        k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")
    }
    return {
        "calls": calls,
        "net_in": info["total_net_input_bytes"],
        "net_out": info["total_net_output_bytes"],
        "cpu_s": info["used_cpu_user"] + info["used_cpu_sys"],
        "memory": info["used_memory"],
    }


def cache_memory(client: redis.Redis, prefix: str = "tiergate:cache") -> dict[str, Any]:
    """Redis's own account (MEMORY USAGE) of the cache's keys: entries, LRU set, events.

    The events stream is kept to a bounded length whatever the entries, so it is reported
    apart and left out of the bytes per entry.
    """
    entries, entry_bytes, stream_bytes = 0, 0, 0
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        size = client.memory_usage(key, samples=0) or 0
        if client.type(key) == b"stream":
            stream_bytes += size
            continue
        entries += client.type(key) == b"hash"
        entry_bytes += size
    per_entry = round(entry_bytes / entries, 1) if entries else None
    return {"entries": entries, "bytes_per_entry": per_entry, "events_stream_bytes": stream_bytes}


def phase(
    name: str, url: str, texts: list[str], args: argparse.Namespace, rc: redis.Redis, pid: int
) -> dict[str, Any]:
    before, cpu0, start = redis_snapshot(rc), tree_cpu_seconds(pid), time.perf_counter()
    outcomes = asyncio.run(send_all(url, texts, args.concurrency))
    seconds = time.perf_counter() - start
    time.sleep(1.0)  # stores finish after the answer is sent; count them with their request
    after, gw_cpu = redis_snapshot(rc), tree_cpu_seconds(pid) - cpu0
    n = len(texts)
    calls = {
        cmd: round((count - before["calls"].get(cmd, 0)) / n, 3)
        for cmd, count in sorted(after["calls"].items())
        if cmd != "info"  # this script's snapshots, not the gateway's work
    }
    calls = {cmd: c for cmd, c in calls.items() if c > 0}
    return {
        "requests": n,
        "outcomes": outcomes,
        "requests_per_s": round(n / seconds, 1),
        "redis_commands_per_request": round(sum(calls.values()), 3),
        "redis_commands": calls,
        "redis_net_in_bytes_per_request": round((after["net_in"] - before["net_in"]) / n, 1),
        "redis_net_out_bytes_per_request": round((after["net_out"] - before["net_out"]) / n, 1),
        "redis_cpu_ms_per_request": round((after["cpu_s"] - before["cpu_s"]) / n * 1000, 4),
        "redis_memory_bytes_per_request": round((after["memory"] - before["memory"]) / n, 1),
        "gateway_cpu_ms_per_request": round(gw_cpu / n * 1000, 3),
        "phase": name,
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n = args.requests or (100 if args.quick else 400)
    stub_port, gw_port = free_port(), free_port()
    with run_redis() as redis_url, contextlib.ExitStack() as stack:
        (work / "policy.yaml").write_text(policy(stub_port, gw_port, redis_url))
        stub_cmd = [sys.executable, "-m", "bench.stub_backend", "--port", str(stub_port)]
        stack.enter_context(session_process(stub_cmd, work / "stub.log"))
        env = {"STUB_API_KEY": "sk-stub", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        gw_cmd = tiergate_serve(work / "policy.yaml", gw_port)
        pid = stack.enter_context(session_process(gw_cmd, work / "gateway.log", env))
        url = f"http://127.0.0.1:{gw_port}/v1"
        asyncio.run(wait_ready(f"{url}/models", 300, {"Authorization": f"Bearer {KEY}"}))
        asyncio.run(send_all(url, [question(-i) for i in range(1, 21)], 4))  # warm: embedder
        rc = redis.Redis.from_url(redis_url)
        texts = [question(i) for i in range(n)]
        miss = phase("miss", url, texts, args, rc, pid)
        hit = phase("hit", url, texts, args, rc, pid)
        reworded = [question(i, reworded=True) for i in range(n)]
        semantic = phase("semantic_hit", url, reworded, args, rc, pid)
        memory = cache_memory(rc)
        rc.close()
    return {
        "settings": {"requests": n, "concurrency": args.concurrency},
        "miss": miss,
        "hit": hit,  # exact: the normalised question was stored
        "semantic_hit": semantic,  # found by the embedding, passed the verifier
        "cache_memory": memory,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100 requests per phase, not 400")
    p.add_argument("--requests", type=int, help="requests per phase")
    p.add_argument("--concurrency", type=int, default=4)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="redis-usage-") as tmp:
        try:
            result = run(args, Path(tmp))
        except Exception:
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
            raise
    n = result["settings"]["requests"]
    intended = {"miss": "miss", "hit": "hit", "semantic_hit": "hit"}
    ok = True
    for name, outcome in intended.items():
        print(name, result[name])
        ok = ok and result[name]["outcomes"].get(outcome, 0) == n
    result["goals"] = {"phases_as_intended": common.goal(float(ok), 1.0)}
    common.write_result("redis_usage", result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
