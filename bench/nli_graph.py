"""The `nli` verifier's model pass: the rewritten graph (gateway/cache/nli_graph.py) against
the package's graph with only its width opened, on the same word pieces.

    python -m bench.nli_graph [--quick] [--pairs N]

Both directions of the first N pairs of the train split of
training/data/cache_pairs_real/pairs.jsonl, each read as the verifier reads it. The two
graphs alternate pass by pass on one core, so that load on the machine falls on both alike.
Figures: CPU ms per pass of each (median over passes), their ratio, the word pieces per
pass, and whether every logit came out bit for bit the same (the rewrite's promise). The
rewritten graph's CPU includes its two extra outputs, the states the nli head reads.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from gateway.cache.nli_graph import fast_graph, open_width
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


def cpu_ms(session: Any, ids: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.process_time()
    logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    return (time.process_time() - start) * 1000, logits


def measure(passes: list[np.ndarray]) -> dict:
    source = package_dir() / "policy_nli_int8.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        open_width_graph(source, Path(tmp) / "open.onnx")
        fast_graph(source, Path(tmp) / "fast.onnx")
        baseline = one_core_session(Path(tmp) / "open.onnx")
        rewritten = one_core_session(Path(tmp) / "fast.onnx")
    for ids in passes[:5]:  # warm both
        cpu_ms(baseline, ids), cpu_ms(rewritten, ids)
    base_ms, fast_ms, same = [], [], True
    for ids in passes:
        b, base_logits = cpu_ms(baseline, ids)
        f, fast_logits = cpu_ms(rewritten, ids)
        base_ms.append(b)
        fast_ms.append(f)
        same = same and np.array_equal(base_logits, fast_logits)
    base, fast = statistics.median(base_ms), statistics.median(fast_ms)
    # paired: each pass's own ratio, so that a burst of load moves numerator and denominator
    paired = statistics.median(f / b for f, b in zip(fast_ms, base_ms, strict=True) if b > 0)
    return {
        "passes": len(passes),
        "word_pieces_median": statistics.median(ids.shape[1] for ids in passes),
        "baseline_cpu_ms_p50": round(base, 3),
        "rewritten_cpu_ms_p50": round(fast, 3),
        "ratio_of_medians": common.ratio(fast, base),
        "ratio_paired_median": round(paired, 3),
        "logits_bit_for_bit": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 pairs")
    parser.add_argument("--pairs", type=int, default=400, help="train pairs, both directions")
    args = parser.parse_args()
    result = measure(word_pieces(100 if args.quick else args.pairs))
    result["goals"] = {
        "ratio": common.goal(result["ratio_paired_median"], GOAL_RATIO, higher_is_better=False),
        "logits_bit_for_bit": common.goal(float(result["logits_bit_for_bit"]), 1.0),
    }
    print(json.dumps(result, indent=2))
    common.write_result("nli_graph", result)


if __name__ == "__main__":
    main()
