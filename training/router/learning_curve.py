"""Does the difficulty score still gain from more training tasks? A learning curve on the
`train` split only (the held-out split is not read).

    python -m training router learning-curve [--outcomes training/data/router_rates.jsonl]

The evaluation set stays fixed so that only the training size moves: 5-fold CV over every
train task, as training/router/label_cv.py does, but each fold's model is fitted on a random
`fraction` of its fitting tasks (seeded). The shipped score (the policy's blend of the
classifier and the kernel term, its C, width and ridge) is scored out of fold on every
train task; the figure is the length-matched ROC AUC of those pooled scores against the
`rate` label (label_cv.py's `auc_length_matched_pooled`; at fraction 1 it is that
figure for the shipped settings). Per fraction: mean and spread over fold seeds x
subsample seeds.

Writes training/reports/router_learning_curve.json (training/artifacts.py: REPORTS).
"""

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold

from gateway.embedding.embedder import Embedder
from gateway.policy import load_policy
from gateway.routing.difficulty import (
    embeddings_of,
    example_signals,
    fit_kernel,
    train_classifier,
)
from training.artifacts import ROOT, cpu_model, write_report
from training.router.label_cv import FOLDS, probabilities
from training.router.labels import SHIPPED_TARGET, TARGETS, rate_label
from training.router.metrics import auc, length_matched
from training.router.outcomes import RATES

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
FOLD_SEEDS = (10, 11, 12)
SUBSAMPLE_SEEDS = (0, 1, 2)


def out_of_fold(x, y, rate, prompts, fraction: float, fold_seed: int, sub_seed: int, settings):
    """Out-of-fold shipped-blend scores with each fold fitted on `fraction` of its tasks."""
    blend = settings.blend
    w_kernel = blend.kernel / (blend.classifier + blend.kernel)
    rng = np.random.default_rng(sub_seed)
    scores = np.zeros(len(y))
    for fit, test in StratifiedKFold(FOLDS, shuffle=True, random_state=fold_seed).split(x, rate):
        fit = rng.permutation(fit)[: round(fraction * len(fit))]
        clf = train_classifier(x[fit, :384], x[fit, 384:], y[fit], settings.regularization)
        vectors = x[:, :384].astype(np.float32)
        kernel = fit_kernel(
            [prompts[i] for i in fit],
            vectors[fit],
            y[fit],
            settings.kernel_width,
            settings.kernel_ridge,
            settings.kernel_lexical,
        ).predict_many(vectors[test], [prompts[i] for i in test])
        scores[test] = (1 - w_kernel) * probabilities(clf, x[test]) + w_kernel * kernel
    return scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The difficulty score's learning curve.")
    parser.add_argument("--outcomes", type=Path, default=RATES)
    parser.add_argument("--policy", default=str(ROOT / "router_policies" / "default.yaml"))
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.outcomes.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    policy = load_policy(args.policy)
    settings = policy.difficulty
    model = policy.embedder.model
    prompts = [r["prompt"] for r in train]
    vectors = embeddings_of(prompts, model, Embedder(model).embed_many)
    signals = np.stack([example_signals(p).vector() for p in prompts])
    x = np.hstack((vectors, signals)).astype(np.float64)
    y = np.array([TARGETS[SHIPPED_TARGET](r) for r in train])
    rate = np.array([rate_label(r) for r in train])
    lengths = np.array([len(p) for p in prompts], dtype=float)
    matched = length_matched(lengths, rate)
    curve = []
    for fraction in FRACTIONS:
        figures = []
        for fold_seed in FOLD_SEEDS:
            for sub_seed in SUBSAMPLE_SEEDS if fraction < 1 else (0,):
                p = out_of_fold(x, y, rate, prompts, fraction, fold_seed, sub_seed, settings)
                figures.append((auc(rate, p), auc(rate[matched], p[matched])))
        whole, matched_auc = np.array(figures).T
        point = {
            "fraction": fraction,
            "fit_tasks_per_fold": round(fraction * len(train) * (FOLDS - 1) / FOLDS),
            "runs": len(figures),
            "auc": round(float(whole.mean()), 4),
            "auc_length_matched": round(float(matched_auc.mean()), 4),
            "auc_length_matched_sd": round(float(matched_auc.std()), 4),
        }
        curve.append(point)
        print(json.dumps(point), flush=True)
    gain = curve[-1]["auc_length_matched"] - curve[-2]["auc_length_matched"]
    report = {
        "cpu": cpu_model(),
        "train": len(train),
        "matched_tasks": len(matched),
        "folds": FOLDS,
        "fold_seeds": FOLD_SEEDS,
        "subsample_seeds": SUBSAMPLE_SEEDS,
        "blend": {"classifier": settings.blend.classifier, "kernel": settings.blend.kernel},
        "C": settings.regularization,
        "kernel_width": settings.kernel_width,
        "kernel_ridge": settings.kernel_ridge,
        "kernel_lexical": settings.kernel_lexical,
        "curve": curve,
        "matched_gain_75_to_100": round(gain, 4),
    }
    path = write_report("router_learning_curve", report, [args.outcomes, Path(args.policy)])
    print(f"matched AUC gain 75% -> 100%: {gain:+.4f} -> {path}")
