"""The train side's crowded scope, simulated: a lookup serves its nearest candidate that
reaches the threshold, and the threshold per lookup keeps wrong lookups within a target."""

import pytest

from training.cache.scope_lookups import lookup_threshold, train_scope


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
SCORED = {"own": 0.9, "nbr": 0.6, "far": 0.99, "rule": 0.99, "must": 0.2, "lone": 0.99}


def ids(candidates: int) -> list[list[str]]:
    scope = train_scope(ROWS, SCORED, candidates)
    return [[scope.scored.rows[i]["id"] for i in scope.read(found)] for found in scope.groups]


def test_a_lookup_holds_its_pairs_and_judged_neighbours_nearest_first() -> None:
    assert ids(candidates=3) == [["nbr", "own"], ["must"]]
    assert ids(candidates=1) == [["nbr"], ["must"]]


def test_the_nearest_candidate_that_passes_is_served() -> None:
    scope = train_scope(ROWS, SCORED, candidates=3)
    assert scope.outcome(0.5) == scope.outcome(0.55)
    assert (scope.outcome(0.5).right, scope.outcome(0.5).wrong) == (0, 1)
    assert (scope.outcome(0.7).right, scope.outcome(0.7).wrong) == (1, 0)
    assert scope.outcome(0.95).figures(0.95)["served_right"] == 0


def test_the_exact_table_serves_before_the_verifier() -> None:
    same = {**row("same", "q2", True, 0.99), "b": "q2"}  # the question itself, stored
    scope = train_scope([*ROWS, same], {**SCORED, "same": 0.0}, candidates=3)
    assert (scope.outcome(0.95).right, scope.outcome(0.95).wrong) == (1, 0)


def test_the_threshold_stays_above_every_wrong_serve_past_the_budget() -> None:
    scope = train_scope(ROWS, SCORED, candidates=3)
    assert lookup_threshold(scope, target=0.0) == pytest.approx(0.6 + 1e-6)
    assert lookup_threshold(scope, target=0.5) == pytest.approx(0.2 + 1e-6)
    assert lookup_threshold(scope, target=1.0) == 0.0
