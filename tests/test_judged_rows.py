"""Judged crowded-scope lookups as training rows: a pair and its reverse share a fold,
never moves the thresholds picked on the people's pairs, and is reported on its own."""

import pytest

from training.cache.judged_rows import is_people, judged_report, with_folds
from training.cache.train_aligned import pick_thresholds, served_at_wrong


def pair(i: str, a: str, b: str, hit: bool | None, source: str = "handwritten") -> dict:
    return {"id": i, "a": a, "b": b, "should_hit": hit, "source": source, "cos": 0.9}


TRAIN = [
    pair("p1", "How do I sort a list?", "sorting a list how", True) | {"fold": 2},
    pair("p2", "What is DNS?", "what does DNS do", True) | {"fold": 4},
]


def test_a_judged_row_and_its_reverse_share_a_fold() -> None:
    judged = [
        pair("j1", "sorting a list how", "What is DNS?", False, "judged"),
        pair("j2", "What is DNS?", "sorting a list how", False, "judged"),
        pair("j3", "What is DNS?", "zebra facts", False, "judged"),
        pair("j4", "and in Python?", "zebra facts", False, "judged"),
    ]
    out = with_folds(judged, TRAIN, folds=5, weight=2.0)
    # the fold of the group of the question whose key sorts first ("sorting" < "what")
    assert [r["fold"] for r in out[:3]] == [2, 2, 4]
    assert 0 <= out[3]["fold"] < 5  # questions no pair has: a fold by the first one's hash
    assert out[3]["fold"] == with_folds(judged[3:], TRAIN, 5, 1.0)[0]["fold"]
    assert {r["weight"] for r in out} == {2.0}


def test_judged_rows_never_set_the_thresholds_or_the_comparison() -> None:
    people = [pair("0", "a", "b", True), pair("1", "c", "d", False)]
    judged = [pair("j", "e", "f", False, "judged")]
    scored = {"0": 0.9, "1": 0.5, "j": 0.95}
    rows = people + judged
    probs = [scored[r["id"]] for r in rows]
    assert pick_thresholds(rows, probs, 0.6, 1) == pick_thresholds(people, probs[:2], 0.6, 1)
    assert served_at_wrong(rows, scored, 0.6) == served_at_wrong(people, scored, 0.6)


def test_the_report_counts_judged_rows_served_per_strictness() -> None:
    rows = [
        pair("s", "a", "b", True, "judged"),
        pair("n", "c", "d", False, "judged"),
        pair("p", "e", "f", False),
    ]
    scored = {"s": 0.8, "n": 0.6, "p": 0.99}
    report = judged_report(rows, scored, {"strict": 0.9, "balanced": 0.7, "lenient": 0.5})
    assert report["judged"] == "1 same, 1 not"
    assert report["strict"] == {"same_served": "0/1", "not_same_served": "0/1"}
    assert report["balanced"] == {"same_served": "1/1", "not_same_served": "0/1"}
    assert report["lenient"] == {"same_served": "1/1", "not_same_served": "1/1"}


@pytest.mark.parametrize("source", ["rules", "judged"])
def test_only_peoples_pairs_count_as_people(source: str) -> None:
    assert is_people(pair("x", "a", "b", True)) and not is_people(pair("x", "a", "b", True, source))
