"""The verifier's score of (new question, stored question) pairs, for calibration: the one
place calibrate-cache calls the verifier, so a new verifier is plugged in here alone.

`score_pairs` returns, per pair, the probability that the stored question's answer answers
the new one, 0 where a hard veto refuses the pair (no threshold above 0 accepts it), exactly
as the gateway's lookup sees it (gateway/cache/verifier.py).
"""

from functools import cache
from typing import Any

from gateway.cache.cross_verifier import CrossVerifier
from gateway.cache.verdicts import one_candidate_threshold
from gateway.cache.verifiers import load_verifier


@cache
def verifier_for(model: str = "logistic") -> Any:
    """The policy's `cache.verifier_model` (gateway/cache/verifiers.py), loaded once."""
    return load_verifier(model)


def score_pairs(
    queries: list[str], candidates: list[str], cosines: list[float], model: str = "logistic"
) -> list[float]:
    verifier = verifier_for(model)
    if isinstance(verifier, CrossVerifier):  # reads the texts, not the cosine
        return verifier.score_pairs(queries, candidates)
    return [
        verifier.probability(q, c, cos)[0]
        for q, c, cos in zip(queries, candidates, cosines, strict=True)
    ]


def strictness_threshold(
    strictness: str, model: str = "logistic", one_candidate: bool = False
) -> float:
    """The threshold a policy's `cache.verifier` strictness stands for; `off`: 0, the floor
    alone (every probability, a vetoed pair's 0 too, reaches it). `one_candidate`: for a
    lookup that meets one stored question (cache.one_candidate_thresholds), where the
    verifier has such a threshold."""
    if strictness == "off":
        return 0.0
    verifier = verifier_for(model)
    alone = one_candidate_threshold(verifier, strictness) if one_candidate else None
    return verifier.thresholds[strictness] if alone is None else alone
