"""The pair verifier: does the answer stored for `candidate` answer `query`?

Similarity only finds candidates; cosine cannot tell "enable 2FA" from "disable 2FA"
(must-not pairs score above paraphrases, see DESIGN.md). The verifier applies hard vetoes
(pair_features.veto) and then a logistic model over the cosine and token-alignment
features, fitted by `python -m training cache verifier` as the other verifiers' models are
(training/cache/train_aligned.py: the people's train pairs, thresholds out of fold) and
shipped as verifier_model.json. Pure Python over the artifact: no model load, tens of
microseconds a pair (bench/cache_eval.py measures it).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway.cache.pair_features import FEATURES, align, features, vetoes
from gateway.cache.pair_text import WordStats, analyse

DEFAULT_ARTIFACT = Path(__file__).with_name("verifier_model.json")
# Longer texts (pasted code, documents) are compared word for word only: word alignment
# grows with the square of the length, and the embedder reads no further than this either.
MAX_COMPARED_CHARS = 2048
STRICTNESS = ("strict", "balanced", "lenient")
V = TypeVar("V", bound="PairVerifier")
# The artifact's thresholds for a lookup with one candidate: picked out of fold pair by pair.
# `thresholds` are picked on a crowded scope's lookups, where the nearest of many stored
# questions is often a near miss; a lookup that meets one stored question is one pair.
ONE_CANDIDATE = "thresholds_one_candidate"


@dataclass(frozen=True)
class Verdict:
    accept: bool
    probability: float  # P(the stored answer answers the query), 0..1
    reason: str  # "ok", or why not: "numbers differ", "negation", "entity", "low probability"


@dataclass
class ModelReads:
    """How many more of one lookup's candidates a verifier's model may read (its passes):
    a verifier with a costly model (nli) refuses a pair that needs a read past the last.
    One per lookup, its candidates verified in turn: no lock."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@dataclass(frozen=True)
class LogisticModel:
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float

    def logit(self, x: list[float]) -> float:
        return self.bias + sum(
            w * (v - m) / s
            for w, v, m, s in zip(self.weights, x, self.mean, self.scale, strict=True)
        )

    def probability(self, x: list[float]) -> float:
        return sigmoid(self.logit(x))


def with_one_candidate(verifier: V, artifact: dict) -> V:
    """`verifier` with the artifact's one-candidate thresholds, each no higher than its
    lookup threshold (an artifact fitted before 2026-12-07 has none)."""
    given = artifact.get(ONE_CANDIDATE, {})
    verifier.one_candidate = {
        name: min(float(given[name]), verifier.thresholds[name])
        for name in STRICTNESS
        if name in given
    }
    return verifier


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


def logit(p: float) -> float:
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return math.log(p / (1.0 - p))


class PairVerifier:
    FEATURES: tuple[str, ...] = FEATURES  # what its model reads (pair_features)
    # Vetoes left to the model as features (their flags), not refusals; none for `logistic`.
    SOFT_VETOES: tuple[str, ...] = ()

    def __init__(self, model: LogisticModel, thresholds: dict[str, float], stats: WordStats):
        missing = set(STRICTNESS) - set(thresholds)
        if missing:
            raise ValueError(f"verifier thresholds missing {sorted(missing)}")
        self.model = model
        self.thresholds = thresholds
        self.stats = stats
        self.one_candidate: dict[str, float] = {}  # per strictness; none: `thresholds`

    @classmethod
    def load(cls, path: str | Path | None = None) -> "PairVerifier":
        return cls.from_artifact(json.loads(Path(path or DEFAULT_ARTIFACT).read_text()))

    @classmethod
    def from_artifact(cls, artifact: dict) -> "PairVerifier":
        if tuple(artifact["features"]) != FEATURES:
            raise ValueError("verifier artifact was trained on other features: retrain it")
        words = artifact["word_stats"]
        stats = WordStats(words["idf"], words["capitalised"], words["max_idf"])
        m = artifact["model"]
        model = LogisticModel(m["mean"], m["scale"], m["weights"], m["bias"])
        return with_one_candidate(cls(model, artifact["thresholds"], stats), artifact)

    def one_candidate_threshold(self, strictness: str) -> float | None:
        """The threshold of `strictness` for a lookup that meets one candidate; None where
        the artifact has none (its lookup threshold holds)."""
        return self.one_candidate.get(strictness)

    def probability(self, query: str, candidate: str, cosine: float) -> tuple[float, str]:
        """The model's probability and the veto reason ("" when none); 0 when vetoed."""
        decided = self.decide(query, candidate)
        if decided is not None:
            return decided
        return self.model.probability(self.pair_features(query, candidate, cosine)), ""

    def pair_features(self, query: str, candidate: str, cosine: float) -> list[float]:
        """FEATURES of a pair (what training fits on, for pairs no rule decides)."""
        a, b = analyse(query, self.stats), analyse(candidate, self.stats)
        return features(a, b, align(a, b, self.stats), cosine, self.stats)

    def decide(self, query: str, candidate: str) -> tuple[float, str] | None:
        """What the rules alone decide: (0, the veto) or (1, "") for the same words; None
        leaves the pair to a model."""
        if max(len(query), len(candidate)) > MAX_COMPARED_CHARS:
            same = " ".join(query.split()) == " ".join(candidate.split())  # case too: code
            return (1.0, "") if same else (0.0, "too long to compare")
        a, b = analyse(query, self.stats), analyse(candidate, self.stats)
        fired = vetoes(a, b, align(a, b, self.stats), self.stats)
        reason = next((r for r in fired if r not in self.SOFT_VETOES), None)
        if reason:
            return 0.0, reason
        if a.normalised == b.normalised:
            return 1.0, ""  # the same words: case, punctuation or spacing only
        return None

    def verify(
        self,
        query: str,
        candidate: str,
        cosine: float,
        strictness: str = "balanced",
        threshold: float | None = None,
        reads: ModelReads | None = None,
    ) -> Verdict:
        """`threshold` (a calibrated `cache.verifier_threshold`, or the one-candidate one of
        a lookup that meets one stored question) replaces the strictness's;
        `reads`: the lookup's model reads left, None for no limit (calibration, the pair
        files); verifiers without a costly model ignore it."""
        if strictness not in self.thresholds:
            raise ValueError(f"strictness must be one of {', '.join(STRICTNESS)}")
        needed = self.thresholds[strictness] if threshold is None else threshold
        p, reason = self.probability_against(query, candidate, cosine, needed, reads)
        if reason:
            return Verdict(False, p, reason)
        accept = p >= needed
        return Verdict(accept, p, "ok" if accept else "low probability")

    def probability_against(
        self,
        query: str,
        candidate: str,
        cosine: float,
        needed: float,
        reads: ModelReads | None = None,
    ) -> tuple[float, str]:
        """probability(), where a verifier may stop early once the pair is sure to fall
        short of `needed` (then the probability is an upper bound below it)."""
        return self.probability(query, candidate, cosine)
