"""docs/benchmarks.md from the committed, dated results in bench/reports/YYYY-MM-DD/NAME.json.

A benchmark writes its scratch result to bench/results/NAME.json (git-ignored); `--keep
NAME` copies it into bench/reports/ under the date it was measured, so the figures the
docs cite can be checked from the repository. Every run of this script rewrites the page
from the JSON alone: nothing on it is typed by hand.

    python -m bench.summary [--keep NAME ...]
"""

import argparse
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.summary_cache import (
    cache_eval_rows,
    cache_followups_rows,
    cache_populated_rows,
    embedder_compare_rows,
    nli_graph_rows,
)
from bench.summary_engine import (
    amx_gemm_rows,
    kv_dtype_rows,
    kv_utilization_rows,
    threads_rows,
    throughput_rows,
)
from bench.summary_format import Row, _pct, _ratio
from bench.summary_router import router_learn_eval_rows

REPORTS_DIR = common.ROOT / "bench" / "reports"
PAGE = common.ROOT / "docs" / "benchmarks.md"


def stream_resume_rows(result: dict[str, Any]) -> list[Row]:
    """Killed streams resumed: the text against the uninterrupted one, the resume's gap
    against the gap between pieces, the stream's time against its uninterrupted time."""
    gap, seconds = result["resume_gap_s"], result["stream_seconds"]
    base_gap = gap["baseline_gap_between_pieces_median"]
    return [
        (
            f"killed streams ({result['streams']}) with the uninterrupted text",
            _pct(result["equal_share"]),
            "the same requests, uninterrupted",
            "",
        ),
        (
            "gap at the resume (median / p90)",
            f"{gap['median']:.3f} s / {gap['p90']:.3f} s",
            f"{base_gap:.3f} s between pieces",
            _ratio(gap["median"], base_gap),
        ),
        (
            "a stream's extra time (median)",
            f"{seconds['extra_median']:.3f} s",
            f"{seconds['baseline_median']:.3f} s uninterrupted",
            "",
        ),
    ]


# Benchmarks whose JSON has a same-run baseline worth a row of its own; the others show
# their goals (value against target).
def batch_idle_rows(result: dict[str, Any]) -> list[Row]:
    """Interactive latency while a batch runs, against the same traffic without it."""
    during, without = result["interactive"]["during_batch"], result["interactive"]["without_batch"]
    batch = result["batch"]
    rows: list[Row] = [
        (
            f"interactive {q} latency during the batch ({during['requests']} / "
            f"{without['requests']} requests)",
            f"{during[f'{q}_s']:.2f} s",
            f"{without[f'{q}_s']:.2f} s without",
            _ratio(during[f"{q}_s"], without[f"{q}_s"]),
        )
        for q in ("p50", "p95")
    ]
    counts = batch["request_counts"]
    done = f"{batch['status']}, {counts['completed']} / {counts['total']} answered"
    rows.append((f"batch of {batch['lines']} lines", f"{batch['seconds']} s ({done})", "", ""))
    return rows


ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "kv_dtype": kv_dtype_rows,
    "amx_gemm": amx_gemm_rows,
    "batch_idle": batch_idle_rows,
    "kv_utilization": kv_utilization_rows,
    "threads": threads_rows,
    "cache_eval": cache_eval_rows,
    "embedder_compare": embedder_compare_rows,
    "nli_graph": nli_graph_rows,
    "cache_followups": cache_followups_rows,
    "cache_populated": cache_populated_rows,
    "stream_resume": stream_resume_rows,
    "router_learn_eval": router_learn_eval_rows,
    "throughput": throughput_rows,
}


# What a reader must know before trusting a benchmark's figures.
NOTES: dict[str, str] = {
    "cache_eval": "Held-out split of the pairs written by people (never trained or tuned on), "
    "heldout2 (hand-written after the 2026-12-02 models were fixed) and, from 2026-12-03 on, "
    "heldout3 (hand-written after that day's models were fixed) and heldout4 (written beside "
    "train2, the extra train pairs of the models it judges), from 2026-12-04 15:00 on "
    "heldout5 (written beside train3), from 18:30 on heldout6 (written beside train4), "
    'each pair in its own scope; "all held-out sets" '
    "holds every set of its run; baseline: the old default, the logistic verifier at the "
    "0.8 floor.",
    "cache_populated": "The six held-out sets' new questions looked up in one scope that "
    "holds their stored questions and the train pairs' questions; nli_balanced is nli as "
    "recommended (balanced, floor 0.4; with cache.model_reads 1 since 2026-12-07), the "
    "baseline of its variant in the same run (every candidate read since then, one before). A hit "
    "on another question is right when should-hit pairs join the two, wrong when a must-not "
    "pair sets them apart (populated_judged.jsonl: the first run's other hits, judged).",
    "nli_graph": "Both directions of the people's train pairs as the nli verifier reads "
    "them; the three graphs alternate pass by pass on one core: only the ratio counts.",
    "embedder_compare": "Pairs written by people (train split only; the held-out split is "
    "never scored here).",
    "cache_followups": "Real ShareGPT conversations and their recorded answers; the "
    "upstream is a stand-in whose answer names the request that first got it.",
    "batch_idle": "Latencies on a shared, loaded machine: only the same-run ratio counts; the "
    "JSON keeps the batch-free phases before and after apart, to show the drift between them.",
    "kv_dtype": "SmolLM2-135M, fp32 weights; perplexity on bench/precision.py's pydoc text "
    "(generated reference text, not a held-out corpus), greedy over its 8 prompts x 32 tokens; "
    "decode rates on a shared machine: only the same-run ratio counts.",
    "stream_resume": "Prompts written for the benchmark: a figure of the mechanism (greedy "
    "continuation on a second engine), not of answer quality.",
    "router_learn_eval": "Real questions (the prior's held-out GSM8K, AIME and GPQA rows) "
    "answered by both bundled tiers, labelled by their reference answers: needs-large = the "
    "small tier wrong and the large one right. Each figure's second column is the prior.",
    "amx_gemm": "Speed ratio = our panels' time / oneDNN's (>1: oneDNN faster); random "
    "values on the bundled models' projection shapes, one thread. Without AMX oneDNN has "
    "no tiles: the AMX figures are to be taken on an AMX CPU.",
}


def goal_rows(result: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for key, g in (result.get("goals") or {}).items():
        if isinstance(g, dict) and "value" in g:
            met = "met" if g.get("met") else "not met"
            rows.append((f"goal `{key}`", str(g["value"]), f"target {g['target']}", met))
    return rows


def machine_line(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    load = m.get("loadavg") or []
    load_text = f", load average {load[0]:.1f} at the end" if load else ""
    return f"{m.get('cpu_model', 'unknown CPU')}, {m.get('cpus', '?')} cores{load_text}"


def section(date: str, path: Path) -> list[str]:
    result = json.loads(path.read_text())
    name = result.get("benchmark", path.stem)
    # throughput writes throughput_<weights>[_<model>]: one module, many result names
    module = "throughput" if name.startswith("throughput_") else name
    rows = ROWS.get(module, goal_rows)(result) + (goal_rows(result) if module in ROWS else [])
    rel = path.relative_to(common.ROOT)
    lines = [
        f"## `{name}` ({date})",
        "",
        f"`{result.get('command', f'python -m bench.{module}')}`; {machine_line(result)}; "
        f"[{path.name}](../{rel}).",
        "",
        *([NOTES[name], ""] if name in NOTES else []),
        "| figure | value | same-run baseline | ratio |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in rows]
    return [*lines, ""]


def render(reports: Path = REPORTS_DIR) -> str:
    head = [
        "# Benchmark results",
        "",
        "Generated by `python -m bench.summary` from the dated JSON in `bench/reports/`: do",
        "not edit by hand. What each benchmark measures and how to run it:",
        "[bench/README.md](../bench/README.md). Figures from earlier runs whose JSON was not",
        "kept are in [benchmark-log.md](benchmark-log.md).",
        "",
    ]
    body: list[str] = []
    for folder in sorted(reports.glob("????-??-??"), reverse=True):
        for path in sorted(folder.glob("*.json")):
            body += section(folder.name, path)
    return "\n".join(head + (body or ["No results kept yet.", ""]))


def keep(name: str) -> Path:
    """Copy a scratch result into bench/reports/ under the day it was measured."""
    source = common.RESULTS_DIR / f"{name}.json"
    measured = json.loads(source.read_text()).get("machine", {}).get("time", "")
    folder = REPORTS_DIR / (measured[:10] or "undated")
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(source, folder / source.name))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keep", nargs="+", default=[], help="bench/results/NAME.json to keep")
    args = p.parse_args()
    for name in args.keep:
        print(f"kept {keep(name)}")
    PAGE.write_text(render())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
