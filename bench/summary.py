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

REPORTS_DIR = common.ROOT / "bench" / "reports"
PAGE = common.ROOT / "docs" / "benchmarks.md"
# figure, value, same-run baseline, ratio (value / baseline, or "" where none applies)
Row = tuple[str, str, str, str]


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline else ""


def _cosine_at(result: dict[str, Any], threshold: float) -> dict[str, Any]:
    curve = result["test"]["cosine_alone"]["curve"]
    return min(curve, key=lambda point: abs(point["threshold"] - threshold))


def cache_eval_rows(result: dict[str, Any]) -> list[Row]:
    """The verifier's operating points against cosine alone on the same held-out pairs."""
    points = result["test"]["verifier"]["operating_points"]
    best_cosine = result["test"]["cosine_alone"]["best_at_1pct_wrong"]
    cosine_80, cosine_95 = _cosine_at(result, 0.80), _cosine_at(result, 0.95)
    rows: list[Row] = []
    for name in ("strict", "balanced", "lenient"):
        p = points[name]
        rows.append(
            (
                f"`{name}`: hits / wrong hits ({p['should_hit']} / {p['must_not']} test pairs)",
                f"{_pct(p['hit_rate'])} / {_pct(p['wrong_hit_rate'], 2)}",
                f"cosine >= 0.80: {_pct(cosine_80['hit_rate'])} / "
                f"{_pct(cosine_80['wrong_hit_rate'])}; >= 0.95: {_pct(cosine_95['hit_rate'])}"
                f" / {_pct(cosine_95['wrong_hit_rate'])}",
                "",
            )
        )
    strict = points["strict"]["hit_rate"]
    rows.append(
        (
            "hits at <= 1% wrong hits (`strict`)",
            _pct(strict),
            f"cosine alone at its best such threshold: {_pct(best_cosine['hit_rate'])}",
            _ratio(strict, best_cosine["hit_rate"]),
        )
    )
    speed = result.get("speed", {})
    if "embed_one_query_us_p50" in speed and "embed_one_query_us_p50_torch" in speed:
        onnx, torch = speed["embed_one_query_us_p50"], speed["embed_one_query_us_p50_torch"]
        rows.append(
            (
                "one query's embedding, p50 (ONNX Runtime)",
                f"{onnx / 1000:.1f} ms",
                f"torch: {torch / 1000:.1f} ms",
                f"{torch / onnx:.2f}x faster",
            )
        )
    if "verify_us_p50" in speed:
        rows.append(
            ("verifier, one pair of new texts, p50", f"{speed['verify_us_p50']:.0f} µs", "", "")
        )
    return rows


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


# Benchmarks whose JSON has a same-run baseline worth a row of its own; the others show
# their goals (value against target).
ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "cache_eval": cache_eval_rows,
    "embedder_compare": embedder_compare_rows,
    "cache_followups": cache_followups_rows,
}


# What a reader must know before trusting a benchmark's figures.
NOTES: dict[str, str] = {
    "cache_eval": "Pairs made by rule-based edits of the generator that also trains the verifier: "
    "a unit test of the verifier, not a result on rewordings people write.",
    "embedder_compare": "Pairs written by people (train split only; the held-out split is "
    "never scored here).",
    "cache_followups": "Real ShareGPT conversations and their recorded answers; the "
    "upstream is a stand-in whose answer names the request that first got it.",
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
    rows = ROWS.get(name, goal_rows)(result) + (goal_rows(result) if name in ROWS else [])
    rel = path.relative_to(common.ROOT)
    lines = [
        f"## `{name}` ({date})",
        "",
        f"`python -m bench.{name}`; {machine_line(result)}; [{path.name}](../{rel}).",
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
