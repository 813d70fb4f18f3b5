"""Is the router fitted to the bundled tiers from their traffic ahead of the prior on held-out
traffic? (issue #24's last goal)

    python -m bench.router_learn_eval [--record FILE] [--policy router_policies/default.yaml]

The traffic is training/data/router_learn/reference_traffic.jsonl (`python -m training router
reference-traffic`): real questions nobody here wrote (the prior's held-out GSM8K, AIME and
GPQA rows), answered through a real gateway by both bundled tiers, each labelled by its
reference answer (needs-large = the small tier wrong and the large one right). The run:

- `tiergate router learn` itself, replaying that record (every answer and verdict is in it,
  so nothing is asked): the refit on its 70% and the before/after report on its fixed 30%
  held-out slice (AUC, CPT(50%), the share and the quality at each one's threshold).
- Five folds by a hash of the sample id, the refit trained on four and scored on the fifth
  (how much of the prior it keeps chosen on those four, as `--prior auto` does): the
  prior's and the fitted score's AUC, CPT(50%) and APGR pooled over all samples, with
  prompt length and LiteLLM's complexity router on the same samples.
- The fitted score on the prior's own test (bench/router_eval.py's held-out hard/everyday
  prompts, length-matched, and the hand-written sanity pairs): what the refit costs the
  general ranking.

Writes bench/results/router_learn_eval.json (TIERGATE_BENCH_RESULTS overrides).
"""

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np

from bench import common
from bench.router_eval import apgr, baselines, binary_rows, matched_figures
from gateway.cache.samples import Sample
from gateway.embedding.embedder import Embedder
from gateway.policy import load_policy
from training.router import learn, learn_fit
from training.router.learn_prior import FOLDS, choose_prior_keep, fold_of
from training.router.metrics import auc, cpt
from training.router.real_prompts import read_real_prompts
from training.router.reference_traffic import OUT as RECORD
from training.router.sanity import read_pairs, sanity

POLICY = common.ROOT / "router_policies" / "default.yaml"


def read_labelled(record: Path) -> list[learn_fit.Labelled]:
    rows = [learn.Row.from_json(line) for line in record.read_text().splitlines() if line]
    return [learn_fit.Labelled.of(r.sample, r.verdict) for r in rows if r.verdict]


def cross_fitted(policy, labelled: list[learn_fit.Labelled], embed) -> tuple[np.ndarray, list]:
    """Each sample's score from the refit trained without its fold, the share of the prior it
    keeps chosen as `router learn --prior auto` chooses it, on the other folds alone."""
    scores = np.zeros(len(labelled))
    folds = np.array([fold_of(r.sample.id) for r in labelled])
    kept = []
    for k in range(FOLDS):
        train = [r for r, f in zip(labelled, folds, strict=True) if f != k]
        choice = choose_prior_keep(policy, train, 3, embed)
        examples, _ = learn_fit.fitted_examples(policy, train, 3, choice.keep)
        fitted = learn_fit.with_examples(policy, examples)
        held = np.flatnonzero(folds == k)
        scores[held] = learn_fit.score_samples(fitted, [labelled[i].sample for i in held], embed)
        kept.append(choice.report()["prior_keep"])
    return scores, kept


def pooled_figures(
    labelled: list[learn_fit.Labelled], sources: list[str], scores: dict[str, np.ndarray]
) -> dict:
    labels = np.array([r.needs_large for r in labelled], dtype=float)
    small, large = np.array([r.qualities for r in labelled], dtype=float).T
    by_source: dict[str, dict] = {}
    for name in sorted(set(sources)):
        idx = [i for i, source in enumerate(sources) if source == name]
        by_source[name] = {
            "samples": len(idx),
            "needs_large": int(labels[idx].sum()),
            "small_right": int(small[idx].sum()),
            "large_right": int(large[idx].sum()),
            "mean_score": {n: round(float(s[idx].mean()), 4) for n, s in scores.items()},
            "auc": {n: _auc(labels[idx], s[idx]) for n, s in scores.items()},
        }
    return {
        "samples": len(labelled),
        "needs_large": int(labels.sum()),
        "all_small_quality": round(float(small.mean()), 4),
        "all_large_quality": round(float(large.mean()), 4),
        "auc": {n: auc(labels, s) for n, s in scores.items()},
        "cpt50": {n: cpt(s, small, large, 0.5) for n, s in scores.items()},
        "apgr": {n: apgr(s, small, large) for n, s in scores.items()},
        "by_source": by_source,
    }


def general_ranking(policy, fitted_policy, embed) -> dict:
    """The prior's and the fitted score's length-matched AUC on bench/router_eval.py's
    held-out hard/everyday prompts, and their sanity figure."""
    heldout = [r for r in read_real_prompts() if r["split"] == "heldout"]
    rows, labels = binary_rows(heldout)
    prompts = [r["prompt"] for r in rows]
    samples = [_as_sample(p) for p in prompts]
    scores = {"prior": learn_fit.score_samples(policy, samples, embed)}
    scores["fitted"] = learn_fit.score_samples(fitted_policy, samples, embed)
    pairs = read_pairs()
    out = {"hard_vs_easy": matched_figures(rows, labels, scores | baselines(prompts))}
    for name, p in (("prior", policy), ("fitted", fitted_policy)):
        out[f"sanity_{name}"] = sanity(_scorer(p, embed), pairs)["hard_higher"]
    return out


def _scorer(policy, embed):
    def score(texts: list[str]) -> list[float]:
        return list(learn_fit.score_samples(policy, [_as_sample(t) for t in texts], embed))

    return score


def _as_sample(prompt: str) -> Sample:
    return Sample("bench", "auto", [{"role": "user", "content": prompt}], "small", "", "")


def _auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    return auc(labels, scores) if 0 < labels.sum() < len(labels) else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", default=str(RECORD))
    parser.add_argument("--policy", default=str(POLICY))
    args = parser.parse_args()
    policy = load_policy(args.policy)
    embed = Embedder(policy.embedder.model, backend=policy.embedder.backend).embed_many
    folder = Path(tempfile.mkdtemp(prefix="router-learn-eval-"))
    replay = ["--policy", args.policy, "--samples", args.record, "--out", str(folder / "ex.jsonl")]
    learned = asyncio.run(learn.run(learn.parse_args([*replay, "--record", str(folder / "r")])))
    labelled = read_labelled(Path(args.record))
    prompts = [r.sample.last_user_text for r in labelled]
    source_of = {r["prompt"]: r["source"] for r in read_real_prompts()}
    sources = [source_of.get(p, "other") for p in prompts]
    scores = {"prior": learn_fit.score_samples(policy, [r.sample for r in labelled], embed)}
    scores["fitted"], kept_per_fold = cross_fitted(policy, labelled, embed)
    choice = choose_prior_keep(policy, labelled, 3, embed)
    examples, _ = learn_fit.fitted_examples(policy, labelled, 3, choice.keep)
    fitted_policy = learn_fit.with_examples(policy, examples)
    report = {
        "cpu": common.cpu_model(),
        "record": args.record,
        "learn_held_out_slice": learned,
        "five_folds": pooled_figures(labelled, sources, scores | baselines(prompts))
        | {"prior_keep_per_fold": kept_per_fold},
        "general_ranking": general_ranking(policy, fitted_policy, embed)
        | {"prior_choice_on_all": choice.report()},
    }
    folds, slice_ = report["five_folds"], learned
    report["goals"] = {
        "fitted_auc_above_prior_folds": common.goal(
            round(folds["auc"]["fitted"] - folds["auc"]["prior"], 4), 0.0
        ),
        "fitted_auc_above_prior_slice": common.goal(
            round((slice_["fitted"]["auc"] or 0) - (slice_["prior"]["auc"] or 0), 4), 0.0
        ),
    }
    print(json.dumps(report, indent=1))
    common.write_result("router_learn_eval", report)


if __name__ == "__main__":
    main()
