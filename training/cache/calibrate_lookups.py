"""Calibration per lookup: the floor and threshold for a bound on lookups served wrong, when
one scope holds many questions (`tiergate calibrate-cache --per-lookup`).

Pair by pair (calibrate.py) each pair is a scope of its own. In a crowded scope a lookup
meets several stored questions and serves the first the verifier accepts, so a threshold
that lets 1% of must-not pairs through lets more lookups through wrong (docs/cache.md,
"Per lookup too"). Here the rows that share an asked question `a` are one lookup and their
`b`s what that scope holds: the exact table first (the same text up to spacing), then the
`candidates` nearest at the floor or above, nearest first, as gateway/cache/semantic.py
reads them; the first whose probability reaches the threshold is served, right when its row
says should-hit. The bound is on wrong lookups over all lookups (the rate a deployment sees
on /admin/stats), and the chosen point serves the most lookups right within it.

With a verifier that gates its model's reads (`nli`), candidates are read as a lookup reads
them (nli_verifier.py): one a rule decides costs no read; one the gate refuses (at
thresholds from the gate's own up) is refused without one; each other spends a read, and
once a policy's `cache.model_reads` are spent the rest are refused.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.cache.nli_verifier import Gate
from training.bounds import pairs_needed, upper_bound
from training.cache.calibrate import (
    Embed,
    Scored,
    best_point,
    score,
    scored_rows,
    with_category,
)
from training.cache.pair_scores import verifier_for


@dataclass(frozen=True)
class LookupOutcome:
    lookups: int
    right: int
    wrong: int
    could_hit: int  # lookups with a should-hit row among their stored questions

    def figures(self, confidence: float) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "could_hit": self.could_hit,
            "served_right": self.right,
            "served_rate": round(self.right / self.could_hit, 4) if self.could_hit else 0.0,
            "served_wrong": self.wrong,
            "wrong_rate": round(self.wrong / self.lookups, 4) if self.lookups else 0.0,
            "wrong_rate_upper": round(upper_bound(self.wrong, self.lookups, confidence), 4),
        }


@dataclass(frozen=True)
class Reads:
    """What a lookup's model reads cost, per row of a Scored: `limit` reads a lookup (None:
    no limit; the gate still refuses)."""

    limit: int | None
    gate_probability: np.ndarray  # per row; nan where a rule decides (no read)
    gate: Gate  # the verifier's: which probabilities it refuses

    def gated(self, i: int, threshold: float) -> bool:
        return self.gate.refuses_at(float(self.gate_probability[i]), threshold)

    def spends(self, i: int) -> bool:
        return not np.isnan(self.gate_probability[i])


def reads_of(scored: Scored, model: str, limit: int | None) -> Reads | None:
    """The rows' read costs where the verifier counts reads (a gate before its model's
    reads); else None."""
    verifier = verifier_for(model)
    if not hasattr(verifier, "gate_probability"):
        return None
    gate = [
        verifier.gate_probability(r["a"], r["b"], float(cos))
        for r, cos in zip(scored.rows, scored.cosine, strict=True)
    ]
    as_array = np.array([np.nan if g is None else g for g in gate], dtype=float)
    return Reads(limit, as_array, verifier.gate)


def lookups(scored: Scored) -> list[list[int]]:
    """Row indices grouped by asked question, nearest stored question first."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(scored.rows):
        groups[r["a"]].append(i)
    return [sorted(ix, key=lambda i: -scored.cosine[i]) for _, ix in sorted(groups.items())]


def nearest_read(scored: Scored, found: list[int], floor: float, candidates: int) -> list[int]:
    """The stored questions a lookup's verifier reads: the first `candidates` at the floor."""
    return [i for i in found if scored.cosine[i] >= floor][:candidates]


def served_row(
    scored: Scored,
    found: list[int],
    floor: float,
    threshold: float,
    candidates: int,
    reads: Reads | None = None,
) -> int | None:
    """The row a lookup serves, or None: the exact table, then the verifier's first accept."""
    exact = next((i for i in found if scored.exact[i]), None)
    if exact is not None:
        return exact
    left = reads.limit if reads is not None else None
    for i in nearest_read(scored, found, floor, candidates):
        if reads is not None and reads.spends(i):
            if reads.gated(i, threshold) or left == 0:
                continue
            left = None if left is None else left - 1
        if scored.probability[i] >= threshold:
            return i
    return None


def outcome(
    scored: Scored,
    groups: list[list[int]],
    floor: float,
    threshold: float,
    candidates: int,
    reads: Reads | None = None,
) -> LookupOutcome:
    right, wrong = served_counts(scored, groups, floor, threshold, candidates, reads)
    could_hit = sum(any(scored.rows[i]["should_hit"] for i in found) for found in groups)
    return LookupOutcome(len(groups), right, wrong, could_hit)


def served_counts(
    scored: Scored,
    groups: list[list[int]],
    floor: float,
    threshold: float,
    candidates: int,
    reads: Reads | None = None,
) -> tuple[int, int]:
    """Lookups served right and served wrong at one point."""
    right = wrong = 0
    for found in groups:
        i = served_row(scored, found, floor, threshold, candidates, reads)
        if i is not None:
            right += scored.rows[i]["should_hit"]
            wrong += not scored.rows[i]["should_hit"]
    return right, wrong


def choose(
    scored: Scored,
    groups: list[list[int]],
    target: float,
    confidence: float,
    candidates: int,
    reads: Reads | None = None,
) -> dict[str, Any] | None:
    """The grid point serving the most lookups right within the bound; None when none is."""

    def measure(floor: float, threshold: float) -> tuple[int, int, int]:
        right, wrong = served_counts(scored, groups, floor, threshold, candidates, reads)
        return right, wrong, len(groups)  # no could_hit: the same at every point

    return best_point(measure, target, confidence)


def calibrate_lookups(
    rows: list[dict],
    embed: Embed,
    candidates: int,
    target: float = 0.01,
    confidence: float = 0.95,
    split: str = "train",
    current: tuple[float, float] | None = None,
    model: str = "logistic",
    with_rule_edits: bool = False,
    model_reads: int | None = None,
) -> dict[str, Any]:
    """The report, as calibrate() gives it, with lookups in place of pairs; `model_reads`:
    the policy's `cache.model_reads`."""
    rows = [with_category(r) for r in rows]
    tuned = scored_rows(rows, split, with_rule_edits)
    if not any(r["should_hit"] for r in tuned):
        raise ValueError(f"split {split!r} has no should-hit rows to serve")
    scored = score(tuned, embed, model)
    groups = lookups(scored)
    reads = reads_of(scored, model, model_reads)
    chosen = choose(scored, groups, target, confidence, candidates, reads)
    report: dict[str, Any] = {
        "per_lookup": True,
        "split": split,
        "verifier_model": model,
        "candidates": candidates,
        "model_reads": reads.limit if reads is not None else None,
        "target_wrong": target,
        "confidence": confidence,
        "lookups_needed": pairs_needed(target, confidence),
        "chosen": chosen,
    }
    for name, point in (("chosen", chosen), ("current", current and _point(*current))):
        if point is not None:
            floor, threshold = point["min_similarity"], point["verifier_threshold"]
            seen = outcome(scored, groups, floor, threshold, candidates, reads)
            report[name] = point | seen.figures(confidence)
    held = [r for r in scored_rows(rows, "all", with_rule_edits) if r.get("split") == "heldout"]
    if chosen is not None and split not in ("heldout", "all") and held:
        seen = _check(held, embed, model, chosen, candidates, model_reads)
        report["heldout_check"] = seen.figures(confidence)
    return report


def _check(
    rows: list[dict],
    embed: Embed,
    model: str,
    point: dict[str, float],
    candidates: int,
    model_reads: int | None,
) -> LookupOutcome:
    """The chosen point on the held-out rows' lookups (never tuned on)."""
    scored = score(rows, embed, model)
    reads = reads_of(scored, model, model_reads)
    floor, threshold = point["min_similarity"], point["verifier_threshold"]
    return outcome(scored, lookups(scored), floor, threshold, candidates, reads)


def _point(floor: float, threshold: float) -> dict[str, float]:
    return {"min_similarity": floor, "verifier_threshold": threshold}


def print_lookup_report(report: dict[str, Any]) -> None:
    print(f"pairs: {', '.join(report['pairs_files'])} (split {report['split']}), per lookup")
    reads = report["model_reads"] or "every candidate"
    print(
        f"verifier_model: {report['verifier_model']}; candidates {report['candidates']}; "
        f"model reads {reads}"
    )
    target, conf = report["target_wrong"], report["confidence"]
    if report["chosen"] is None:
        print(
            f"no (floor, threshold) keeps the {conf:.0%} upper bound of lookups served wrong "
            f"at or below {target:.2%}: that takes at least {report['lookups_needed']} lookups"
        )
    for name, title in (("chosen", "chosen"), ("current", "the policy now")):
        if point := report.get(name):
            floor, threshold = point["min_similarity"], point["verifier_threshold"]
            print(f"{title}: min_similarity {floor}, verifier threshold {threshold}")
            print(_figures_line(point, conf))
    if check := report.get("heldout_check"):
        print("held-out check (never tuned on), chosen point:")
        print(_figures_line(check, conf))


def _figures_line(point: dict[str, Any], confidence: float) -> str:
    return (
        f"  served right {point['served_rate']:.1%} ({point['served_right']}/"
        f"{point['could_hit']} lookups that could hit); wrong {point['wrong_rate']:.2%} "
        f"({point['served_wrong']}/{point['lookups']}), upper {confidence:.0%} bound "
        f"{point['wrong_rate_upper']:.2%}"
    )
