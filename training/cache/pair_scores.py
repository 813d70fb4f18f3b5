"""The verifier's score of (new question, stored question) pairs, for calibration: the one
place calibrate-cache calls the verifier, so a new verifier is plugged in here alone.

`score_pairs` returns, per pair, the probability that the stored question's answer answers
the new one, 0 where a hard veto refuses the pair (no threshold above 0 accepts it), exactly
as the gateway's lookup sees it (gateway/cache/verifier.py).
"""

from functools import cache

from gateway.cache.cross_verifier import CrossVerifier
from gateway.cache.verifier import PairVerifier


@cache
def _verifier(model: str = "logistic") -> PairVerifier | CrossVerifier:
    """The policy's `cache.verifier_model`: `logistic` or `pair` (the cross-encoder)."""
    return CrossVerifier.load() if model == "pair" else PairVerifier.load()


def score_pairs(
    queries: list[str], candidates: list[str], cosines: list[float], model: str = "logistic"
) -> list[float]:
    verifier = _verifier(model)
    if isinstance(verifier, CrossVerifier):  # reads the texts, not the cosine
        return verifier.score_pairs(queries, candidates)
    return [
        verifier.probability(q, c, cos)[0]
        for q, c, cos in zip(queries, candidates, cosines, strict=True)
    ]


def strictness_threshold(strictness: str, model: str = "logistic") -> float:
    """The threshold a policy's `cache.verifier` strictness stands for; `off`: 0, the floor
    alone (every probability, a vetoed pair's 0 too, reaches it)."""
    return 0.0 if strictness == "off" else _verifier(model).thresholds[strictness]
