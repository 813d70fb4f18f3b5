"""Train the pair verifier's classifier and pick its operating points; write the artifact.

    python -m training cache verifier      # -> gateway/cache/verifier_model.json

Reads the labelled pairs training/cache/build_pairs.py writes (each with its cosine, so no
model is loaded here) and the word statistics beside them. The logistic model is fitted
on the train split's pairs that no veto decides, by Newton's method (deterministic); the
thresholds of strict / balanced / lenient are the lowest probabilities whose wrong-hit
rate on the dev split stays within each target. `--limit` trains on a seeded sample.
The artefact is written with its provenance sidecar (training/artifacts.py).
"""

import argparse
import json
import random
from pathlib import Path

import numpy as np

from gateway.cache.pair_features import FEATURES, align, features, veto
from gateway.cache.pair_text import WordStats, analyse
from gateway.cache.verifier import STRICTNESS, LogisticModel, PairVerifier
from training.artifacts import DATA, VERIFIER_MODEL, write_artifact

DEFAULT_PAIRS = DATA / "cache_pairs.jsonl"
DEFAULT_WORDS = DATA / "cache_words.json"
SEED = 0
L2 = 1.0
# Hand-written paraphrases reword freely, as people do; the generated pairs are edits of one
# question. Few as they are, they stand for most real rewordings, so they weigh more.
HAND_WRITTEN_WEIGHT = 10.0
# Wrong hits allowed on dev (share of must-not pairs) at each strictness.
TARGET_WRONG_HITS = {"strict": 0.0025, "balanced": 0.0075, "lenient": 0.02}


def is_hand_written(pair: dict) -> bool:
    return pair["source"].startswith("group:")


def load_pairs(path: Path = DEFAULT_PAIRS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def word_stats(words: dict) -> WordStats:
    return WordStats(words["idf"], words["capitalised"], words["max_idf"])


def featurise(pairs: list[dict], stats: WordStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features of every pair, labels, and which pairs a veto already refuses."""
    rows, vetoed = [], []
    for p in pairs:
        a, b = analyse(p["a"], stats), analyse(p["b"], stats)
        al = align(a, b, stats)
        vetoed.append(veto(a, b, al, stats) is not None)
        rows.append(features(a, b, al, p["cosine"], stats))
    labels = np.array([p["label"] for p in pairs], dtype=np.float64)
    return np.array(rows, dtype=np.float64), labels, np.array(vetoed)


def fit_logistic(
    x: np.ndarray, y: np.ndarray, sample: np.ndarray, l2: float = L2, steps: int = 50
) -> LogisticModel:
    """L2-regularised logistic regression by Newton's method; the classes weigh the same."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    # a spread the artifact's 6 decimals would round to 0 counts as none: else a new value
    # of that feature would be divided by 0
    scale[scale < 1e-6] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    pos, neg = (sample * y).sum(), (sample * (1 - y)).sum()
    weight = sample * np.where(y == 1, 0.5 / max(pos, 1e-9), 0.5 / max(neg, 1e-9)) * len(y)
    w = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], l2)
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        grad = z.T @ (weight * (p - y)) + penalty * w
        hess = (z * (weight * p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    r = lambda v: [round(float(t), 6) for t in v]  # noqa: E731
    return LogisticModel(r(mean), r(scale), r(w[:-1]), round(float(w[-1]), 6))


def pick_thresholds(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Per strictness, the lowest threshold whose dev wrong-hit rate is within target."""
    negatives = np.sort(probs[labels == 0])[::-1]
    out = {}
    for name in STRICTNESS:
        allowed = int(TARGET_WRONG_HITS[name] * len(negatives))  # wrong hits we may take
        # accept p >= t: t just above the (allowed+1)-th highest negative probability
        t = float(negatives[allowed]) + 1e-6 if allowed < len(negatives) else 0.0
        out[name] = round(min(max(t, 0.0), 1.0), 6)
    return out


def train(pairs: list[dict], words: dict, limit: int | None = None, seed: int = SEED) -> dict:
    stats = word_stats(words)
    train_pairs = [p for p in pairs if p["split"] == "train"]
    if limit is not None:
        train_pairs = random.Random(seed).sample(train_pairs, min(limit, len(train_pairs)))
    x, y, vetoed = featurise(train_pairs, stats)
    sample = np.array([HAND_WRITTEN_WEIGHT if is_hand_written(p) else 1.0 for p in train_pairs])
    model = fit_logistic(x[~vetoed], y[~vetoed], sample[~vetoed])
    artifact = {
        "features": list(FEATURES),
        "model": model.__dict__,
        "thresholds": {name: 0.5 for name in STRICTNESS},
        "target_wrong_hits_dev": TARGET_WRONG_HITS,
        "trained_on": {
            "pairs": len(train_pairs),
            "not_vetoed": int((~vetoed).sum()),
            "seed": seed,
            "l2": L2,
            "hand_written_weight": HAND_WRITTEN_WEIGHT,
        },
        "word_stats": {
            "max_idf": words["max_idf"],
            "idf": words["idf"],
            "capitalised": words["capitalised"],
        },
    }
    dev = [p for p in pairs if p["split"] == "dev"]
    if dev:
        verifier = PairVerifier.from_artifact(artifact)
        probs = np.array([verifier.probability(p["a"], p["b"], p["cosine"])[0] for p in dev])
        artifact["thresholds"] = pick_thresholds(probs, np.array([p["label"] for p in dev]))
    return artifact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the semantic cache's pair verifier.")
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument("--words", type=Path, default=DEFAULT_WORDS)
    parser.add_argument("--out", type=Path, default=VERIFIER_MODEL)
    parser.add_argument("--limit", type=int, default=None, help="train on a seeded sample")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    artifact = train(
        load_pairs(args.pairs), json.loads(args.words.read_text()), args.limit, args.seed
    )
    text = json.dumps(artifact, separators=(",", ":")) + "\n"
    figures = {k: artifact[k] for k in ("thresholds", "target_wrong_hits_dev", "trained_on")}
    sidecar = write_artifact(args.out, text, [args.pairs, args.words], figures)
    summary = {k: artifact[k] for k in ("model", "thresholds", "trained_on")}
    print(json.dumps(summary, indent=1))
    print(f"-> {args.out}, provenance -> {sidecar}")
    return 0
