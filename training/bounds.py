"""Exact binomial confidence bounds (Clopper-Pearson): the one helper every figure that
claims "at most x% wrong" goes through, so a rate measured on n pairs is reported with what
n can vouch for. 0 wrong of 100 is not 0%: with 95% confidence it is below 2.95%."""

import math

from scipy.stats import beta


def upper_bound(wrong: int, n: int, confidence: float = 0.95) -> float:
    """One-sided upper Clopper-Pearson bound on a rate seen as `wrong` of `n`: the true rate
    is at or below it with probability `confidence`. n = 0 vouches for nothing: 1.0."""
    _check(wrong, n, confidence)
    if wrong >= n:
        return 1.0
    return float(beta.ppf(confidence, wrong + 1, n - wrong))


def lower_bound(hits: int, n: int, confidence: float = 0.95) -> float:
    """One-sided lower Clopper-Pearson bound on a rate seen as `hits` of `n`."""
    _check(hits, n, confidence)
    if hits == 0:
        return 0.0
    return float(beta.ppf(1 - confidence, hits, n - hits + 1))


def pairs_needed(target: float, confidence: float = 0.95) -> int:
    """The fewest pairs that can show a rate at or below `target` at all (none wrong)."""
    if not 0 < target < 1:
        raise ValueError("target must be between 0 and 1, exclusive")
    # upper_bound(0, n) = 1 - (1 - confidence) ** (1 / n) <= target
    return math.ceil(math.log(1 - confidence) / math.log(1 - target))


def _check(k: int, n: int, confidence: float) -> None:
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= count <= n, got {k} of {n}")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1, exclusive")
