"""The train side's crowded scope, simulated: thresholds per lookup, not per pair.

In a deployment one scope holds many questions, and a lookup serves the first of its
nearest stored questions that the verifier accepts (gateway/cache/semantic.py). A threshold
that lets 1% of must-not pairs through, pair by pair, lets far more lookups through when
each meets two or three neighbours (bench/cache_populated.py). Here every people's train
question is one lookup; its candidates are the stored questions its pairs and its judged
neighbours name (neighbours_judged_train.jsonl covers its 3 nearest at cosine 0.4 or more),
nearest first, the first `candidates` of them at the floor or above. The first whose
probability reaches the threshold is served: right when its label says the same ask, wrong
otherwise. Stored questions that no row names (equivalent questions of other pairs, far
neighbours the shipped model gave under 0.02) are left out, so serving is undercounted.
"""

from collections import defaultdict
from dataclasses import dataclass

from training.bounds import upper_bound
from training.cache.judged_rows import is_people

# the lowest floor the judged neighbours cover: a lower floor lets more candidates through,
# so thresholds kept here hold at the higher floors too
LOOKUP_FLOOR = 0.4


@dataclass(frozen=True)
class Outcome:
    lookups: int
    right: int
    wrong: int

    def report(self) -> dict:
        return {
            "lookups": self.lookups,
            "served_right": self.right,
            "served_wrong": self.wrong,
            "wrong_share": round(self.wrong / max(self.lookups, 1), 4),
            "wrong_upper_95": round(upper_bound(self.wrong, self.lookups), 4),
        }


def lookups_of(rows: list[dict], candidates: int, floor: float = LOOKUP_FLOOR) -> list[list[dict]]:
    """Each people's question's candidates (rows asked with it), nearest first."""
    asked = defaultdict(list)
    for r in rows:
        if r["source"] != "rules":
            asked[r["a"]].append(r)
    people = {r["a"] for r in rows if is_people(r)}
    return [
        sorted((r for r in asked[a] if r["cos"] >= floor), key=lambda r: -r["cos"])[:candidates]
        for a in sorted(people)
    ]


def outcome(lookups: list[list[dict]], scored: dict[str, float], threshold: float) -> Outcome:
    right = wrong = 0
    for found in lookups:
        served = next((r for r in found if scored[r["id"]] >= threshold), None)
        if served is not None:
            right += served["should_hit"]
            wrong += not served["should_hit"]
    return Outcome(len(lookups), right, wrong)


def lookup_threshold(lookups: list[list[dict]], scored: dict[str, float], target: float) -> float:
    """The lowest threshold at which no higher one serves more than `target` of the lookups
    wrong: lowered past each wrong candidate's probability while the budget holds."""
    allowed = int(target * len(lookups))
    wrong_probs = sorted(
        {scored[r["id"]] for found in lookups for r in found if not r["should_hit"]}, reverse=True
    )
    for p in wrong_probs:
        if p > 0 and outcome(lookups, scored, p).wrong > allowed:
            return round(min(p + 1e-6, 0.9999), 6)
    return 0.0
