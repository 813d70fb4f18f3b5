"""The refit of `tiergate router learn`, on top of the prior: the policy's own examples plus
the judged traffic (each sample `weight` times, as label 0/1 on its last user message, the
text the gateway embeds and the kernel's words read), trained by the gateway's own scorer
(gateway/routing/difficulty.py, untouched); the threshold calibrated so the fitted score
sends the same share of the traffic to the large tier as the running policy did; and the
before/after figures on the held-out slice of the traffic.

Quality, with a pairwise judge: the large tier's answer is the reference (1), the small
tier's is 1 when the judge found it as good, else 0. So all-large scores 1, all-small
1 - the share that needs large, and CPT(50%) is the share of large calls that recovers half
of that gap (RouteLLM's measure, training/router/metrics.py). A sample labelled by its
reference answer counts each tier's answer as it checked: 1 right, 0 wrong.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from gateway.cache.samples import Sample
from gateway.policy import ExamplePrompt, Policy
from gateway.policy.examples import policy_examples
from gateway.routing.calibrate import threshold_for_share
from gateway.routing.difficulty import build_scorer, embeddings_of
from gateway.routing.features import extract_features
from gateway.routing.nearest import KERNEL_MAX_EXAMPLES
from gateway.routing.signals import compute_signals
from training.router.metrics import auc, cpt


@dataclass
class Labelled:
    sample: Sample
    needs_large: int  # the judge: the small answer is not as good as the large one
    small_ok: float | None = None  # each tier's answer checked against a reference, when
    large_ok: float | None = None  # the sample had one; else read from the verdict

    @classmethod
    def of(cls, sample: Sample, verdict: dict) -> "Labelled":
        small, large = verdict.get("small_correct"), verdict.get("large_correct")
        checked = small is not None and large is not None
        return cls(
            sample,
            int(verdict["needs_large"]),
            float(small) if checked else None,
            float(large) if checked else None,
        )

    @property
    def qualities(self) -> tuple[float, float]:
        """(small, large): checked answers as they were; judged ones relative to large."""
        if self.small_ok is not None and self.large_ok is not None:
            return self.small_ok, self.large_ok
        return 1.0 - self.needs_large, 1.0


def is_held_out(sample_id: str, share: float) -> bool:
    """A fixed slice by the sample's id: the same samples stay out in every rerun."""
    point = int(hashlib.sha256(f"heldout/{sample_id}".encode()).hexdigest()[:8], 16)
    return point / 0xFFFFFFFF < share


def fitted_examples(
    policy: Policy, train: list[Labelled], weight: int, keep: int | None = None
) -> tuple[list[ExamplePrompt], int]:
    """The prior's examples (less those a traffic prompt replaces; only the first `keep` by a
    fixed hash when given, and never past the kernel's limit) plus the traffic's, `weight`
    times each; and how many prior ones."""
    traffic = [
        ExamplePrompt(prompt=row.sample.last_user_text, label=row.needs_large)
        for row in train
        if row.sample.last_user_text.strip()
    ]
    seen = {e.prompt for e in traffic}
    prior = [e for e in policy_examples(policy) if e.prompt not in seen]
    new = traffic * weight
    d = policy.difficulty
    solves_all = d.blend.kernel > 0 and d.kernel_centres is None  # an examples² system
    if solves_all:
        limit = max(0, KERNEL_MAX_EXAMPLES - len(new))
        keep = limit if keep is None else min(keep, limit)
    if keep is not None and keep < len(prior):
        prior = sorted(prior, key=lambda e: hashlib.sha256(e.prompt.encode()).digest())[:keep]
    return prior + new, len(prior)


def with_examples(policy: Policy, examples: list[ExamplePrompt]) -> Policy:
    difficulty = policy.difficulty.model_copy(update={"examples": examples})
    return policy.model_copy(update={"difficulty": difficulty})


def score_samples(policy: Policy, samples: list[Sample], embed_many) -> np.ndarray:
    """Each sample's score as the gateway computes it for the request: the embedding of its
    last user message, signals from all its messages and its max_tokens."""
    if not samples:
        return np.zeros(0)
    scorer = build_scorer(policy, embed_many)
    texts = [s.last_user_text for s in samples]
    vectors = embeddings_of(texts, policy.embedder.model, embed_many)
    scores = []
    for sample, vector, text in zip(samples, vectors, texts, strict=True):
        signals = compute_signals(extract_features(sample.messages, None), False, sample.max_tokens)
        scores.append(scorer.score_embedded(vector, signals, text).score)
    return np.array(scores)


def calibrated_threshold(scores: np.ndarray, share: float) -> float:
    return threshold_for_share(scores, share).threshold if len(scores) else 0.5


def _auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    return auc(labels, scores) if 0 < labels.sum() < len(labels) else None


def figures(
    labels: np.ndarray, qualities: np.ndarray, scores: np.ndarray, threshold: float
) -> dict:
    """One score on the held-out slice: AUC, CPT(50%), the share it sends to large at its
    threshold, and the quality at that share (`qualities`: rows of (small, large))."""
    if not len(labels):
        return {"auc": None, "cpt50": None, "large_share": None, "quality": None}
    small_ok, large_ok = qualities[:, 0], qualities[:, 1]
    to_large = scores >= threshold
    gap = large_ok.sum() > small_ok.sum()
    return {
        "auc": _auc(labels, scores),
        "cpt50": cpt(scores, small_ok, large_ok, 0.5) if gap else None,
        "large_share": round(float(to_large.mean()), 4),
        "quality": round(float(np.where(to_large, large_ok, small_ok).mean()), 4),
    }


def before_after(
    held_out: list[Labelled], prior: np.ndarray, fitted: np.ndarray, thresholds: tuple
) -> dict:
    """The prior and the fitted score on the held-out slice, with prompt length, all-small
    and all-large as the baselines measured on the same samples."""
    labels = np.array([r.needs_large for r in held_out], dtype=float)
    qualities = np.array([r.qualities for r in held_out], dtype=float).reshape(-1, 2)
    lengths = np.array([len(r.sample.last_user_text) for r in held_out], dtype=float)
    mean = qualities.mean(axis=0) if len(labels) else None
    return {
        "held_out": len(held_out),
        "needs_large_share": round(float(labels.mean()), 4) if len(labels) else None,
        "prior": figures(labels, qualities, prior, thresholds[0]),
        "fitted": figures(labels, qualities, fitted, thresholds[1]),
        "prompt_length_auc": _auc(labels, lengths) if len(labels) else None,
        "all_small_quality": round(float(mean[0]), 4) if mean is not None else None,
        "all_large_quality": round(float(mean[1]), 4) if mean is not None else None,
    }
