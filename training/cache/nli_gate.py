"""The `nli` verifier's gate: a logistic model over the features read before any NLI pass
(the aligned verifier's and the soft vetoes' flags), below whose threshold a pair is
refused without one. A lookup's candidates are mostly other questions near the new one,
which the cheap features already rule out: on the gateway benchmark's traffic (the train
pairs' rewordings and edits, bench/gateway_overhead.py) the NLI passes are most of the
nli verifier's CPU per request.

Chosen out of fold (train_aligned.py): the gate's own probabilities out of fold, against
the people's should-hit pairs the whole model serves out of fold at the lenient
threshold; the threshold is the highest that refuses at most GATE_LOSS of those, and at
most GATE_MAX. It applies only where the threshold asked for is the lenient one's or
higher (a calibrated threshold below it reads every pair).
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
    rows: list[dict], gate_probs: list[float], probs: list[float], lenient: float
) -> GateFit:
    """The gate threshold, from out-of-fold gate and model probabilities of `rows`."""
    kept = sorted(
        g
        for r, g, p in zip(rows, gate_probs, probs, strict=True)
        if r["should_hit"] and r["source"] != "rules" and p >= lenient
    )
    allowed = int(GATE_LOSS * len(kept))
    # never above the lenient threshold: what the gate refuses must score below any asked
    threshold = min(kept[allowed] if allowed < len(kept) else 0.0, GATE_MAX, lenient)
    threshold = round(threshold - 1e-6, 6) if threshold > 0 else 0.0
    lost = sum(1 for g in kept if g < threshold)
    refused = sum(1 for g in gate_probs if g < threshold) / max(len(gate_probs), 1)
    return GateFit(threshold, round(refused, 4), lost, len(kept))


def gate_artifact(model: LogisticModel, fit: GateFit, lenient: float) -> dict:
    return {"model": model.__dict__, "threshold": fit.threshold, "from_threshold": lenient}
