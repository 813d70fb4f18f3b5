"""`tiergate calibrate-cache`: the bound it reports, the point it picks, what it writes, and
that its simulation of a lookup is what the real cache does with the chosen values.

Pairs are the shipped ones people wrote (training/data/cache_pairs_real/pairs.jsonl, its
train split); the embedder and the verifier are the real ones.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gateway.cache.semantic import CachedAnswer, CacheQuery, SemanticCache
from gateway.cache.verifier import PairVerifier
from gateway.cli import main as tiergate
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings, load_policy
from training.artifacts import REAL_PAIRS
from training.bounds import lower_bound, pairs_needed, upper_bound
from training.cache.calibrate import (
    FLOORS,
    THRESHOLDS,
    calibrate,
    read_pairs,
    score,
    scored_rows,
)
from training.cache.calibrate_cli import write_cache_keys

POLICY = """\
# a deployer's policy: comments and layout must survive --write
auth: {mode: none}
tiers:
  small: {deployments: [{model: openai/gpt-4o-mini, api_base: "http://127.0.0.1:9/v1"}]}
routes:
  auto: {default: small}
cache:
  enabled: true
  min_similarity: 0.8   # the floor
  verifier: strict
"""


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    return Embedder(max_wait_ms=0)


@pytest.fixture(scope="module")
def people_pairs() -> list[dict]:
    """Hand-written train pairs: real data, small enough to embed in seconds."""
    rows = read_pairs(REAL_PAIRS)
    return [r for r in rows if r["source"] == "handwritten" and r["split"] == "train"]


def write_pairs(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_clopper_pearson_bounds() -> None:
    for n in (10, 100, 374):  # none wrong: 1 - (1 - confidence) ** (1 / n), closed form
        assert upper_bound(0, n) == pytest.approx(1 - 0.05 ** (1 / n))
    assert upper_bound(0, 100) == pytest.approx(0.0295, abs=1e-4)
    assert upper_bound(2, 300) == pytest.approx(0.0208, abs=1e-4)
    for k, n in ((0, 5), (3, 40), (40, 40)):
        assert lower_bound(k, n) <= k / n <= upper_bound(k, n)
    assert upper_bound(3, 40, 0.99) > upper_bound(3, 40, 0.95)  # more confidence, wider
    assert upper_bound(0, 0) == 1.0 and upper_bound(5, 5) == 1.0
    assert pairs_needed(0.01) == 299 and upper_bound(0, 299) <= 0.01 < upper_bound(0, 298)
    with pytest.raises(ValueError):
        upper_bound(4, 3)
    with pytest.raises(ValueError):
        upper_bound(0, 10, 1.0)


def test_the_chosen_point_is_the_best_within_the_bound(
    people_pairs: list[dict], embedder: Embedder
) -> None:
    report = calibrate(people_pairs, embedder.embed_many, target=0.03, current=(0.8, 0.5))
    chosen = report["chosen"]
    assert chosen["wrong_rate_upper"] <= 0.03
    assert chosen["should_hit_served"] > 0
    assert report["current"]["min_similarity"] == 0.8  # the policy's point, same run
    by = chosen["by_category"]
    assert by["negation"]["upper"] >= by["negation"]["rate"]
    assert "upper" not in by["paraphrase"]  # a bound on wrong hits only
    # no grid point serves more should-hit pairs within the bound
    rows = scored_rows(people_pairs, "train", with_rule_edits=False)
    scored = score(rows, embedder.embed_many)
    label = np.array([r["should_hit"] for r in rows])
    for floor in FLOORS:
        for threshold in THRESHOLDS:
            served = scored.served(floor, threshold)
            if upper_bound(int((served & ~label).sum()), int((~label).sum())) <= 0.03:
                assert (served & label).sum() <= chosen["should_hit_served"]
    followups = sum(r["category"] == "followup" for r in people_pairs)
    assert followups > 0 and report["not_scored"] == {"followup": followups}  # kept apart by
    # the conversation's scope, not counted as must-not pairs here


async def test_the_simulated_lookup_is_what_the_cache_does(
    people_pairs: list[dict], embedder: Embedder, tmp_path: Path
) -> None:
    """Each pair in a scope of its own through the real cache at the chosen values: it
    serves exactly the pairs calibration counted as served."""
    rows = scored_rows(people_pairs, "train", with_rule_edits=False)[::3]
    scored = score(rows, embedder.embed_many)
    floor, threshold = 0.7, 0.6
    settings = CacheSettings(
        enabled=True,
        path=str(tmp_path / "c.sqlite3"),
        min_similarity=floor,
        verifier_threshold=threshold,
    )
    cache = await SemanticCache.open(settings, embedder, PairVerifier.load())
    served = []
    try:
        for n, r in enumerate(rows):
            stored = CacheQuery(f"scope-{n}", "t", "auto", r["b"], None)
            answer = CachedAnswer("an answer", "stop", 5, 2, "small", "m", None)
            await cache.store(stored, lambda b=r["b"]: embedder.embed(b), answer, None)
            asked = CacheQuery(f"scope-{n}", "t", "auto", r["a"], None)
            found = await cache.lookup(
                asked, lambda a=r["a"]: embedder.embed(a), settings.for_route(None)
            )
            served.append(found.outcome in ("exact", "semantic"))
    finally:
        await cache.close()
    assert served == scored.served(floor, threshold).tolist()
    assert 0 < sum(served) < len(rows)  # the comparison saw both outcomes


def test_too_few_must_not_pairs_cannot_meet_the_bound(
    people_pairs: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    must_not = [r for r in people_pairs if not r["should_hit"]][:50]
    rows = must_not + [r for r in people_pairs if r["should_hit"]][:50]
    path = write_pairs(tmp_path / "few.jsonl", rows)
    assert tiergate(["calibrate-cache", "--pairs", str(path), "--target-wrong", "0.01"]) == 1
    out = capsys.readouterr().out
    assert f"at least {pairs_needed(0.01)} must-not pairs" in out
    assert math.isclose(upper_bound(0, 50), 0.0582, abs_tol=1e-4)  # what 50 can vouch for


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"a": "x", "b": "y"}', "boolean `should_hit`"),
        ('{"a": 1, "b": "y", "should_hit": true}', "string `a`"),
    ],
)
def test_a_malformed_pair_file_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, line: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": "x", "b": "y", "should_hit": true}\n' + line + "\n")
    assert tiergate(["calibrate-cache", "--pairs", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2" in err and message in err


def test_write_sets_the_keys_in_place_and_keeps_the_rest(
    people_pairs: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", people_pairs)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("verifier: strict", "verifier: 'off'"))
    args = ["calibrate-cache", "--pairs", str(pairs), "--target-wrong", "0.03"]
    assert tiergate([*args, "--write"]) == 2  # --write needs a policy
    assert tiergate([*args, "--policy", str(policy), "--write"]) == 0
    out = capsys.readouterr().out
    cache = load_policy(policy).cache
    assert f"min_similarity: {cache.min_similarity}" in out  # replaced in place
    assert f"verifier_threshold: {cache.verifier_threshold}" in out  # a new line
    assert cache.verifier == "strict"  # was off: the threshold is the verifier's
    text = policy.read_text()
    assert "# a deployer's policy" in text and "# the floor" in text and cache.enabled


def test_write_refuses_what_it_cannot_edit_and_leaves_the_file(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(POLICY.split("cache:")[0] + "cache: {enabled: true}\n")
    before = flow.read_text()
    with pytest.raises(ValueError, match="not a block mapping"):
        write_cache_keys(flow, {"min_similarity": 0.7})
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY)
    with pytest.raises(ValueError, match="would not load"):
        write_cache_keys(bad, {"min_similarity": 7})  # out of range: refused, not written
    assert flow.read_text() == before and bad.read_text() == POLICY
    bare = tmp_path / "bare.yaml"
    bare.write_text(POLICY.split("cache:")[0])
    write_cache_keys(bare, {"min_similarity": 0.7, "verifier_threshold": 0.9})
    assert load_policy(bare).cache.verifier_threshold == 0.9  # a section of its own


def test_reported_pairs_without_a_split_count_in_every_split(
    people_pairs: list[dict], embedder: Embedder, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The export's rows (no `split`) join the shipped pairs: `--pairs` repeats."""
    reported = [
        {"a": "How can I create a budget?", "b": "How do I make a budget?", "should_hit": False},
        {"a": "who was the author of Hamlet", "b": "Who wrote Hamlet?", "should_hit": False},
    ]
    report = calibrate(people_pairs + reported, embedder.embed_many, target=0.03)
    assert report["chosen"]["by_category"]["must_not"]["pairs"] == 2
    shipped = write_pairs(tmp_path / "people.jsonl", people_pairs)
    exported = write_pairs(tmp_path / "wrong-hits.jsonl", reported)
    args = ["--pairs", str(shipped), "--pairs", str(exported), "--target-wrong", "0.03"]
    assert tiergate(["calibrate-cache", *args]) == 0
    out = capsys.readouterr().out
    assert f"{shipped}, {exported}" in out and "must_not" in out
