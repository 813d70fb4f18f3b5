"""The pair model's operating points: thresholds for strict / balanced / lenient on dev pairs.

A pair is served when no lexical veto refuses it and the model's probability reaches the
threshold. Only the people's must-not pairs count toward the wrong-hit targets (rule-made
ones are easier and would loosen them); the highest threshold that meets a target is
never picked, the lowest is: it serves the most.
"""

import itertools

from gateway.cache.cross_verifier import decide
from gateway.cache.verifier import STRICTNESS, PairVerifier


def vetoes(rows: list[dict]) -> list[str]:
    """The lexical veto the gateway applies to every pair ("" when none refuses it)."""
    rules = PairVerifier.load()
    out = []
    for r in rows:
        decided = decide(rules, r["a"], r["b"])
        out.append(decided[1] if decided else "")
    return out


def pick_thresholds(
    rows: list[dict], probs: list[float], targets: dict[str, float]
) -> dict[str, float]:
    vetoed = vetoes(rows)
    negatives = sorted(
        (
            p
            for r, p, v in zip(rows, probs, vetoed, strict=True)
            if not r["should_hit"] and r["source"] != "rules" and not v
        ),
        reverse=True,
    )
    human_neg = sum(1 for r in rows if not r["should_hit"] and r["source"] != "rules")
    out = {}
    for name in STRICTNESS:
        allowed = int(targets[name] * human_neg)  # wrong hits we may take on dev
        t = negatives[allowed] + 1e-4 if allowed < len(negatives) else 0.5
        out[name] = round(min(t, 0.9999), 4)
    return out


FLOORS = (0.0, 0.5, 0.6, 0.65, 0.7, 0.8)  # cosine floors the dev report compares


def dev_report(
    rows: list[dict], probs: list[float], thresholds: dict[str, float], cosines: list[float]
) -> dict:
    """The people's dev pairs served at each strictness and cosine floor: what the policy's
    default floor is chosen from."""
    vetoed = vetoes(rows)
    report = {}
    for (name, t), floor in itertools.product(thresholds.items(), FLOORS):
        served = [
            not v and p >= t and c >= floor for p, v, c in zip(probs, vetoed, cosines, strict=True)
        ]
        people = [(s, r) for s, r in zip(served, rows, strict=True) if r["source"] != "rules"]
        pos = [s for s, r in people if r["should_hit"]]
        neg = [s for s, r in people if not r["should_hit"]]
        report[f"{name}@{floor}"] = {
            "threshold": t,
            "should_hit_served": round(sum(pos) / max(len(pos), 1), 4),
            "must_not_served": f"{sum(neg)}/{len(neg)}",
        }
    return report
