"""Transfer across sources: the prior retrained without one source, scored on that source.

The held-out figures of bench/router_eval.py test prompts from the sources the prior was
trained on; part of what they measure is a source's style (LaTeX, a benchmark's phrasing).
Here each source of the hard/everyday comparison is left out of training in turn (every
one of its rows, train and held-out split alike), the policy's scorer is trained on the
train rows of the others exactly as at load, and that source's rows are ranked against
the held-out rows of the other class from the other sources. A source the prior never saw
is what a deployer's traffic looks like to it.
"""

import numpy as np

from gateway.policy import Policy
from gateway.routing.difficulty import (
    DifficultyScorer,
    example_signals,
    fit_kernel,
    train_classifier,
)
from training.router.metrics import auc

HARD_SOURCES = ("aime", "gpqa", "bigbench_physics", "humaneval")
EASY_SOURCES = ("nq", "bigbench_easy", "sharegpt")
CUT = (60, 400)  # characters, as bench/router_eval.py cuts its hard/everyday comparison
MIN_CLASS = 10


def train_like_the_policy(
    policy: Policy, prompts: list[str], vectors: np.ndarray, targets: np.ndarray
) -> DifficultyScorer:
    """build_scorer's training (difficulty.py) on these examples and their vectors."""
    d = policy.difficulty
    signals = np.stack([example_signals(p).vector() for p in prompts])
    classifier = train_classifier(vectors, signals, targets, d.regularization)
    terms = {}
    if d.blend.kernel > 0:
        terms["kernel"] = fit_kernel(
            prompts,
            vectors,
            targets,
            d.kernel_width,
            d.kernel_ridge,
            d.kernel_lexical,
            d.kernel_centres,
        )
    return DifficultyScorer(classifier, d.blend, vectors.shape[1], terms)


def leave_one_source_out(
    policy: Policy,
    rows: list[dict],
    vectors: np.ndarray,
    label_of,
    baselines,
) -> dict:
    """`rows` (train and held-out split) with their `vectors`; `label_of(row)`: 1 hard, 0
    everyday, None neither (bench/router_eval.py's rule); `baselines(prompts)`: name ->
    scores. Per source: AUC of the retrained prior and of each baseline, and the mean."""
    labels = [label_of(r) for r in rows]
    out: dict[str, dict] = {}
    for source in (*HARD_SOURCES, *EASY_SOURCES):
        train = [i for i, r in enumerate(rows) if r["split"] == "train" and r["source"] != source]
        scorer = train_like_the_policy(
            policy,
            [rows[i]["prompt"] for i in train],
            vectors[train],
            np.array([rows[i]["score"] for i in train]),
        )
        mine = [i for i, r in enumerate(rows) if r["source"] == source and labels[i] is not None]
        wanted = 1 - labels[mine[0]]
        others = [
            i
            for i, r in enumerate(rows)
            if r["split"] == "heldout" and r["source"] != source and labels[i] == wanted
        ]
        idx = mine + others
        y = np.array([labels[i] for i in idx])
        prompts = [rows[i]["prompt"] for i in idx]
        prior = np.array(
            [
                scorer.score_embedded(vectors[i], example_signals(p), p).score
                for i, p in zip(idx, prompts, strict=True)
            ]
        )
        scores = {"prior": prior} | baselines(prompts)
        lengths = np.array([len(p) for p in prompts])
        cut = (lengths >= CUT[0]) & (lengths <= CUT[1])
        out[source] = {
            "left_out_rows": len(mine),
            "against": len(others),
            "auc": {n: auc(y, s) for n, s in scores.items()},
            "cut_60_400": cut_figure(y[cut], {n: s[cut] for n, s in scores.items()}),
        }
    return {"by_source": out} | means(out)


def cut_figure(y: np.ndarray, scores: dict[str, np.ndarray]) -> dict | None:
    """The AUC within 60-400 characters, where length tells the classes apart less; None
    when a class has fewer than MIN_CLASS rows there."""
    if min(y.sum(), (1 - y).sum()) < MIN_CLASS:
        return None
    counts = {"positives": int(y.sum()), "negatives": int((1 - y).sum())}
    return counts | {"auc": {n: auc(y, s) for n, s in scores.items()}}


def means(out: dict[str, dict]) -> dict:
    """The mean AUC over the sources, whole and within the cut (over the sources it has)."""
    names = list(next(iter(out.values()))["auc"])
    cuts = [v["cut_60_400"]["auc"] for v in out.values() if v["cut_60_400"]]

    def mean(figures: list[dict]) -> dict:
        return {n: round(float(np.mean([f[n] for f in figures])), 4) for n in names}

    return {
        "mean_auc": mean([v["auc"] for v in out.values()]),
        "mean_auc_cut_60_400": mean(cuts) if cuts else None,
    }
