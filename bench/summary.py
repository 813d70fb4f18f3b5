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


def _served(table: dict[str, Any], key: str) -> str:
    part = table[key]
    return f"{_pct(part['share'])} ({part['served']}/{part['pairs']})"


def cache_eval_rows(result: dict[str, Any]) -> list[Row]:
    """The default policy's cache and the other verifier models' (the aligned model, the
    nli model, the pair model) through a real cache, against the old default (the logistic
    verifier at the 0.8 floor), same run, same held-out pairs."""
    rows: list[Row] = []
    base = result["baseline"]
    for name in ("default", "aligned", "nli", "nli_balanced", "pair_model"):
        if name in result:  # runs before a model was added have none
            rows += _cache_rows(name, result[name], base)
    return rows


def _cache_rows(name: str, ours: dict[str, Any], base: dict[str, Any]) -> list[Row]:
    new, old = ours["served"], base["served"]
    s = ours["settings"]
    tag = f"{name} ({s['verifier_model']} {s['verifier']}, floor {s['min_similarity']})"
    rows: list[Row] = []
    for key, label in (
        ("should_hit", "should-hit served (paraphrase + near repeat)"),
        ("paraphrase", "paraphrases served"),
        ("near_repeat", "near repeats served"),
        ("exact_repeat", "exact repeats served"),
        ("must_not", "must-not served"),
    ):
        ratio = _ratio(new[key]["share"], old[key]["share"]) if key != "must_not" else ""
        rows.append((f"{tag}: {label}", _served(new, key), _served(old, key), ratio))
    for cat in ("negation", "number", "entity", "scope", "antonym", "unrelated"):
        rows.append((f"{tag}: must-not {cat}", _served(new, cat), _served(old, cat), ""))
    rows.append(
        (
            f"{tag}: must-not served, upper 95% bound (Clopper-Pearson)",
            _pct(new["must_not"]["upper_95"], 2),
            _pct(old["must_not"]["upper_95"], 2),
            "",
        )
    )
    rows.append(
        (
            f"{tag}: lookup p50 with the verifier (wall; CPU)",
            f"{ours['lookup_ms_p50']:.1f} ms; {ours['lookup_cpu_ms_p50']:.1f} ms",
            f"{base['lookup_ms_p50']:.1f} ms; {base['lookup_cpu_ms_p50']:.1f} ms",
            _ratio(ours["lookup_ms_p50"], base["lookup_ms_p50"]),
        )
    )
    if "lookup_ms_p90" in ours:  # older runs have none
        p90 = ours["lookup_ms_p90"], base["lookup_ms_p90"]
        rows.append((f"{tag}: lookup p90 (wall)", f"{p90[0]:.1f} ms", f"{p90[1]:.1f} ms", ""))
    return rows + _later_set_rows(tag, ours, base)


# The later held-out sets (older runs have none), and what a row calls them.
LATER_SETS = (
    ("served_heldout2", "heldout2 (written after the models)"),
    ("served_combined", "held-out + heldout2"),
    ("served_heldout3", "heldout3 (written after 2026-12-03's models)"),
    ("served_heldout4", "heldout4 (written beside train2 on 2026-12-03)"),
    ("served_heldout5", "heldout5 (written beside train3 on 2026-12-04)"),
    ("served_heldout6", "heldout6 (written beside train4 on 2026-12-04)"),
    ("served_all", "all held-out sets"),
)
PER_CATEGORY = (
    "served_heldout2",
    "served_heldout3",
    "served_heldout4",
    "served_heldout5",
    "served_heldout6",
)


def _later_set_rows(tag: str, ours: dict[str, Any], base: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for key, name in LATER_SETS:
        if key not in ours:
            continue
        new, old = ours[key], base[key]
        hit_ratio = _ratio(new["should_hit"]["share"], old["should_hit"]["share"])
        rows.append(
            (f"{tag}: {name}, should-hit served", *_pair(new, old, "should_hit"), hit_ratio)
        )
        if key in PER_CATEGORY:
            for cat in ("paraphrase", "near_repeat"):
                label = f"{tag}: {name}, {cat.replace('_', ' ')}s served"
                rows.append((label, *_pair(new, old, cat), ""))
            for cat in ("negation", "number", "entity", "scope", "antonym"):
                label = f"{tag}: {name}, must-not {cat}"
                rows.append((label, *_pair(new, old, cat), ""))
        bound = f"{_pct(new['must_not']['upper_95'], 2)} upper 95%"
        old_bound = f"{_pct(old['must_not']['upper_95'], 2)} upper 95%"
        rows.append(
            (
                f"{tag}: {name}, must-not served (Clopper-Pearson bound)",
                f"{_served(new, 'must_not')}, {bound}",
                f"{_served(old, 'must_not')}, {old_bound}",
                "",
            )
        )
    return rows


def _pair(new: dict[str, Any], old: dict[str, Any], key: str) -> tuple[str, str]:
    return _served(new, key), _served(old, key)


def embedder_compare_rows(result: dict[str, Any]) -> list[Row]:
    """Each embedder's separation of the people's pairs and its CPU, against the gateway's."""
    runs = result["results"]
    base_key = "minilm" if "minilm" in runs else next(iter(runs))
    base = runs[base_key]
    rows: list[Row] = []
    for key, run in runs.items():
        human, cpu = run["human"], run["cpu"]
        label = f"{run['name']} ({run['backend']})"
        rows.append(
            (
                f"{label}: cosine ROC AUC, should-hit vs must-not ({result['split']} split)",
                f"{human['roc_auc']:.3f}",
                "" if key == base_key else f"{base['name']}: {base['human']['roc_auc']:.3f}",
                "" if key == base_key else _ratio(human["roc_auc"], base["human"]["roc_auc"]),
            )
        )
        rows.append(
            (
                f"{label}: should-hit served by a threshold at <= 1% must-not",
                _pct(human["should_hit_served"]),
                "" if key == base_key else _pct(base["human"]["should_hit_served"]),
                "",
            )
        )
        rows.append(
            (
                f"{label}: CPU ms per query, batch 1",
                f"{cpu['batch1_cpu_ms_p50']:.1f}",
                "" if key == base_key else f"{base['cpu']['batch1_cpu_ms_p50']:.1f}",
                ""
                if key == base_key
                else _ratio(cpu["batch1_cpu_ms_p50"], base["cpu"]["batch1_cpu_ms_p50"]),
            )
        )
    rows.append(("best within the lookup budget", result["best_within_budget"], "", ""))
    return rows


def nli_graph_rows(result: dict[str, Any]) -> list[Row]:
    """The rewritten NLI graph's CPU per pass, whole and cut in two, against the
    package's with its width opened."""
    rows = []
    for name, label in (("rewritten", "rewritten"), ("split", "rewritten, cut in two")):
        rows.append(
            (
                f"CPU ms per NLI pass, {label}, median of {result['passes']} "
                f"({result['word_pieces_median']:.0f} word pieces median)",
                f"{result[f'{name}_cpu_ms_p50']:.2f}",
                f"{result['baseline_cpu_ms_p50']:.2f}",
                f"{result[f'{name}_ratio_paired_median']:.3f} (paired)",
            )
        )
        rows.append(
            (f"{label}: every logit bit for bit", str(result[f"{name}_logits_bit_for_bit"]), "", "")
        )
    return rows


def cache_populated_rows(result: dict[str, Any]) -> list[Row]:
    """Held-out lookups in one populated scope: nli (every candidate read), nli with
    `model_reads: 1` against it (same run), and the default policy."""
    rows: list[Row] = []
    for name, base_name in (
        ("nli_balanced", None),
        ("nli_balanced_one_read", "nli_balanced"),
        ("default", None),
    ):
        run, base = result[name], result[base_name] if base_name else None
        for label, figure in (
            ("should-hit served right (own or joined)", _served_right),
            ("wrong hits known, of all lookups (upper 95%)", _wrong_known),
            ("hits not judged", lambda r: str(r["wrong"]["unjudged"])),
        ):
            rows.append((f"{name}: {label}", figure(run), figure(base) if base else "", ""))
    return rows


def _served_right(run: dict[str, Any]) -> str:
    hit = run["should_hit"]
    return f"{hit['served_own'] + hit['served_joined']}/{hit['pairs']}"


def _wrong_known(run: dict[str, Any]) -> str:
    wrong = run["wrong"]
    return f"{wrong['known']}/{wrong['lookups']} ({wrong['upper_95']})"


def cache_followups_rows(result: dict[str, Any]) -> list[Row]:
    """Follow-ups served another conversation's answer, against a last-message-only key."""
    phases = result["phases"]
    base = phases["baseline_last_message_only"]
    rows: list[Row] = []
    for name in ("replay", "transplant"):
        t = phases[name]
        rows.append(
            (
                f"{name}: cross-conversation hits, of {t['requests']} requests",
                str(t["cross_conversation_hits"]),
                f"keyed on the last message: {base['cross_conversation_hits']} "
                f"of {base['requests']}",
                "",
            )
        )
    repeat = phases["repeat"]
    rows.append(("the same conversations again: served", _pct(repeat["served_rate"]), "", ""))
    return rows


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
    "holds their stored questions and the train pairs' questions; baseline: nli (balanced, "
    "floor 0.4) reading every candidate, against the same with cache.model_reads 1. A hit "
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
