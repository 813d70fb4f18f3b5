"""The train side's crowded scope, simulated: a lookup serves its nearest candidate that
reaches the threshold, and the threshold per lookup keeps wrong lookups within a target."""

import pytest

from training.cache.scope_lookups import lookup_threshold, lookups_of, outcome


def row(i: str, a: str, hit: bool, cos: float, source: str = "handwritten") -> dict:
    return {"id": i, "a": a, "b": f"stored {i}", "should_hit": hit, "source": source, "cos": cos}


ROWS = [
    row("own", "q1", True, 0.80),
    row("nbr", "q1", False, 0.90, "judged"),  # nearer than q1's own stored question
    row("far", "q1", False, 0.30, "judged"),  # under the floor: never a candidate
    row("rule", "q1", False, 0.95, "rules"),  # a rule edit is no stored question of a lookup
    row("must", "q2", False, 0.85),
    row("lone", "q3", False, 0.70, "judged"),  # asked by no people's pair: no lookup
]


def test_a_lookup_holds_its_pairs_and_judged_neighbours_nearest_first() -> None:
    lookups = lookups_of(ROWS, candidates=3)
    assert [[r["id"] for r in found] for found in lookups] == [["nbr", "own"], ["must"]]
    assert [[r["id"] for r in f] for f in lookups_of(ROWS, candidates=1)] == [["nbr"], ["must"]]


def test_the_nearest_candidate_that_passes_is_served() -> None:
    lookups = lookups_of(ROWS, candidates=3)
    scored = {"own": 0.9, "nbr": 0.6, "must": 0.2}
    assert outcome(lookups, scored, 0.5) == outcome(lookups, scored, 0.55)
    assert (outcome(lookups, scored, 0.5).right, outcome(lookups, scored, 0.5).wrong) == (0, 1)
    assert (outcome(lookups, scored, 0.7).right, outcome(lookups, scored, 0.7).wrong) == (1, 0)
    assert outcome(lookups, scored, 0.95).report()["served_right"] == 0


def test_the_threshold_stays_above_every_wrong_serve_past_the_budget() -> None:
    lookups = lookups_of(ROWS, candidates=3)
    scored = {"own": 0.9, "nbr": 0.6, "must": 0.2}
    assert lookup_threshold(lookups, scored, target=0.0) == pytest.approx(0.6 + 1e-6)
    assert lookup_threshold(lookups, scored, target=0.5) == pytest.approx(0.2 + 1e-6)
    assert lookup_threshold(lookups, scored, target=1.0) == 0.0
