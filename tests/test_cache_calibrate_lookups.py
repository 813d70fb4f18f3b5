"""`tiergate calibrate-cache --per-lookup`: the rows that share an asked question are one
lookup in a crowded scope; the chosen point bounds the lookups served wrong.

Real data: the people's train pairs and the judged neighbours of the train questions
(training/data/cache_pairs_real), the real embedder and the shipped verifier, and the real
cache for the check that the simulation is what a lookup does.
"""

import json
from pathlib import Path

import pytest

from gateway.cache.semantic import CachedAnswer, CacheQuery, SemanticCache
from gateway.cache.verifiers import load_verifier
from gateway.cli import main as tiergate
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings
from training.artifacts import REAL_PAIRS
from training.bounds import pairs_needed, upper_bound
from training.cache.calibrate import FLOORS, THRESHOLDS, read_pairs, score, scored_rows
from training.cache.calibrate_lookups import (
    calibrate_lookups,
    lookups,
    outcome,
    reads_of,
    served_row,
)

NEIGHBOURS = REAL_PAIRS.with_name("neighbours_judged_train.jsonl")
CANDIDATES = 3


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    return Embedder(max_wait_ms=0)


@pytest.fixture(scope="module")
def scope_rows() -> list[dict]:
    """The judged neighbours of 300 train questions with their people's pairs: lookups
    that meet one to four stored questions, small enough to embed in seconds."""
    neighbours = read_pairs(NEIGHBOURS)
    asked = sorted({r["a"] for r in neighbours})[:300]
    pairs = [r for r in read_pairs(REAL_PAIRS) if r["split"] == "train"]
    rows = [r | {"split": "train"} for r in [*neighbours, *pairs] if r["a"] in asked]
    return scored_rows(rows, "train", with_rule_edits=False)  # as calibration reads them


def test_the_chosen_point_is_the_best_within_the_bound(
    scope_rows: list[dict], embedder: Embedder
) -> None:
    report = calibrate_lookups(scope_rows, embedder.embed_many, CANDIDATES, target=0.03)
    chosen = report["chosen"]
    assert chosen["lookups"] == len({r["a"] for r in scope_rows})
    assert chosen["wrong_rate_upper"] <= 0.03 and chosen["served_right"] > 0
    scored = score(scope_rows, embedder.embed_many)
    groups = lookups(scored)
    assert max(len(g) for g in groups) > 1  # crowded: some lookups meet several
    for floor in FLOORS:
        for threshold in THRESHOLDS:
            seen = outcome(scored, groups, floor, threshold, CANDIDATES)
            if upper_bound(seen.wrong, seen.lookups) <= 0.03:
                assert seen.right <= chosen["served_right"]
    # a lookup's wrong hits come from any of its candidates: more than pair by pair counts
    point = (chosen["min_similarity"], chosen["verifier_threshold"])
    assert outcome(scored, groups, *point, CANDIDATES).wrong == chosen["served_wrong"]


def test_the_chosen_point_is_checked_on_the_held_out_lookups(
    scope_rows: list[dict], embedder: Embedder
) -> None:
    """Rows of split `heldout` are never tuned on: the chosen point is read on their lookups."""
    held = [r for r in read_pairs(REAL_PAIRS) if r["split"] == "heldout"][:150]
    held = scored_rows(held, "heldout", with_rule_edits=False)
    report = calibrate_lookups(scope_rows + held, embedder.embed_many, CANDIDATES, target=0.03)
    point = (report["chosen"]["min_similarity"], report["chosen"]["verifier_threshold"])
    scored = score(held, embedder.embed_many)
    expected = outcome(scored, lookups(scored), *point, CANDIDATES).figures(0.95)
    assert report["heldout_check"] == expected
    assert expected["lookups"] == len({r["a"] for r in held}) and expected["served_right"] > 0
    whole = calibrate_lookups(scope_rows + held, embedder.embed_many, CANDIDATES, 0.03, split="all")
    assert "heldout_check" not in whole  # tuned on them: nothing held out to check


@pytest.mark.parametrize(
    ("model", "model_reads", "threshold"),
    [("logistic", None, 0.3), ("nli", 1, 0.8), ("nli", None, 0.8)],
)
async def test_the_simulated_lookups_are_what_the_cache_does(
    scope_rows: list[dict],
    embedder: Embedder,
    tmp_path: Path,
    model: str,
    model_reads: int | None,
    threshold: float,
) -> None:
    """Each asked question in a scope holding its rows' stored questions, through the real
    cache: it serves the stored question the simulation serves, or none when it does. With
    `nli` the gate refuses (0.8 is above its lenient threshold) and, with `model_reads: 1`,
    a lookup stops reading after its first gated-through candidate."""
    crowded = [r for r in scope_rows if sum(o["a"] == r["a"] for o in scope_rows) > 1]
    scored = score(crowded[:120], embedder.embed_many, model)
    groups = [g for g in lookups(scored) if len(g) > 1]
    reads = reads_of(scored, model, model_reads)
    floor = 0.5
    settings = CacheSettings(
        enabled=True,
        path=str(tmp_path / "c.sqlite3"),
        min_similarity=floor,
        verifier_threshold=threshold,
        candidates=CANDIDATES,
        verifier_model=model,
        model_reads=model_reads,
    )
    # a verifier of its own: closing the cache stops its threads
    cache = await SemanticCache.open(settings, embedder, load_verifier(model))
    served, simulated = [], []
    try:
        for n, found in enumerate(groups):
            for i in found:
                b = scored.rows[i]["b"]
                stored = CacheQuery(f"scope-{n}", "t", "auto", b, None)
                answer = CachedAnswer(b, "stop", 5, 2, "small", "m", None)
                await cache.store(stored, lambda b=b: embedder.embed(b), answer, None)
            a = scored.rows[found[0]]["a"]
            asked = CacheQuery(f"scope-{n}", "t", "auto", a, None)
            hit = await cache.lookup(asked, lambda a=a: embedder.embed(a), settings.for_route(None))
            served.append(hit.answer.text if hit.answer is not None else None)
            i = served_row(scored, found, floor, threshold, CANDIDATES, reads)
            simulated.append(scored.rows[i]["b"] if i is not None else None)
    finally:
        await cache.close()
    assert served == simulated
    assert 0 < sum(s is not None for s in served) < len(groups)  # both outcomes seen
    assert (reads is None) == (model == "logistic")  # only nli's reads are counted
    if model_reads is not None:  # the limit decided some lookup here: the check can fail
        unlimited = reads_of(scored, model, None)
        every = [served_row(scored, g, floor, threshold, CANDIDATES, unlimited) for g in groups]
        assert [scored.rows[i]["b"] if i is not None else None for i in every] != simulated


def test_the_command_reports_lookups_and_refuses_too_few(
    scope_rows: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "scope.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in scope_rows))
    args = ["calibrate-cache", "--per-lookup", "--pairs", str(path)]
    assert tiergate([*args, "--target-wrong", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "per lookup" in out and "lookups that could hit" in out
    assert "held-out check" not in out  # the file has no held-out rows
    assert "min_similarity:" in out  # the snippet to paste
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(r) + "\n" for r in scope_rows[:40]))
    assert tiergate(["calibrate-cache", "--per-lookup", "--pairs", str(few)]) == 1
    assert f"at least {pairs_needed(0.01)} lookups" in capsys.readouterr().out
