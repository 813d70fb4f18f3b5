"""Decode tokens/s at one thread vs all cores, alone and beside a CPU hog, spinning vs
passive OpenMP waits: what `--threads auto` and the entry points' OMP defaults are for.

Each configuration runs in its own process, because libgomp reads OMP_WAIT_POLICY and
GOMP_SPINCOUNT once, when torch loads it:
- wait "spin": neither variable set (libgomp's default: ~300,000 spins at a barrier, the
  engine's behaviour before engine/omp_env.py), "passive": engine/omp_env.py's defaults
  (PASSIVE, spin count 0), "passive_spin": PASSIVE with a short spin (GOMP_SPINCOUNT=10000);
- hog off / on: a busy-loop process pinned to one core, as a neighbour sharing the machine;
- threads 1, all cores, and auto (engine/thread_choice.py: what it picked, and its rate).
Every figure's baselines are in the same run; the whole matrix runs --repeats times, one
configuration after another, and each figure is the median of its repeats (the runs are all
kept); ratios are taken within one hog setting.
Others share this machine too: machine.load_average in the JSON says how busy it was.

    python -m bench.threads [--quick] [--batch 8] [--steps 24]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import common
from engine.omp_env import USER_KNOBS, set_omp_defaults
from engine.thread_choice import usable_cores

WAITS = ("spin", "passive", "passive_spin")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer timed steps")
    p.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    p.add_argument("--steps", type=int, help="timed decode steps (default 24, quick 12)")
    p.add_argument("--model", default=common.MODEL)
    p.add_argument("--repeats", type=int, help="runs of the whole matrix (default 3, quick 1)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # threads for one child run: N or auto
    return p.parse_args()


def child(args: argparse.Namespace) -> None:
    """One engine at the given threads: its decode rate, printed as one JSON line."""
    from bench import engine_driver as ed

    threads = None if args.child == "auto" else int(args.child)
    engine = ed.make_engine(
        model=args.model, kv_cache_bytes=64 << 20, num_threads=threads, max_num_seqs=args.batch
    )
    ed.warm_up(engine, [1, 2, 3, 4, 5, 6, 7, 8])
    prompts = [[100 + (7 * i + j) % 1000 for j in range(64)] for i in range(args.batch)]
    rate = ed.decode_rate(engine, prompts, args.steps)
    choice = engine.runner.threads
    print(json.dumps({**rate, "threads": choice.threads, "how": choice.how, **choice.info()}))


def run_child(args: argparse.Namespace, threads: str, wait: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    if wait == "passive":
        set_omp_defaults(env)
    elif wait == "passive_spin":
        env |= {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}
    command = [sys.executable, "-m", "bench.threads", "--child", threads]
    command += ["--batch", str(args.batch), "--steps", str(args.steps), "--model", args.model]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextmanager
def hog(on: bool) -> Iterator[None]:
    """A busy loop pinned to the last core while the block runs (nothing when off)."""
    if not on:
        yield
        return
    core = max(os.sched_getaffinity(0))
    spin = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def ratios(runs: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """Within each hog setting, on the medians: all cores / one thread per wait, each wait /
    spin per threads, auto / the better fixed count."""
    rate = medians(runs)
    out: dict[str, Any] = {}
    for h in ("off", "on"):
        for w in WAITS:
            out[f"hog_{h}_{w}_all_cores_vs_one"] = common.ratio(
                rate[(h, w, str(cores))], rate[(h, w, "1")]
            )
        for w in WAITS[1:]:
            for t in ("1", str(cores)):
                out[f"hog_{h}_threads_{t}_{w}_vs_spin"] = common.ratio(
                    rate[(h, w, t)], rate[(h, "spin", t)]
                )
        best = max(rate[(h, "passive", "1")], rate[(h, "passive", str(cores))])
        out[f"hog_{h}_auto_vs_best_fixed"] = common.ratio(rate[(h, "passive", "auto")], best)
    return out


def medians(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """Median decode tokens/s per (hog, wait, asked threads) over the repeats."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in runs:
        by.setdefault((r["hog"], r["wait"], r["asked"]), []).append(r["tokens_per_s"])
    return {k: round(statistics.median(v), 1) for k, v in by.items()}


def matrix(args: argparse.Namespace, cores: int, repeat: int) -> list[dict[str, Any]]:
    """Every configuration once: hog off, then on."""
    runs = []
    for on in (False, True):
        with hog(on):
            for wait in WAITS:
                for threads in ("1", str(cores), *(("auto",) if wait == "passive" else ())):
                    r = run_child(args, threads, wait)
                    r |= {"hog": "on" if on else "off", "wait": wait, "asked": threads}
                    r["repeat"] = repeat
                    print(
                        f"[{repeat}] hog {r['hog']:3} wait {wait:9} threads {threads:4} -> "
                        f"{r['threads']}: {r['tokens_per_s']:.1f} tok/s",
                        flush=True,
                    )
                    runs.append(r)
    return runs


def main() -> None:
    args = parse_args()
    args.steps = args.steps or (12 if args.quick else 24)
    if args.child:
        child(args)
        return
    args.repeats = args.repeats or (1 if args.quick else 3)
    cores = usable_cores()
    runs = [r for i in range(args.repeats) for r in matrix(args, cores, i)]
    result = {
        "workload": {
            "model": args.model,
            "batch": args.batch,
            "timed_steps": args.steps,
            "repeats": args.repeats,
        },
        "cores": cores,
        "passive_env": set_omp_defaults({}),
        "median_tokens_per_s": {" ".join(k): v for k, v in medians(runs).items()},
        "runs": runs,
        "ratios": ratios(runs, cores),
    }
    print(json.dumps(result["ratios"], indent=1))
    common.write_result("threads", result)


if __name__ == "__main__":
    main()
