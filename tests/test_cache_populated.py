"""bench/cache_populated.py's judging: a hit on the pair's own stored question, on one
people joined to the asked question through should-hit pairs, or on another; the must-not
pairs' own hits are the certain wrong ones."""

from bench.cache_populated import figures, judge
from training.cache.real_pairs import groups_of

ASKED = "How do I undo the last commit in git?"
SAME = "how to revert my latest git commit"
PAIRS = [
    {"a": ASKED, "b": SAME, "should_hit": True},
    {"a": ASKED, "b": "How do I undo the last push in git?", "should_hit": False},
]
JOINED = groups_of([p for p in PAIRS if p["should_hit"]])


def row(b: str, should_hit: bool, category: str) -> dict:
    return {"a": ASKED, "b": b, "should_hit": should_hit, "category": category}


def test_hits_are_judged_own_joined_or_other() -> None:
    must_not = row("How do I undo the last push in git?", False, "scope")
    assert judge(must_not, None, JOINED) == "miss"
    assert judge(must_not, must_not["b"], JOINED) == "own"
    assert judge(must_not, SAME, JOINED) == "joined"  # people said it asks the same
    assert judge(must_not, "how do I UNDO the last commit in git", JOINED) == "joined"
    assert judge(must_not, "How do I delete a git branch?", JOINED) == "other"


def test_figures_count_each_kind_and_list_the_other_hits() -> None:
    rows = [
        row(SAME, True, "paraphrase") | {"source": "handwritten", "split": "heldout"},
        row("x", False, "scope") | {"source": "handwritten", "split": "heldout"},
        row("y", False, "negation") | {"source": "handwritten", "split": "heldout"},
        row("z", False, "negation") | {"source": "rules", "split": "heldout"},  # not people's
    ]
    served = [SAME, "x", "another question", "z"]
    out = figures(rows, served, [judge(r, s, JOINED) for r, s in zip(rows, served, strict=True)])
    assert out["should_hit"] == {
        "pairs": 1,
        "served_own": 1,
        "served_joined": 0,
        "served_other": 0,
        "right_share": 1.0,
    }
    assert (out["must_not"]["served_own"], out["must_not"]["served_other"]) == (1, 1)
    assert out["must_not"]["own_share"] == 0.5
    assert [h["served"] for h in out["other_hits"]] == ["another question"]
