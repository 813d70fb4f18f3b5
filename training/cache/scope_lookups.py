"""The train side's crowded scope, simulated: thresholds per lookup, not per pair.

In a deployment one scope holds many questions, and a lookup serves the first of its
nearest stored questions that the verifier accepts (gateway/cache/semantic.py). A threshold
that lets 1% of must-not pairs through, pair by pair, lets far more lookups through when
each meets two or three neighbours (bench/cache_populated.py). Here every people's train
question is one lookup; its stored questions are the ones its pairs and its judged
neighbours name (neighbours_judged_train.jsonl covers its 3 nearest at cosine 0.4 or more),
read as `tiergate calibrate-cache --per-lookup` reads a lookup (calibrate_lookups.py: the
exact table, then the first `candidates` at the floor or above, nearest first). The first
whose probability reaches the threshold is served: right when its label says the same ask,
wrong otherwise. Stored questions that no row names (equivalent questions of other pairs,
far neighbours the shipped model gave under 0.02) are left out, so serving is undercounted.
"""

from dataclasses import dataclass

from training.cache.calibrate import Scored, scored_of
from training.cache.calibrate_lookups import (
    LookupOutcome,
    lookups,
    nearest_read,
    outcome,
    served_counts,
)
from training.cache.judged_rows import is_people

# the lowest floor the judged neighbours cover: a lower floor lets more candidates through,
# so thresholds kept here hold at the higher floors too
LOOKUP_FLOOR = 0.4


@dataclass(frozen=True)
class TrainScope:
    """The people's train questions as lookups, scored by one verifier's probabilities."""

    scored: Scored
    groups: list[list[int]]  # row indices per lookup, nearest stored question first
    candidates: int

    def outcome(self, threshold: float) -> LookupOutcome:
        return outcome(self.scored, self.groups, LOOKUP_FLOOR, threshold, self.candidates)

    def served_wrong(self, threshold: float) -> int:
        """Lookups served wrong (no could-hit count: the threshold search asks this often)."""
        return served_counts(self.scored, self.groups, LOOKUP_FLOOR, threshold, self.candidates)[1]

    def wrong_candidates(self) -> set[float]:
        """The probabilities of the must-not rows a lookup reads (at the floor, nearest k)."""
        s = self.scored
        read = [i for found in self.groups for i in self.read(found)]
        return {float(s.probability[i]) for i in read if not s.rows[i]["should_hit"]}

    def read(self, found: list[int]) -> list[int]:
        return nearest_read(self.scored, found, LOOKUP_FLOOR, self.candidates)


def train_scope(rows: list[dict], scored: dict[str, float], candidates: int) -> TrainScope:
    """`rows` need `cos`; `scored` maps a row id to its probability. Rule edits are no
    stored question of a lookup, and only questions people asked are looked up."""
    people = {r["a"] for r in rows if is_people(r)}
    kept = [r for r in rows if r["source"] != "rules" and r["a"] in people]
    as_scored = scored_of(kept, [r["cos"] for r in kept], [scored[r["id"]] for r in kept])
    return TrainScope(as_scored, lookups(as_scored), candidates)


def lookup_threshold(scope: TrainScope, target: float) -> float:
    """The lowest threshold at which no higher one serves more than `target` of the lookups
    wrong: lowered past each wrong candidate's probability while the budget holds."""
    allowed = int(target * len(scope.groups))
    for p in sorted(scope.wrong_candidates(), reverse=True):
        if p > 0 and scope.served_wrong(p) > allowed:
            return round(min(p + 1e-6, 0.9999), 6)
    return 0.0
