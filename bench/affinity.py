"""Prefix affinity vs round robin: two `tiergate engine` replicas behind one gateway tier.

Workload: 8 system prompts of ~1,000 tokens (Python's help topics) x 12 short, distinct
questions each (4 with --quick; ShareGPT), shuffled, sent by `--concurrency` clients. The
same workload runs twice in this run, each time on fresh engine processes and a fresh
gateway: the tier's `balance` is `round_robin`, then `prefix_affinity`. Figures:
requests/s (goal: affinity >= 1.5x round robin) and the engines' prefix-cache hit rate
(from their /metrics).

Why it matters: each replica's KV budget (`--kv-cache-mb`, 256 MiB by default, the
engine's own default) holds about five of the eight prompts. Round robin shows every
prompt to both replicas, so they evict each other's prompts and recompute them; with
affinity each replica keeps its own four.

    python -m bench.affinity [--quick] [--questions N] [--concurrency C] [--kv-cache-mb MB]
"""

import argparse
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import common
from bench.prefix_sharing import questions
from tests.processes import Process
from tests.servers import free_port

GOALS = {"throughput_ratio": 1.5}
SYSTEM_CHARS = 4_000  # ~1,000 SmolLM2 tokens of English
PROMPTS = 8


def system_prompts(count: int = PROMPTS) -> list[str]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return [
        f"You are assistant #{i}. Use this reference when it helps:\n\n"
        + text[i * SYSTEM_CHARS : (i + 1) * SYSTEM_CHARS]
        for i in range(count)
    ]


def spawn(args: list[str], port: int, log: Path) -> Process:
    """`tiergate ARGS` started, once it listens (its lifespan, models loaded, is done)."""
    process = Process(args, port, log, {"PYTHONPATH": str(common.ROOT)})
    process.launch()
    try:
        process.wait_ready(timeout=300)
    except (RuntimeError, TimeoutError):
        process.kill()
        raise
    return process


def engine_counters(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    wanted = {
        "tiergate_engine_prefix_cache_hits_total": "hits",
        "tiergate_engine_prefix_cache_queries_total": "queries",
        "tiergate_engine_time_to_first_token_seconds_count": "requests",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def policy(mode: str, engine_ports: list[int], port: int) -> str:
    deps = ", ".join(
        f'{{model: hosted_vllm/smol, api_base: "http://127.0.0.1:{p}/v1"}}' for p in engine_ports
    )
    return (
        f"server: {{port: {port}, reload_interval_s: 0}}\nauth: {{mode: none}}\n"
        f"tiers:\n  small:\n    deployments: [{deps}]\n    balance: {mode}\n"
        "    timeout_s: 900\n    retries: 0\n"
    )


def ask(client: httpx.Client, system: str, question: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "small",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body, timeout=900)
    response.raise_for_status()
    return {"latency_s": time.perf_counter() - start, "usage": response.json()["usage"]}


def run_mode(mode: str, workload: list[tuple[str, str]], args: argparse.Namespace, logs: Path):
    ports = [free_port(), free_port()]
    engines = []
    gateway = None
    try:
        for port in ports:
            cmd = ["engine", "--model", common.MODEL, "--port", str(port), "--served-name"]
            cmd += ["smol", "--threads", "1", "--kv-cache-mb", str(args.kv_cache_mb)]
            engines.append(spawn(cmd, port, logs / f"{mode}-engine-{port}.log"))
        gw_port = free_port()
        policy_file = logs / f"{mode}-policy.yaml"
        policy_file.write_text(policy(mode, ports, gw_port))
        gateway = spawn(["serve", "--policy", str(policy_file)], gw_port, logs / f"{mode}-gw.log")
        with httpx.Client(base_url=f"http://127.0.0.1:{gw_port}") as client:
            for port in ports:  # compile kernels, warm threads: unrelated to the prompts
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    json={"model": "smol", "prompt": "Hello", "max_tokens": 2},
                    timeout=300,
                ).raise_for_status()
            before = [engine_counters(p) for p in ports]
            start = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(
                    pool.map(lambda w: ask(client, w[0], w[1], args.max_tokens), workload)
                )
            seconds = time.perf_counter() - start
        after = [engine_counters(p) for p in ports]
    finally:
        for process in [gateway, *engines]:
            if process is not None:
                process.kill()
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    hits, queries = sum(d["hits"] for d in delta), sum(d["queries"] for d in delta)
    latencies = [r["latency_s"] for r in results]
    return {
        "balance": mode,
        "requests": len(results),
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(results) / seconds, 3),
        "output_tokens_per_s": round(
            sum(r["usage"]["completion_tokens"] for r in results) / seconds, 2
        ),
        "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in results),
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else None,
        "requests_per_replica": [d["requests"] for d in delta],
        "latency_s": {
            "p50": round(common.percentile(latencies, 50), 3),
            "p95": round(common.percentile(latencies, 95), 3),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 questions per prompt, not 12")
    p.add_argument("--questions", type=int, help="questions per system prompt")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kv-cache-mb", type=int, default=256, help="KV budget of each replica")
    args = p.parse_args()
    per_prompt = args.questions or (4 if args.quick else 12)
    systems = system_prompts()
    asks = questions(PROMPTS * per_prompt)
    workload = [(systems[i % PROMPTS], q) for i, q in enumerate(asks)]
    random.Random(0).shuffle(workload)
    with tempfile.TemporaryDirectory(prefix="tiergate-affinity-") as tmp:
        logs = Path(tmp)
        baseline = run_mode("round_robin", workload, args, logs)
        print("round_robin:", baseline, flush=True)
        ours = run_mode("prefix_affinity", workload, args, logs)
        print("prefix_affinity:", ours, flush=True)
    ratio = common.ratio(ours["requests_per_s"], baseline["requests_per_s"])
    print(f"throughput prefix_affinity / round_robin: {ratio}x (goal >= 1.5x)")
    common.write_result(
        "affinity",
        {
            "cpu_model": common.cpu_model(),
            "settings": {
                "replicas": 2,
                "model": common.MODEL,
                "threads_per_replica": 1,
                "kv_cache_mb_per_replica": args.kv_cache_mb,
                "system_prompts": PROMPTS,
                "system_prompt_chars": SYSTEM_CHARS,
                "questions_per_prompt": per_prompt,
                "concurrency": args.concurrency,
                "max_tokens": args.max_tokens,
                "quick": args.quick,
            },
            "round_robin": baseline,
            "prefix_affinity": ours,
            "goals": {"throughput_ratio": common.goal(ratio, GOALS["throughput_ratio"])},
        },
    )


if __name__ == "__main__":
    main()
