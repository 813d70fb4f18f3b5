"""Run every benchmark (`make bench`): install the baseline venvs, then each script in turn.

Each benchmark runs in its own process (memory and thread pools start clean), prints its
figures with the same-run baseline and writes bench/results/<name>.json. This script then
prints one goal table from those files and writes bench/results/summary.json.

    python -m bench.run [--quick] [--only NAME ...] [--skip-vllm] [--skip-llamacpp]
                        [--skip-litellm] [--no-install] [--threads N]
"""

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench import common

# Cheap ones first: a failure there shows before the long throughput run.
BENCHMARKS = [
    "admin_stats",
    "sampling_fields",
    "structured",
    "memory",
    "cache_eval",
    "cache_populated",
    "nli_graph",
    "cache_lookup",
    "cache_replay",
    "router_eval",
    "router_learn_eval",
    "precision",
    "requant4",
    "kv_utilization",
    "prefix_sharing",
    "fuzz",
    "gateway_overhead",
    "redis_usage",
    "load",
    "affinity",
    "throughput",
    "remote_vllm",
]
# Not a benchmark: the capacity table, derived from the results above once they all exist.
CAPACITY_INPUTS = ["gateway_overhead", "redis_usage", "throughput", "cache_lookup"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes everywhere")
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run just these")
    p.add_argument("--skip-vllm", action="store_true", help="no vLLM (throughput, remote_vllm)")
    p.add_argument("--skip-llamacpp", action="store_true", help="no llama-cpp baseline")
    p.add_argument("--skip-litellm", action="store_true", help="no LiteLLM proxy baseline")
    p.add_argument("--no-install", action="store_true", help="skip baselines not installed yet")
    p.add_argument("--threads", type=int, help="CPU threads for every engine in throughput")
    return p.parse_args()


def install_baselines(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Create/verify the venvs the chosen benchmarks need; failures become 'skipped'."""
    wanted = []
    if {"throughput", "remote_vllm"} & set(names) and not args.skip_vllm:
        wanted.append("vllm")
    if "throughput" in names and not args.skip_llamacpp:
        wanted.append("llamacpp")
    if "gateway_overhead" in names and not args.skip_litellm:
        wanted.append("litellm-proxy")
    report = {}
    for name in wanted:
        marker = common.VENVS_DIR / name / ".tiergate-installed.json"
        if args.no_install and not marker.is_file():
            report[name] = {"skipped": "not installed and --no-install given"}
            continue
        venv = common.ensure_venv(name)
        report[name] = {
            "python": str(venv.python) if venv.python else None,
            "skipped": venv.skipped,
            "install_seconds": venv.install_seconds,
            "versions": venv.versions,
        }
        print(f"[{name}] {report[name]}", flush=True)
    return report


def flags_for(name: str, args: argparse.Namespace) -> list[str]:
    flags = ["--quick"] if args.quick else []
    if name == "throughput":
        flags += ["--skip-vllm"] if args.skip_vllm else []
        flags += ["--skip-llamacpp"] if args.skip_llamacpp else []
        flags += ["--threads", str(args.threads)] if args.threads else []
    if name == "remote_vllm":
        flags += ["--skip-vllm"] if args.skip_vllm else []
        flags += ["--threads", str(args.threads)] if args.threads else []
    if name == "gateway_overhead" and args.skip_litellm:
        flags.append("--skip-litellm")
    if name in ("throughput", "gateway_overhead", "remote_vllm") and args.no_install:
        flags.append("--no-install")
    return flags


def run_benchmark(name: str, flags: list[str]) -> dict[str, Any]:
    print(f"\n=== {name} {' '.join(flags)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", f"bench.{name}", *flags], cwd=common.ROOT)
    seconds = round(time.perf_counter() - start, 1)
    path = common.RESULTS_DIR / f"{name}.json"
    stale = path.is_file() and path.stat().st_mtime < time.time() - seconds - 1
    if done.returncode != 0 or not path.is_file() or stale:
        return {"ok": False, "rc": done.returncode, "seconds": seconds}
    return {"ok": True, "seconds": seconds, "goals": json.loads(path.read_text()).get("goals")}


def print_table(runs: dict[str, dict[str, Any]]) -> None:
    print("\n=== goals")
    for name, run in runs.items():
        if not run["ok"]:
            print(f"{name:18} FAILED (rc {run['rc']})")
            continue
        for key, g in (run.get("goals") or {}).items():
            if not isinstance(g, dict):
                continue
            if "skipped" in g:
                print(f"{name:18} {key:24} skipped: {str(g['skipped'])[:80]}")
            else:
                mark = "met" if g.get("met") else "NOT met"
                print(f"{name:18} {key:24} {g.get('value')!s:>8} (target {g['target']:.3g}) {mark}")


def main() -> int:
    args = parse_args()
    names = args.only or BENCHMARKS
    venvs = install_baselines(args, names)
    runs = {name: run_benchmark(name, flags_for(name, args)) for name in names}
    print_table(runs)
    if all((common.RESULTS_DIR / f"{n}.json").is_file() for n in CAPACITY_INPUTS):
        print("\n=== capacity (bench/capacity.py)", flush=True)
        subprocess.run([sys.executable, "-m", "bench.capacity"], cwd=common.ROOT)
    summary = {"quick": args.quick, "venvs": venvs, "runs": runs}
    common.write_result("summary", summary)
    return 0 if all(r["ok"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
