"""bench/cache_populated.py's judging: a hit on the pair's own stored question, on one that
should-hit pairs join to the asked question, on one a must-not pair sets apart, or on
another (not judged); the wrong hits known count a must-not pair's own edit and the
questions set apart."""

from bench.cache_populated import Labels, figures, judge

ASKED = "How do I undo the last commit in git?"
SAME = "how to revert my latest git commit"
APART = "How do I undo the last push in git?"
LABELS = Labels.of(
    [
        {"a": ASKED, "b": SAME, "should_hit": True},
        {"a": ASKED, "b": APART, "should_hit": False},
    ]
)


def row(b: str, should_hit: bool, category: str, source: str = "handwritten") -> dict:
    return {"a": ASKED, "b": b, "should_hit": should_hit, "category": category} | {
        "source": source,
        "split": "heldout",
    }


def test_hits_are_judged_own_joined_different_or_other() -> None:
    must_not = row("How do I undo the last commit in svn?", False, "entity")
    assert judge(must_not, None, LABELS) == "miss"
    assert judge(must_not, must_not["b"], LABELS) == "own"
    assert judge(must_not, SAME, LABELS) == "joined"  # people said it asks the same
    assert judge(must_not, "how do I UNDO the last commit in git", LABELS) == "joined"
    assert judge(must_not, APART, LABELS) == "different"  # people said it does not
    assert judge(must_not, "How do I delete a git branch?", LABELS) == "other"


def test_figures_count_the_wrong_hits_known_and_list_them_and_the_others() -> None:
    rows = [
        row(SAME, True, "paraphrase"),
        row("something", True, "paraphrase"),  # served a question set apart: wrong
        row("x", False, "scope"),  # served its own edit: wrong
        row("y", False, "negation"),  # served another question: not judged
        row("z", False, "negation", source="rules"),  # not people's: not counted
    ]
    served = [SAME, APART, "x", "another question", "z"]
    out = figures(rows, served, [judge(r, s, LABELS) for r, s in zip(rows, served, strict=True)])
    assert (out["should_hit"]["served_own"], out["should_hit"]["served_different"]) == (1, 1)
    assert out["should_hit"]["right_share"] == 0.5
    assert (out["must_not"]["served_own"], out["must_not"]["served_other"]) == (1, 1)
    wrong = out["wrong"]
    assert (wrong["lookups"], wrong["known"], wrong["unjudged"]) == (4, 2, 1)
    assert wrong["share_if_unjudged_wrong"] == 0.75
    assert [h["served"] for h in out["other_hits"]] == ["another question"]
    assert [h["served"] for h in out["wrong_hits"]] == [APART, "x"]  # listed for reading
