"""How well the shipped difficulty prior ranks real prompts it was not trained on.

    python -m bench.router_eval [--policy router_policies/default.yaml]

Trains the policy's scorer exactly as the gateway does at load (its examples: the train
split of training/data/router_real/prompts.jsonl, training/router/real_prompts.py) and, in
the same run, on the held-out split (never trained or tuned on):

- Length-matched ROC AUC, hard against easy: the held-out benchmark questions graded hard
  (AIME, GPQA, BIG-bench physics, HumanEval: grade >= 0.8) against everyday prompts (the
  held-out ShareGPT turns whose reference answer is short and has no code, score <= 0.45,
  Natural Questions and BIG-bench's one-fact tasks), both cut to 60-400 characters and
  then matched per length band (`matched_60_400`; the cut alone: `cut_60_400`), for the
  prior, prompt length and LiteLLM's complexity router (the installed litellm's own
  `ComplexityRouter.classify` score).
- On every held-out row: Spearman's rho against the graded score, and the mean score per
  source.
- The sanity figure: the share of the hand-written easy/hard pairs
  (tests/data/router_sanity_pairs.txt) whose hard prompt scores higher.
- Where both bundled tiers' outcomes exist (training/data/router_rates.jsonl, held-out
  split: templated task families and GSM8K, ten answers per tier): CPT(50%) and APGR
  (RouteLLM's measures) of the prior, which never saw those tasks, and of the baselines.
  These are generated tasks: a unit-level figure, not the real-prompt result.
- Transfer across sources (bench/router_transfer.py): each hard or everyday source left
  out of training in turn, its rows ranked against the other class's held-out rows; the
  AUC per source and the mean, against length and LiteLLM on the same rows.
- Training time at load (vectors on disk) and scoring latency beyond the embedding.

Writes bench/results/router_eval.json (TIERGATE_BENCH_RESULTS overrides), goals included.
"""

import argparse
import json
import time

import numpy as np
from scipy.stats import spearmanr

from bench import common
from bench.common import cpu_model
from bench.router_eval_outcomes import litellm_scores, scoring_latency
from bench.router_transfer import leave_one_source_out
from gateway.embedding.embedder import Embedder
from gateway.policy import load_policy
from gateway.policy.examples import policy_examples
from gateway.routing.difficulty import build_scorer, embeddings_of, example_signals
from training.router.labels import TARGETS
from training.router.metrics import SHARES, auc, cpt, length_matched, routed_curve
from training.router.outcomes import RATES
from training.router.real_prompts import read_real_prompts
from training.router.sanity import read_pairs, sanity

HARD_GRADE = 0.8
EASY_SHAREGPT = 0.45  # the reference answer: about 100 words at most, no code
CUT = (60, 400)


def hard_or_everyday(r: dict) -> int | None:
    """1: a hard benchmark question; 0: an everyday prompt; None: neither."""
    if r["source"] not in ("sharegpt", "gsm8k") and r["score"] >= HARD_GRADE:
        return 1
    if r["source"] in ("bigbench_easy", "nq") or (
        r["source"] == "sharegpt" and r["score"] <= EASY_SHAREGPT
    ):
        return 0
    return None


def binary_rows(rows: list[dict]) -> tuple[list[dict], np.ndarray]:
    """Held-out hard benchmark questions (1) and everyday prompts (0); the rest left out."""
    kept = [r for r in rows if hard_or_everyday(r) is not None]
    return kept, np.array([hard_or_everyday(r) for r in kept])


def apgr(scores: np.ndarray, small_ok: np.ndarray, large_ok: np.ndarray) -> float:
    """RouteLLM's average performance gap recovered: the mean over large-call shares
    (0, 5%, ..., 100%) of (accuracy - all-small) / (all-large - all-small)."""
    zeros = np.zeros(len(scores))
    curve = routed_curve(scores, small_ok, large_ok, zeros, zeros)
    gap = large_ok.mean() - small_ok.mean()
    recovered = [(p["accuracy"] - small_ok.mean()) / gap for p in curve]
    return round(float(np.trapezoid(recovered, SHARES)), 4)


def matched_figures(rows, labels, scores: dict[str, np.ndarray]) -> dict:
    """`matched_60_400` (the headline): both classes cut to 60-400 characters, then as many
    of each per length band (training/router/metrics.py), so length cannot tell them apart;
    `cut_60_400`: the cut alone (within it the hard questions are still the longer ones)."""
    lengths = np.array([len(r["prompt"]) for r in rows], dtype=float)
    cut = np.flatnonzero((lengths >= CUT[0]) & (lengths <= CUT[1]))
    banded = cut[length_matched(lengths[cut], labels[cut])]
    out = {}
    for name, idx in (("matched_60_400", banded), ("cut_60_400", cut)):
        out[name] = {
            "positives": int(labels[idx].sum()),
            "negatives": int((1 - labels[idx]).sum()),
            "auc": {n: auc(labels[idx], s[idx]) for n, s in scores.items()},
        }
    out["whole"] = {"auc": {n: auc(labels, s) for n, s in scores.items()}}
    return out


def baselines(prompts: list[str]) -> dict[str, np.ndarray]:
    return {
        "length": np.array([len(p) for p in prompts], dtype=float),
        "litellm_complexity": litellm_scores(prompts),
    }


def outcome_figures(score_texts, rows: list[dict]) -> dict:
    heldout = [r for r in rows if r["split"] == "heldout"]
    prompts = [r["prompt"] for r in heldout]
    scores = {"prior": score_texts(prompts)} | baselines(prompts)
    small = np.array([r["small"]["rate"] for r in heldout])
    large = np.array([r["large"]["rate"] for r in heldout])
    labels = np.array([TARGETS["rate"](r) for r in heldout])
    return {
        "tasks": len(heldout),
        "all_small_accuracy": round(float(small.mean()), 4),
        "all_large_accuracy": round(float(large.mean()), 4),
        "auc_needs_large": {n: auc(labels, s) for n, s in scores.items()},
        "cpt50": {n: cpt(s, small, large, 0.5) for n, s in scores.items()},
        "apgr": {n: apgr(s, small, large) for n, s in scores.items()},
    }


def goals(report: dict) -> dict:
    matched = report["hard_vs_easy"]["matched_60_400"]["auc"]
    margin = matched["prior"] - max(matched["length"], matched["litellm_complexity"])
    return {
        "sanity": common.goal(report["sanity"]["hard_higher"], 0.95),
        "matched_auc": common.goal(matched["prior"], 0.80),
        "matched_auc_margin": common.goal(round(margin, 4), 0.15),
        "scoring_cpu_p99_ms": common.goal(report["scoring_latency"]["cpu_p99_ms"], 1.0, False),
        "train_cpu_seconds": common.goal(report["train_cpu_seconds"], 10.0, False),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", default=str(common.ROOT / "router_policies" / "default.yaml"))
    args = parser.parse_args()
    policy = load_policy(args.policy)
    embedder = Embedder(policy.embedder.model)
    build_scorer(policy, embedder.embed_many)  # embeds the examples once (kept on disk)
    start, start_cpu = time.perf_counter(), time.process_time()
    from gateway.routing import difficulty

    difficulty._trained_cache.clear()  # time the training itself, vectors on disk
    scorer = build_scorer(policy, embedder.embed_many)
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu

    def score_texts(prompts: list[str]) -> np.ndarray:
        # kept on disk as the examples' are: a rerun embeds only what changed
        vectors = embeddings_of(prompts, policy.embedder.model, embedder.embed_many)
        pairs = zip(vectors, prompts, strict=True)
        return np.array([scorer.score_embedded(v, example_signals(p), p).score for v, p in pairs])

    every_row = read_real_prompts()
    heldout = [r for r in every_row if r["split"] == "heldout"]
    prior = score_texts([r["prompt"] for r in heldout])
    rows, labels = binary_rows(heldout)
    index = {r["id"]: i for i, r in enumerate(heldout)}
    chosen = [index[r["id"]] for r in rows]
    scores = {"prior": prior[chosen]} | baselines([r["prompt"] for r in rows])
    graded = np.array([r["score"] for r in heldout])
    by_source: dict[str, list[float]] = {}
    for r, s in zip(heldout, prior, strict=True):
        by_source.setdefault(r["source"], []).append(float(s))
    sample = [r["prompt"] for r in heldout[:400]]
    report = {
        "cpu": cpu_model(),
        "policy": args.policy,
        "train_examples": len(policy_examples(policy)),
        "train_seconds": round(train_s, 2),
        "train_cpu_seconds": round(train_cpu_s, 2),  # beside other jobs, wall time is theirs too
        "heldout_rows": len(heldout),
        "hard_vs_easy": matched_figures(rows, labels, scores),
        "spearman_graded": round(float(spearmanr(prior, graded).statistic), 4),
        "mean_score_by_source": {k: round(float(np.mean(v)), 4) for k, v in by_source.items()},
        "sanity": sanity(lambda p: list(score_texts(p)), read_pairs()),
        "outcomes_bundled_tiers": outcome_figures(score_texts, read_rates()),
        "leave_one_source_out": transfer(policy, every_row, embedder),
        "scoring_latency": scoring_latency(scorer, sample, embedder.embed_many(sample)),
    }
    report["goals"] = goals(report)
    print(json.dumps(report, indent=1))
    common.write_result("router_eval", report)


def transfer(policy, rows: list[dict], embedder: Embedder) -> dict:
    """bench/router_transfer.py on every row, train and held-out split, with their vectors
    (kept on disk per split: the examples' and the held-out rows' are already there)."""
    model = policy.embedder.model
    vectors = np.empty((len(rows), embedder.embed_many(["x"]).shape[1]), dtype=np.float32)
    for split in ("train", "heldout"):
        idx = [i for i, r in enumerate(rows) if r["split"] == split]
        vectors[idx] = embeddings_of([rows[i]["prompt"] for i in idx], model, embedder.embed_many)
    return leave_one_source_out(policy, rows, vectors, hard_or_everyday, baselines)


def read_rates() -> list[dict]:
    return [json.loads(line) for line in RATES.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
