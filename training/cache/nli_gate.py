"""The `nli` verifier's gate: a logistic model over the features read before any NLI pass
(the aligned verifier's and the soft vetoes' flags), below whose threshold a pair is
refused without one. A lookup's candidates are mostly other questions near the new one,
which the cheap features already rule out: on the gateway benchmark's traffic (the train
pairs' rewordings and edits, bench/gateway_overhead.py) the NLI passes are most of the
nli verifier's CPU per request.

Chosen out of fold (train_aligned.py), one step per strictness: the gate's own
probabilities out of fold, against the people's should-hit pairs the whole model serves
out of fold at that strictness's threshold; the step's threshold is the highest that
refuses at most GATE_LOSS of those, and at most GATE_MAX. A step applies where the
threshold asked for is its strictness's or higher, so a stricter ask refuses more pairs
unread (2026-12-06, out of fold: 23.4% of the pairs asked at lenient, 38.4% at balanced
and strict, losing 3 of 769, 2 of 596 and 1 of 398 served pairs); a calibrated threshold
below lenient's reads every pair.
"""

from dataclasses import dataclass

from gateway.cache.nli_verifier import REST_FEATURES
from gateway.cache.verifier import LogisticModel

GATE_LOSS = 0.005  # of the should-hit pairs the whole model serves at lenient
GATE_MAX = 0.3


@dataclass(frozen=True)
class GateFit:
    threshold: float
    refused_share: float  # of the pairs the model is asked about, out of fold
    lost: int  # should-hit pairs served at lenient that the gate refuses, out of fold
    served: int


def gate_rows(rows: list[dict]) -> list[dict]:
    """Copies of `rows` whose features are the ones read before any pass."""
    return [r | {"x": r["x"][:REST_FEATURES]} for r in rows]


def pick_gate(
    rows: list[dict], gate_probs: list[float], probs: list[float], asked: float
) -> GateFit:
    """The gate threshold where `asked` is asked, from out-of-fold gate and model
    probabilities of `rows`."""
    kept = sorted(
        g
        for r, g, p in zip(rows, gate_probs, probs, strict=True)
        if r["should_hit"] and r["source"] != "rules" and p >= asked
    )
    allowed = int(GATE_LOSS * len(kept))
    # never above the threshold asked: what the gate refuses must score below it
    threshold = min(kept[allowed] if allowed < len(kept) else 0.0, GATE_MAX, asked)
    threshold = round(threshold - 1e-6, 6) if threshold > 0 else 0.0
    lost = sum(1 for g in kept if g < threshold)
    refused = sum(1 for g in gate_probs if g < threshold) / max(len(gate_probs), 1)
    return GateFit(threshold, round(refused, 4), lost, len(kept))


def pick_gates(
    rows: list[dict], gate_probs: list[float], probs: list[float], thresholds: dict[str, float]
) -> dict[str, GateFit]:
    """One gate threshold per strictness (`thresholds`: the model's)."""
    return {k: pick_gate(rows, gate_probs, probs, t) for k, t in thresholds.items()}


def gate_artifact(
    model: LogisticModel, fits: dict[str, GateFit], thresholds: dict[str, float]
) -> dict:
    steps = sorted((thresholds[k], fit.threshold) for k, fit in fits.items())
    return {"model": model.__dict__, "steps": steps}
