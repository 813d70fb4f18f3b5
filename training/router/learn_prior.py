"""How much of the prior a refit keeps, chosen by cross-validation on the training traffic.

The prior ranks prompts by how much a strong model is needed; a deployer's labels say when
their large tier answers better than their small one, which can disagree with it: with two
small tiers, the large one wins on the easier hard questions, and neither on the hardest
(measured on the reference traffic: bench/router_learn_eval.py). Where the traffic
disagrees, thousands of prior examples outvote a few hundred samples. So the refit tries
keeping every prior example, a fixed part of them (by a hash of the prompt) and none, each
with the traffic `weight` times, scores each by its AUC over five folds of the training
slice (the held-out slice is never read), and keeps the most prior whose AUC is within one
standard error of the best (Hanley and McNeil's, for the best AUC and the slice's class
counts): the prior is what ranks prompts the sample did not cover, so it goes only where
the traffic clearly says so. With too few labels of either class to choose
(MIN_PER_CLASS), every prior example is kept.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from gateway.policy import Policy
from training.router.learn_fit import Labelled, fitted_examples, score_samples, with_examples
from training.router.metrics import auc

KEEPS: tuple[int | None, ...] = (None, 1000, 300, 0)  # None: every prior example
FOLDS = 5
MIN_PER_CLASS = 10  # labels of each class in the training slice needed to choose


@dataclass
class PriorChoice:
    keep: int | None  # prior examples kept (None: all)
    cv_auc: dict[str, float | None]  # each tried setting's pooled five-fold AUC
    reason: str
    # the training samples' out-of-fold scores under the chosen setting (what calibrating
    # the threshold should read: a refit scores the samples it was fitted on too well)
    scores: np.ndarray | None = None

    def report(self) -> dict:
        kept = "all" if self.keep is None else self.keep
        return {"prior_keep": kept, "prior_keep_cv_auc": self.cv_auc, "reason": self.reason}


def fold_of(sample_id: str) -> int:
    return int(hashlib.sha256(f"fold/{sample_id}".encode()).hexdigest()[:8], 16) % FOLDS


def cross_scores(
    policy: Policy, train: list[Labelled], weight: int, keep: int | None, embed
) -> np.ndarray:
    """Each training sample's score from the refit fitted without its fold."""
    folds = np.array([fold_of(r.sample.id) for r in train])
    scores = np.zeros(len(train))
    for k in range(FOLDS):
        rest = [r for r, f in zip(train, folds, strict=True) if f != k]
        examples, _ = fitted_examples(policy, rest, weight, keep)
        held = np.flatnonzero(folds == k)
        if len(held):
            fitted = with_examples(policy, examples)
            scores[held] = score_samples(fitted, [train[i].sample for i in held], embed)
    return scores


def auc_standard_error(value: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil (1982): the standard error of an AUC over these class counts."""
    q1, q2 = value / (2 - value), 2 * value**2 / (1 + value)
    variance = value * (1 - value) + (positives - 1) * (q1 - value**2)
    variance += (negatives - 1) * (q2 - value**2)
    return float(np.sqrt(max(variance, 0.0) / (positives * negatives)))


def choose_prior_keep(policy: Policy, train: list[Labelled], weight: int, embed) -> PriorChoice:
    labels = np.array([r.needs_large for r in train])
    positives, negatives = int(labels.sum()), int(len(labels) - labels.sum())
    if min(positives, negatives) < MIN_PER_CLASS:
        return PriorChoice(None, {}, f"fewer than {MIN_PER_CLASS} labels of a class")
    scores = {keep: cross_scores(policy, train, weight, keep, embed) for keep in KEEPS}
    tried = {keep: auc(labels, s) for keep, s in scores.items()}
    best = max(v for v in tried.values() if v is not None)
    bar = best - auc_standard_error(best, positives, negatives)
    keep = next(k for k in KEEPS if tried[k] is not None and tried[k] >= bar)  # most prior first
    named = {"all" if k is None else str(k): v for k, v in tried.items()}
    reason = f"the most prior within one standard error of the best AUC {best}"
    return PriorChoice(keep, named, reason, scores[keep])
