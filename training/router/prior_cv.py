"""Choose the prior's settings (C, the kernel's weight, width and word share) by 5-fold CV on
the `train` rows of training/data/router_real/prompts.jsonl only; the held-out rows are not
read here.

    python -m training router prior-cv

Per setting, on out-of-fold scores pooled over the folds: the length-matched AUC of hard
(benchmark grade >= 0.8) against everyday rows cut to 60-400 characters (as
bench/router_eval.py measures the held-out rows) and Spearman's rho against the graded
score on every row. Chosen: among the settings whose scoring fits the 1 ms p99 budget (the
kernel's word term does not, on long real prompts, nor a kernel over all 4,816 examples on
a loaded machine: bench/router_eval.py; 1,500 centres or fewer do), the best matched AUC,
ties (within 0.005 of the best) broken by rho.
Writes training/reports/router_prior_cv.json.
"""

import argparse
import json

import numpy as np
from scipy.stats import spearmanr
from sklearn.model_selection import KFold

from gateway.embedding.embedder import Embedder
from gateway.routing.difficulty import (
    embeddings_of,
    example_signals,
    fit_kernel,
    train_classifier,
)
from training.artifacts import write_report
from training.router.metrics import auc
from training.router.real_prompts import REAL_PROMPTS, read_real_prompts

FOLDS, SEED = 5, 10
CS = (1.0,)  # C = 10 scored below C = 1 at every kernel setting of the first run
# kernel blend weight (classifier 1), width, word share, centres (None: every example)
KERNELS = (
    (0.0, 0.5, 0.0, None),
    (3.0, 0.5, 0.7, None),
    (3.0, 0.5, 0.3, None),
    (3.0, 0.5, 0.0, None),
    (3.0, 0.3, 0.0, None),
    (3.0, 0.5, 0.0, 1000),
    (3.0, 0.5, 0.0, 1500),
)
RIDGE = 0.3
MODEL = "all-MiniLM-L6-v2"
MAX_CENTRES = 1500


def binary(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Indices and labels of the hard/everyday rows cut to 60-400 characters."""
    idx, labels = [], []
    for i, r in enumerate(rows):
        if not 60 <= len(r["prompt"]) <= 400:
            continue
        hard = r["source"] not in ("sharegpt", "gsm8k") and r["score"] >= 0.8
        easy = r["source"] in ("bigbench_easy", "nq") or (
            r["source"] == "sharegpt" and r["score"] <= 0.45
        )
        if hard or easy:
            idx.append(i), labels.append(int(hard))
    return np.array(idx), np.array(labels)


def out_of_fold(prompts, vectors, signals, targets, c: float, kernel) -> np.ndarray:
    weight, width, lexical, centres = kernel
    out = np.zeros(len(prompts))
    for train, test in KFold(FOLDS, shuffle=True, random_state=SEED).split(prompts):
        clf = train_classifier(vectors[train], signals[train], targets[train], c)
        x = np.hstack((vectors[test], signals[test])).astype(np.float64)
        prob = 1.0 / (1.0 + np.exp(-(x @ clf.weights + clf.bias)))
        if weight == 0:
            out[test] = prob
            continue
        fold = [prompts[i] for i in train]
        term = fit_kernel(fold, vectors[train], targets[train], width, RIDGE, lexical, centres)
        near = np.array([term.predict(vectors[i], prompts[i]) for i in test])
        out[test] = (prob + weight * near) / (1 + weight)
    return out


def fits_the_budget(weight: float, width: float, lexical: float, centres: int | None) -> bool:
    """Measured in bench/router_eval.py (module docstring)."""
    return weight == 0 or (lexical == 0 and centres is not None and centres <= MAX_CENTRES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="*", help="KERNELS indices to run (all)")
    args = parser.parse_args(argv)
    kernels = [KERNELS[i] for i in args.only] if args.only else KERNELS
    rows = [r for r in read_real_prompts() if r["split"] == "train"]
    prompts = [r["prompt"] for r in rows]
    vectors = embeddings_of(prompts, MODEL, Embedder(MODEL).embed_many)
    signals = np.stack([example_signals(p).vector() for p in prompts])
    targets = np.array([r["score"] for r in rows])
    idx, labels = binary(rows)
    results = []
    for c in CS:
        for kernel in kernels:
            scores = out_of_fold(prompts, vectors, signals, targets, c, kernel)
            rho = float(spearmanr(scores, targets).statistic)
            result = {"c": c, "kernel": kernel, "matched_auc": auc(labels, scores[idx])}
            results.append(result | {"spearman": round(rho, 4)})
            print(json.dumps(results[-1]), flush=True)
    fits = [r for r in results if fits_the_budget(*r["kernel"])]
    top = max(r["matched_auc"] for r in fits)
    best = max((r for r in fits if r["matched_auc"] >= top - 0.005), key=lambda r: r["spearman"])
    report = {"rows": len(rows), "binary": len(idx), "results": results, "chosen": best}
    print(write_report("router_prior_cv", report, [REAL_PROMPTS]))
