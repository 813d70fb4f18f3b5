"""training/data/cache_pairs_real/pairs.jsonl: the pairs written by people, as shipped. Its
held-out split follows from the pairs alone and shares no question with train; every pair
has a known category and the label that category implies; each category has its minimum;
and the file is what the builder makes of its hand-written sources."""

import json
from collections import Counter

import pytest

from training import artifacts
from training.cache import real_sources
from training.cache.real_pairs import HELDOUT_SHARE, SPLITS, assign_splits
from training.cache.sharegpt_repeats import normal_key

PAIRS = [json.loads(line) for line in artifacts.REAL_PAIRS.read_text().splitlines()]
# Minimums per (source, category), both splits together.
MINIMUMS = {
    ("handwritten", "paraphrase"): 150,
    ("handwritten", "near_repeat"): 60,
    ("handwritten", "negation"): 60,
    ("handwritten", "number"): 60,
    ("handwritten", "entity"): 60,
    ("handwritten", "scope"): 60,
    ("handwritten", "followup"): 35,
    ("sharegpt", "exact_repeat"): 100,
    ("sharegpt", "followup"): 50,
    ("sharegpt", "paraphrase"): 20,
    ("rules", "rule_edit"): 1000,
}


def _without_split(p: dict) -> dict:
    return {k: v for k, v in p.items() if k not in ("id", "split")}


def test_the_split_follows_from_the_pairs_alone() -> None:
    again = assign_splits([_without_split(p) for p in reversed(PAIRS)])
    assert {p["id"]: p["split"] for p in again} == {p["id"]: p["split"] for p in PAIRS}
    assert len({p["id"] for p in PAIRS}) == len(PAIRS), "a pair twice"


def test_no_question_is_in_both_splits() -> None:
    seen: dict[str, set[str]] = {}
    for p in PAIRS:
        for text in (p["a"], p["b"]):
            seen.setdefault(normal_key(text), set()).add(p["split"])
    shared = [key for key, splits in seen.items() if len(splits) > 1]
    assert shared == []


def test_every_source_and_category_is_held_out_in_about_the_share() -> None:
    strata = Counter((p["source"], p["category"]) for p in PAIRS)
    held = Counter((p["source"], p["category"]) for p in PAIRS if p["split"] == "heldout")
    for stratum, n in strata.items():
        if n >= 30:
            assert abs(held[stratum] / n - HELDOUT_SHARE) <= 0.15, (stratum, held[stratum], n)


def test_every_pair_has_a_known_category_and_its_label() -> None:
    for p in PAIRS:
        assert p["split"] in SPLITS and p["a"].strip() and p["b"].strip()
        assert p["category"] in real_sources.CATEGORIES, p
        assert isinstance(p["should_hit"], bool)
        if p["category"] == real_sources.RULE_EDIT:
            assert p["source"] == "rules" and p["detail"], p
        else:
            assert p["should_hit"] == (p["category"] in real_sources.SHOULD_HIT), p


def test_each_category_meets_its_minimum() -> None:
    counts = Counter((p["source"], p["category"]) for p in PAIRS)
    short = {k: counts[k] for k, least in MINIMUMS.items() if counts[k] < least}
    assert short == {}
    handwritten = [p for p in PAIRS if p["source"] == "handwritten"]
    assert len(handwritten) >= 500
    assert len({p["domain"] for p in handwritten}) >= 7


def _reviewed() -> list[dict]:
    return real_sources.read_labelled(real_sources.SHAREGPT_REVIEWED, "sharegpt")


READERS = {
    "handwritten": real_sources.handwritten,
    "groups": real_sources.groups,
    "rules": real_sources.rule_edits,
    "sharegpt": _reviewed,  # the labelled rewordings; the repeats need the package
}


@pytest.mark.parametrize("source", READERS)
def test_the_file_holds_what_the_builder_reads(source: str) -> None:
    """Edit handwritten.txt (or the groups, the reviewed ShareGPT pairs, the rule pairs)
    and this fails until `python -m training cache real-pairs` runs again."""
    rows = {(r["a"], r["b"]) for r in READERS[source]()}
    shipped = {(p["a"], p["b"]) for p in PAIRS if p["source"] == source}
    if source == "sharegpt":
        shipped = {k for k in shipped if k in rows}  # the rest: repeats found in the data
    assert shipped <= rows, "pairs no longer in the source"
    assert rows - {(p["a"], p["b"]) for p in PAIRS} == set(), "pairs not built yet"
    record = json.loads(artifacts.sidecar_of(artifacts.REAL_PAIRS).read_text())
    assert record["sha256"] == artifacts.sha256_of(artifacts.REAL_PAIRS)
