"""Choose the difficulty classifier's training target and regularization by 5-fold CV on the
`train` split only (bench/router_labels.py defines the targets). The held-out split is not
read here.

    python bench/router_label_cv.py [--outcomes bench/data/router_rates.jsonl]

Per (target, C), on each fold: ROC AUC against the `rate` label (large right-answer share
beats small's by >= 0.5: the label the eval reports; whole and length-matched as the eval
does) and against the `greedy` label, and
CPT(50%) on the right-answer rates (needs no label). Writes bench/results/router_label_cv.json.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.router_eval import auc, cpt, cpu_model, length_matched  # noqa: E402
from bench.router_labels import TARGETS, quality, rate_label  # noqa: E402
from bench.router_outcomes import RATES  # noqa: E402
from gateway.cache.embedder import Embedder  # noqa: E402
from gateway.policy import load_policy  # noqa: E402
from gateway.routing.difficulty import embeddings_of, example_signals, train_classifier  # noqa: E402

RESULT = ROOT / "bench" / "results" / "router_label_cv.json"
CS = (1.0, 3.0, 10.0, 30.0, 100.0)
FOLDS = 5
SEED = 10


def probabilities(classifier, x: np.ndarray) -> np.ndarray:
    logits = x @ classifier.weights + classifier.bias
    return 1.0 / (1.0 + np.exp(-logits))


def cross_validate(x: np.ndarray, rows: list[dict], target: str, c: float) -> dict:
    y = np.array([TARGETS[target](r) for r in rows])
    rate = np.array([rate_label(r) for r in rows])
    greedy = np.array([TARGETS["greedy"](r) for r in rows])
    lengths = np.array([len(r["prompt"]) for r in rows], dtype=float)
    small = np.array([quality(r, "small") for r in rows])
    large = np.array([quality(r, "large") for r in rows])
    folds = StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(x, rate)
    per_fold = []
    for fit, test in folds:
        clf = train_classifier(x[fit, :384], x[fit, 384:], y[fit], c)
        p = probabilities(clf, x[test])
        matched = length_matched(lengths[test], rate[test])
        per_fold.append(
            (
                auc(rate[test], p),
                auc(rate[test][matched], p[matched]),
                auc(greedy[test], p),
                cpt(p, small[test], large[test], 0.5),
            )
        )
    mean = np.array(per_fold).mean(axis=0)
    return {
        "target": target,
        "C": c,
        "auc_rate_label": round(float(mean[0]), 4),
        "auc_rate_label_length_matched": round(float(mean[1]), 4),
        "auc_greedy_label": round(float(mean[2]), 4),
        "cpt50": round(float(mean[3]), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outcomes", type=Path, default=RATES)
    parser.add_argument("--policy", default=str(ROOT / "router_policies" / "default.yaml"))
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.outcomes.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    model = load_policy(args.policy).embedder.model
    prompts = [r["prompt"] for r in train]
    vectors = embeddings_of(prompts, model, Embedder(model).embed_many)
    signals = np.stack([example_signals(p).vector() for p in prompts])
    x = np.hstack((vectors, signals)).astype(np.float64)
    runs = [cross_validate(x, train, t, c) for t in ("rate", "gap", "greedy") for c in CS]
    for run in runs:
        print(json.dumps(run))
    best = max((r for r in runs if r["target"] != "greedy"), key=lambda r: r["auc_rate_label"])
    report = {"cpu": cpu_model(), "train": len(train), "folds": FOLDS, "runs": runs}
    report["chosen"] = best
    report["rate_label_positive_share"] = round(float(np.mean([rate_label(r) for r in train])), 4)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(report, indent=1) + "\n")
    print("chosen:", json.dumps(best), "->", RESULT)


if __name__ == "__main__":
    main()
