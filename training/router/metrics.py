"""What bench/router_eval.py measures a score by, on labelled held-out tasks: ROC AUC
(whole and on a length-matched subset), accuracy and cost routed at every share of
large-tier calls against random routing, and CPT(50%) / CPT(80%) (RouteLLM's measure)."""

import random

import numpy as np
from sklearn.metrics import roc_auc_score

from gateway.stats.counters import cost_usd
from training.router.labels import quality

SHARES = [round(s, 2) for s in np.arange(0.0, 1.0001, 0.05)]
LENGTH_BANDS = 8
SEED = 10


def length_matched(lengths: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Indices: in each length band (quantiles), equal numbers of each label."""
    rng = random.Random(SEED)
    edges = np.quantile(lengths, np.linspace(0, 1, LENGTH_BANDS + 1)[1:-1])
    bands = np.searchsorted(edges, lengths, side="right")
    keep: list[int] = []
    for band in np.unique(bands):
        pos = [i for i in np.flatnonzero(bands == band) if labels[i] == 1]
        neg = [i for i in np.flatnonzero(bands == band) if labels[i] == 0]
        n = min(len(pos), len(neg))
        keep += rng.sample(pos, n) + rng.sample(neg, n)
    return np.array(sorted(keep))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    return round(float(roc_auc_score(labels, scores)), 4)


def routed_curve(scores, small_ok, large_ok, small_cost, large_cost) -> list[dict]:
    """Send the top `share` of scores to large; accuracy and cost per share."""
    order = np.argsort(-scores, kind="stable")
    out = []
    for share in SHARES:
        to_large = np.zeros(len(scores), dtype=bool)
        to_large[order[: round(share * len(scores))]] = True
        accuracy = np.where(to_large, large_ok, small_ok).mean()
        cost = np.where(to_large, large_cost, small_cost).sum()
        out.append({"share": share, "accuracy": round(float(accuracy), 4), "cost_usd": cost})
    return out


def random_curve(small_ok, large_ok, small_cost, large_cost) -> list[dict]:
    """Random routing at each share, in expectation."""
    return [
        {
            "share": s,
            "accuracy": round(float((1 - s) * small_ok.mean() + s * large_ok.mean()), 4),
            "cost_usd": float((1 - s) * small_cost.sum() + s * large_cost.sum()),
        }
        for s in SHARES
    ]


def cpt(scores, small_ok, large_ok, part: float) -> float | None:
    """Least share of large calls (over every possible cut) that recovers `part` of the gap."""
    target = small_ok.mean() + part * (large_ok.mean() - small_ok.mean())
    order = np.argsort(-scores, kind="stable")
    gain = np.concatenate(([0], np.cumsum((large_ok - small_ok)[order])))
    accuracy = small_ok.mean() + gain / len(scores)
    reached = np.flatnonzero(accuracy >= target - 1e-12)
    return None if not len(reached) else round(float(reached[0] / len(scores)), 4)


def tier_outcomes(rows: list[dict], prices: dict) -> tuple[np.ndarray, ...]:
    """Per task: the small and the large tier's right-answer share, then each one's cost."""
    small_ok, large_ok = (np.array([quality(r, t) for r in rows]) for t in ("small", "large"))
    small_cost, large_cost = (
        np.array([answer_cost(r[t], prices[t]) for r in rows]) for t in prices
    )
    return small_ok, large_ok, small_cost, large_cost


def evaluate(scores: dict[str, np.ndarray], rows: list[dict], label, prices) -> dict:
    """AUC (whole and length-matched), accuracy and cost curves and CPT of each score on
    `rows`, for the label function `label` and each tier's right-answer share."""
    labels = np.array([label(r) for r in rows])
    lengths = np.array([len(r["prompt"]) for r in rows], dtype=float)
    matched = length_matched(lengths, labels)
    small_ok, large_ok, small_cost, large_cost = tier_outcomes(rows, prices)
    report = {
        "heldout": len(rows),
        "positive_share": round(float(labels.mean()), 4),
        "matched_subset": len(matched),
        "auc": {n: auc(labels, s) for n, s in scores.items()},
        "auc_length_matched": {n: auc(labels[matched], s[matched]) for n, s in scores.items()},
        "all_small": {"accuracy": round(float(small_ok.mean()), 4), "cost_usd": small_cost.sum()},
        "all_large": {"accuracy": round(float(large_ok.mean()), 4), "cost_usd": large_cost.sum()},
        "cpt": {
            n: {"cpt50": cpt(s, small_ok, large_ok, 0.5), "cpt80": cpt(s, small_ok, large_ok, 0.8)}
            for n, s in scores.items()
        },
        "curves": {
            n: routed_curve(s, small_ok, large_ok, small_cost, large_cost)
            for n, s in scores.items()
        },
    }
    report["curves"]["random"] = random_curve(small_ok, large_ok, small_cost, large_cost)
    rand_curve = report["curves"]["random"]
    report["beats_random_at_every_share"] = {
        n: all(
            o["accuracy"] >= r["accuracy"]
            for o, r in zip(report["curves"][n][1:-1], rand_curve[1:-1], strict=True)
        )
        for n in scores
    }
    return report


def answer_cost(answer: dict, price) -> float:
    """One tier's answer to a task (its mean completion), at the policy's price."""
    from engine.entrypoints.openai.protocol import Usage

    tokens = Usage.of(answer["prompt_tokens"], round(answer["completion_tokens"]))
    return cost_usd(tokens, price)
