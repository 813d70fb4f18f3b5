"""The `nli` verifier's model pass: the rewritten graph (gateway/cache/nli_graph.py), whole
and cut in two (gateway/cache/length_split.py, what the verifier runs), against the
package's graph with only its width opened, on the same word pieces.

    python -m bench.nli_graph [--quick] [--pairs N]

Both directions of the first N pairs of the train split of
training/data/cache_pairs_real/pairs.jsonl, each read as the verifier reads it. The
graphs alternate pass by pass on one core, so that load on the machine falls on all alike;
each length's prelude runs in the warm-up, as a running gateway's is kept per length.
Figures: CPU ms per pass of each (median over passes), their ratios, the word pieces per
pass, and whether every logit came out bit for bit the same (the rewrites' promise). The
rewritten graphs' CPU includes their two extra outputs, the states the nli head reads.
`new_length`: what a length not kept costs the cut graph, its prelude outputs read out of
the reference length's (length_windows.py) against the prelude run (its outputs alone,
without wrapping them for the data graph), at each length the passes meet, alternating.
"""

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from gateway.cache.length_split import LengthSplitSession
from gateway.cache.nli_graph import LENGTH_ONLY, fast_graph, open_width, split_graph
from gateway.cache.nli_scores import ASKED, NliScores, package_dir
from gateway.embedding.onnx_backend import one_core_session
from training.artifacts import REAL_PAIRS

GOAL_RATIO = 0.9  # the rewrite is worth keeping only if it saves a tenth of a pass


def open_width_graph(source: Path, target: Path) -> None:
    import onnx

    model = onnx.load(str(source))
    open_width(model.graph)
    onnx.save(model, str(target))


def word_pieces(limit: int) -> list[np.ndarray]:
    rows = [json.loads(line) for line in REAL_PAIRS.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["split"] == "train"][:limit]
    tokenizer = NliScores()._tokenizer
    return [
        np.array([tokenizer.encode(ASKED.format(p), ASKED.format(h)).ids], dtype=np.int64)
        for r in rows
        for p, h in ((r["a"], r["b"]), (r["b"], r["a"]))
    ]


def cpu_ms(run: Callable[[dict], list], ids: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.process_time()
    logits = run({"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    return (time.process_time() - start) * 1000, logits


def contestants(tmp: Path) -> tuple[dict[str, Callable[[dict], list]], LengthSplitSession]:
    """Each graph's pass, by name: the package's (width opened), the rewritten one, and the
    rewritten one cut in two (length_split.py); and the cut one's session."""
    source = package_dir() / "policy_nli_int8.onnx"
    open_width_graph(source, tmp / "open.onnx")
    fast_graph(source, tmp / "fast.onnx")
    split_graph(source, tmp / "prelude.onnx", tmp / "data.onnx")
    baseline, rewritten = one_core_session(tmp / "open.onnx"), one_core_session(tmp / "fast.onnx")
    split = LengthSplitSession(tmp / "prelude.onnx", tmp / "data.onnx", LENGTH_ONLY)
    runs = {
        "baseline": lambda feed: baseline.run(None, feed),
        "rewritten": lambda feed: rewritten.run(None, feed),
        "split": split.run,
    }
    return runs, split


def new_length(split: LengthSplitSession, lengths: list[int]) -> dict[str, Any]:
    """CPU ms to make a length's prelude outputs: read out of windows, or the prelude run."""
    read_ms, run_ms = [], []
    for length in lengths:
        start = time.process_time()
        split._run_prelude(length)
        read_ms.append((time.process_time() - start) * 1000)
        start = time.process_time()
        split._whole_prelude(length)
        run_ms.append((time.process_time() - start) * 1000)
    return {
        "lengths": len(lengths),
        "read_cpu_ms_p50": round(statistics.median(read_ms), 3),
        "prelude_run_cpu_ms_p50": round(statistics.median(run_ms), 3),
        "ratio_paired_median": paired(read_ms, run_ms),
    }


def measure(passes: list[np.ndarray]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs, split = contestants(Path(tmp))
    for ids in passes:  # warm each, and the split graph's prelude at each length
        for run in runs.values():
            cpu_ms(run, ids)
    ms: dict[str, list[float]] = {name: [] for name in runs}
    same = {name: True for name in runs}
    for ids in passes:  # alternating pass by pass: load falls on each alike
        reference = None
        for name, run in runs.items():
            took, logits = cpu_ms(run, ids)
            ms[name].append(took)
            reference = logits if reference is None else reference
            same[name] = same[name] and np.array_equal(logits, reference)
    base = statistics.median(ms["baseline"])
    result: dict[str, Any] = {
        "passes": len(passes),
        "word_pieces_median": statistics.median(ids.shape[1] for ids in passes),
    }
    for name in runs:
        result[f"{name}_cpu_ms_p50"] = round(statistics.median(ms[name]), 3)
    for name in ("rewritten", "split"):
        result[f"{name}_ratio_of_medians"] = common.ratio(statistics.median(ms[name]), base)
        result[f"{name}_ratio_paired_median"] = paired(ms[name], ms["baseline"])
        result[f"{name}_logits_bit_for_bit"] = same[name]
    result["split_vs_rewritten_paired_median"] = paired(ms["split"], ms["rewritten"])
    result["new_length"] = new_length(split, sorted({ids.shape[1] for ids in passes}))
    return result


def paired(ms: list[float], base: list[float]) -> float:
    """Each pass's own ratio, median: a burst of load moves numerator and denominator."""
    return round(statistics.median(m / b for m, b in zip(ms, base, strict=True) if b > 0), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 pairs")
    parser.add_argument("--pairs", type=int, default=400, help="train pairs, both directions")
    args = parser.parse_args()
    result = measure(word_pieces(100 if args.quick else args.pairs))
    result["goals"] = {
        f"{name}_{goal}": value
        for name in ("rewritten", "split")
        for goal, value in (
            (
                "ratio",
                common.goal(
                    result[f"{name}_ratio_paired_median"], GOAL_RATIO, higher_is_better=False
                ),
            ),
            ("logits_bit_for_bit", common.goal(float(result[f"{name}_logits_bit_for_bit"]), 1.0)),
        )
    }
    result["goals"]["split_vs_rewritten"] = common.goal(
        result["split_vs_rewritten_paired_median"], GOAL_RATIO, higher_is_better=False
    )
    result["goals"]["new_length_read_vs_run"] = common.goal(
        result["new_length"]["ratio_paired_median"], GOAL_RATIO, higher_is_better=False
    )
    print(json.dumps(result, indent=2))
    common.write_result("nli_graph", result)


if __name__ == "__main__":
    main()
