"""Load test on loopback: the gateway in front of its co-located engine vs `tiergate engine` alone.

Same driver as tests/test_load.py (tests/load_driver.py), bigger: 2,000 requests at
concurrency 64 (`--quick`: 300 at 16), a seeded mix of whole and streamed ShareGPT chats
(32..64 output tokens, `ignore_eos`), streams and whole answers the client abandons
midway, and invalid requests (bad bodies, unknown model, bad key). Two targets, each its
own subprocess started in turn (never both at once), same model, engine settings and jobs:

- `engine`: `tiergate engine` (engine/server.py), the standalone server;
- `gateway`: `tiergate serve` with one local tier on the same engine settings.

Each target gets a warm-up pass, then the timed pass. Figures: requests/s, p50/p99
latency of the valid answers, end-to-end output tokens/s, every problem found (an
incomplete or malformed answer, a wrong status, any 5xx), the engine gauges at rest
afterwards (running, waiting, KV usage: all 0), and the server's RSS from the end of the
warm-up to the end of the run. Goals: gateway >= 0.9 of the engine alone in output
tokens/s, no problems, pools free at rest, RSS growth after warm-up <= 5%.

    python -m bench.load [--quick] [--requests N] [--concurrency C]
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.servers import RssSampler, tree_cpu_seconds, wait_ready
from tests.load_driver import LoadRun, Target, make_jobs, run_load
from tests.pool_state import wait_at_rest
from tests.servers import TIERGATE, free_port, session_process, tiergate_serve

KEY = "sk-load-0123456789"
ADMIN_KEY = "sk-load-admin-0123456789"
SERVED = common.MODEL  # the engine's served name; the gateway is asked for its `auto` route
GOALS = {"tokens_per_s_ratio": 0.9, "rss_growth_share": 0.05}
_MIB = 1024 * 1024


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="300 requests at concurrency 16")
    p.add_argument("--requests", type=int, help="timed requests per target (default 2000)")
    p.add_argument("--concurrency", type=int, help="requests in flight (default 64)")
    p.add_argument("--seed", type=int, default=15, help="seed of the workload mix")
    p.add_argument("--kv-cache-mb", type=int, default=384, help="each engine's KV budget")
    p.add_argument("--threads", type=int, help="engine torch threads (default: torch's)")
    p.add_argument("--only", choices=["engine", "gateway"], help="one target (no ratio)")
    return p.parse_args()


def sharegpt_questions(limit: int = 400, max_chars: int = 1000) -> list[str]:
    """First human turns of ShareGPT, short enough to keep the run bounded (~250 tokens)."""
    seen: dict[str, None] = {}
    for conv in common.iter_sharegpt(4000):
        pair = common.first_exchange(conv)
        if pair and 0 < len(pair[0].strip()) <= max_chars:
            seen[pair[0].strip()] = None
        if len(seen) == limit:
            break
    return list(seen)


# ---------------------------------------------------------------- the two servers


def engine_flags(args: argparse.Namespace, concurrency: int) -> list[str]:
    flags = ["--kv-cache-mb", str(args.kv_cache_mb), "--max-num-seqs", str(concurrency)]
    flags += ["--max-waiting", "256"]
    return flags + (["--threads", str(args.threads)] if args.threads else [])


def engine_cmd(args: argparse.Namespace, port: int, concurrency: int) -> list[str]:
    head = [*TIERGATE, "engine", "--model", common.MODEL]
    tail = ["--port", str(port), "--served-name", SERVED, "--api-key", KEY]
    return [*head, *tail, *engine_flags(args, concurrency)]


def gateway_policy(args: argparse.Namespace, concurrency: int) -> str:
    threads = f", num_threads: {args.threads}" if args.threads else ""
    settings = f"kv_cache_mb: {args.kv_cache_mb}, max_num_seqs: {concurrency}, max_waiting: 256"
    return f"""
server: {{host: 127.0.0.1, reload_interval_s: 0}}
auth:
  keys: [{{key: {KEY}, tenant: load}}]
  admin_key: {ADMIN_KEY}
limits:  # one tenant on purpose: its throughput, not the default per-tenant cap of 32
  default: {{max_concurrent: null}}
engines:
  {common.MODEL}: {{{settings}{threads}}}
tiers:
  small: {{deployments: [{{model: {common.MODEL}}}], retries: 0, timeout_s: 600}}
routes:
  auto: {{default: small}}
"""


def gateway_cmd(policy: Path, port: int) -> list[str]:
    return [*tiergate_serve(policy, port), "--log-level", "warning"]


# ---------------------------------------------------------------- one target


async def drive(target: Target, pid: int, warmup: list, jobs: list, concurrency: int) -> dict:
    """Warm up, then the timed pass with RSS sampled; the engine state at rest after each."""
    await run_load(target, warmup, concurrency)
    warm_rest = await wait_at_rest(target)
    sampler = RssSampler(pid)
    rss_warm = sampler.rss()
    threads = _threads(pid)
    cpu0 = tree_cpu_seconds(pid)
    sampler.start()
    run: LoadRun = await run_load(target, jobs, concurrency)
    cpu = tree_cpu_seconds(pid) - cpu0
    rest = await wait_at_rest(target)
    await sampler.stop()
    rss_end = sampler.rss()
    peak = max((b for _, b in sampler.samples), default=rss_end)
    return {
        **run.summary(),
        "problem_list": run.problems[:50],
        "server_cpu_s": round(cpu, 1),
        "server_cpu_ms_per_request": round(cpu / len(jobs) * 1000, 2),
        # CPU, unlike wall time, hardly moves with what else runs on the shared machine.
        "server_cpu_ms_per_output_token": round(
            cpu / max(1, run.summary()["output_tokens"]) * 1000, 3
        ),
        "server_threads": threads,
        "at_rest_after_warmup": vars(warm_rest),
        "at_rest": vars(rest),
        "pools_free_at_rest": warm_rest.at_rest and rest.at_rest,
        "rss_mib": {
            "after_warmup": round(rss_warm / _MIB, 1),
            "end": round(rss_end / _MIB, 1),
            "peak": round(peak / _MIB, 1),
            "growth": round((rss_end - rss_warm) / _MIB, 1),
            "growth_share": round((rss_end - rss_warm) / rss_warm, 4),
            "samples": len(sampler.samples),
        },
    }


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def measure(name: str, args: argparse.Namespace, work: Path, jobs: tuple, conc: int) -> dict:
    port = free_port()
    if name == "engine":
        cmd, target = engine_cmd(args, port, conc), Target("", SERVED, KEY, KEY)
    else:
        policy = work / "policy.yaml"
        policy.write_text(gateway_policy(args, conc))
        cmd, target = gateway_cmd(policy, port), Target("", "auto", KEY, ADMIN_KEY)
    target = Target(f"http://127.0.0.1:{port}", target.model, target.api_key, target.metrics_key)
    env = {"PYTHONPATH": str(common.ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    print(f"[{name}] starting: {' '.join(cmd)}", flush=True)
    with session_process(cmd, work / f"{name}.log", env) as pid:
        startup = asyncio.run(wait_ready(f"{target.base_url}/health", 300))
        figures = asyncio.run(drive(target, pid, *jobs, conc))
    figures["startup_s"] = round(startup, 1)
    print(f"[{name}] {_line(figures)}", flush=True)
    for problem in figures["problem_list"][:10]:
        print(f"[{name}]   problem: {problem}", flush=True)
    return figures


def _line(f: dict) -> str:
    return (
        f"{f['requests']} requests in {f['seconds']} s: {f['requests_per_s']} req/s, "
        f"{f['output_tokens_per_s']} output tok/s, p50 {f['latency_p50_s']} s, "
        f"p99 {f['latency_p99_s']} s, problems {f['problems']}, statuses {f['statuses']}, "
        f"at rest {f['pools_free_at_rest']}, RSS growth {f['rss_mib']['growth']} MiB, "
        f"server CPU {f['server_cpu_ms_per_request']} ms/request"
    )


def goals(results: dict[str, dict]) -> dict[str, Any]:
    gw, eng = results.get("gateway"), results.get("engine")
    out: dict[str, Any] = {}
    if gw and eng:
        ratio = common.ratio(gw["output_tokens_per_s"], eng["output_tokens_per_s"])
        out["tokens_per_s_ratio"] = common.goal(ratio, GOALS["tokens_per_s_ratio"])
    for name, r in results.items():
        out[f"{name}_problems"] = common.goal(r["problems"], 0, False)
        out[f"{name}_pools_free"] = common.goal(int(r["pools_free_at_rest"]), 1)
        growth = r["rss_mib"]["growth_share"]
        out[f"{name}_rss_growth"] = common.goal(growth, GOALS["rss_growth_share"], False)
    return out


def main() -> None:
    args = parse_args()
    count = args.requests or (300 if args.quick else 2000)
    conc = args.concurrency or (16 if args.quick else 64)
    questions = sharegpt_questions()
    warmup = make_jobs(questions, max(2 * conc, count // 10), seed=args.seed + 1)
    jobs = make_jobs(questions, count, seed=args.seed)
    names = [args.only] if args.only else ["engine", "gateway"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tiergate-load-") as tmp:
        results = {n: measure(n, args, Path(tmp), (warmup, jobs), conc) for n in names}
    result = {
        "cpu_model": common.cpu_model(),
        "workload": {
            "requests": count,
            "warmup_requests": len(warmup),
            "concurrency": conc,
            "seed": args.seed,
            "output_tokens": "32..64, ignore_eos",
            "questions": len(questions),
            "kv_cache_mb": args.kv_cache_mb,
            "engine_threads": args.threads,
        },
        **results,
        "seconds": round(time.perf_counter() - started, 1),
        "goals": goals(results),
    }
    if len(results) == 2:  # the load-independent view of the same question
        cpu = [results[n]["server_cpu_ms_per_output_token"] for n in ("gateway", "engine")]
        result["server_cpu_per_output_token_ratio"] = common.ratio(*cpu)
    if "tokens_per_s_ratio" in result["goals"]:
        print(f"gateway / engine alone, output tok/s: {result['goals']['tokens_per_s_ratio']}")
    common.write_result("load", result)


if __name__ == "__main__":
    main()
