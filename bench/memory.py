"""Engine resident memory (RSS) with SmolLM2 and its KV pool, vs the configured KV budget.

Each budget runs in a fresh child process (RSS never shrinks back within one), which reports
RSS after importing torch, after building the engine, and after a workload that fills most
of the pool. The pool's real cost is the RSS difference between two budgets divided by the
budget difference: 1.0 means the engine keeps to its budget, more means hidden per-token
memory (measured at build time, and after the workload, where the larger run's bigger
batches add activations). Peak RSS (VmHWM) is reported too.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import common

MIB = 1024 * 1024


def rss_mib() -> dict[str, float]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return fields


def child(budget_mib: int) -> dict[str, Any]:
    """Runs in the child: build the engine at the budget, fill ~90% of its pool, measure."""
    import torch  # noqa: F401  (the baseline every engine process pays)

    from bench import engine_driver as ed

    marks = {"after_import": rss_mib()}
    engine = ed.make_engine(kv_cache_bytes=budget_mib * MIB)
    marks["after_engine"] = rss_mib()
    slots = engine.num_pages * engine.page_size
    prompt_len, output = 480, 16  # 496 tokens each: 31 pages of 16
    count = max(1, int(slots * 0.9) // (prompt_len + output))
    prompts = [[(1000 + 37 * i + j) % 40000 + 100 for j in range(prompt_len)] for i in range(count)]
    ed.run_requests(engine, prompts, [output] * count)
    marks["after_workload"] = rss_mib()
    dims = ed.model_dims()
    return {
        "budget_mib": budget_mib,
        "num_pages": engine.num_pages,
        "page_size": engine.page_size,
        "pool_mib": round(slots * dims.kv_bytes_per_token / MIB, 1),
        "requests": count,
        "rss_mib": {k: round(v["VmRSS"], 1) for k, v in marks.items()},
        "peak_rss_mib": round(marks["after_workload"]["VmHWM"], 1),
        "weights_fp32_mib": round(weights_bytes(dims) / MIB, 1),
    }


def weights_bytes(dims: Any) -> int:
    norms = (2 * dims.layers + 1) * dims.hidden
    return 4 * (dims.matmul_params + norms)  # tied embeddings: the LM head is the embedding


def run_child(budget_mib: int) -> dict[str, Any]:
    code = (
        "import json; from bench import memory;"
        f"print('RESULT ' + json.dumps(memory.child({budget_mib})))"
    )
    # From the repository root: `-c` puts the working folder first, so `bench` imports.
    run = [sys.executable, "-c", code]
    done = subprocess.run(run, capture_output=True, text=True, cwd=common.ROOT)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"memory child failed (rc {done.returncode}): {done.stderr[-2000:]}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="budgets 32 and 128 MiB")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    small, large = (32, 128) if args.quick else (64, 256)
    runs = [run_child(small), run_child(large)]
    for r in runs:
        print(f"budget {r['budget_mib']} MiB: {r}", flush=True)
    a, b = runs
    pool_diff = b["pool_mib"] - a["pool_mib"]
    # At build time the difference is the pool alone; after the workload it also holds the
    # larger run's bigger activations and allocator caches (it served more requests at once).
    at_build = (b["rss_mib"]["after_engine"] - a["rss_mib"]["after_engine"]) / pool_diff
    grown = b["rss_mib"]["after_workload"] - a["rss_mib"]["after_workload"]
    marginal = grown / pool_diff
    base = b["rss_mib"]["after_import"]
    over = b["rss_mib"]["after_workload"] - base - b["weights_fp32_mib"] - b["pool_mib"]
    result = {
        "runs": runs,
        "rss_per_budget_byte_at_build": round(at_build, 3),  # 1.0: the pool costs its budget
        "rss_per_budget_byte_after_workload": round(marginal, 3),
        "largest": {
            "rss_mib": b["rss_mib"]["after_workload"],
            "budget_mib": b["budget_mib"],
            "rss_over_import_weights_and_pool_mib": round(over, 1),
        },
    }
    print(f"RSS growth per KV budget byte: {at_build:.3f} at build, {marginal:.3f} after work")
    print(f"largest run: {result['largest']}")
    common.write_result("memory", result)


if __name__ == "__main__":
    main()
