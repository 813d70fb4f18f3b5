"""A lookup that meets one stored question is one pair: held to the verifier's pair-by-pair
threshold, not the crowded-scope one (cache.one_candidate_thresholds)."""

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cache.semantic import CachedAnswer, CacheQuery, SemanticCache
from gateway.cache.verifier import ONE_CANDIDATE, STRICTNESS, PairVerifier, Verdict
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings
from training.artifacts import (
    ALIGNED_MODEL,
    NLI_MODEL,
    REAL_PAIRS,
    VERIFIER_MODEL,
    sha256_of,
    sidecar_of,
)
from training.cache.one_candidate import amend

ANSWER = CachedAnswer("an answer", "stop", 12, 3, "small", "m", None)


class Recording:
    """A stand-in verifier with one-candidate thresholds: records the threshold it is given."""

    def __init__(self) -> None:
        self.given: list[float | None] = []

    def one_candidate_threshold(self, strictness: str) -> float | None:
        return {"balanced": 0.25}.get(strictness)

    def verify(self, query, candidate, cosine, strictness, threshold=None, reads=None) -> Verdict:
        self.given.append(threshold)
        return Verdict(False, 0.0, "low probability")


async def opened(tmp_path: Path, embedder: Embedder, verifier, **settings) -> SemanticCache:
    values = {"enabled": True, "path": str(tmp_path / "c.sqlite3"), "min_similarity": 0.5}
    return await SemanticCache.open(CacheSettings(**values | settings), embedder, verifier)


async def store(cache: SemanticCache, embedder: Embedder, text: str) -> None:
    vector = await embedder.embed(text)

    async def embed() -> np.ndarray:
        return vector

    assert await cache.store(CacheQuery("s", "t", "r", text, None), embed, ANSWER, None)


async def lookup(cache: SemanticCache, embedder: Embedder, text: str, strictness="balanced"):
    vector = await embedder.embed(text)

    async def embed() -> np.ndarray:
        return vector

    route = cache.settings.for_route(None).model_copy(update={"verifier": strictness})
    return await cache.lookup(CacheQuery("s", "t", "r", text, None), embed, route)


async def test_one_candidate_gets_the_pair_threshold_two_get_the_lookup_one(
    tmp_path, embedder
) -> None:
    verifier = Recording()
    cache = await opened(tmp_path, embedder, verifier)
    await store(cache, embedder, "How do I reverse a list in Python?")
    await lookup(cache, embedder, "What's the way to reverse a Python list?")
    await lookup(cache, embedder, "What's the way to reverse a Python list?", "strict")  # none
    await store(cache, embedder, "How do I reverse a list in Python 3?")
    await lookup(cache, embedder, "What's the way to reverse a Python list?")
    assert verifier.given == [0.25, None, None, None]
    await cache.close()


async def test_switched_off_or_a_calibrated_threshold_holds_every_lookup(
    tmp_path, embedder
) -> None:
    for settings, expected in (
        ({"one_candidate_thresholds": False}, None),
        ({"verifier_threshold": 0.9}, 0.9),
    ):
        verifier = Recording()
        cache = await opened(tmp_path / str(expected), embedder, verifier, **settings)
        await store(cache, embedder, "How do I reverse a list in Python?")
        await lookup(cache, embedder, "What's the way to reverse a Python list?")
        assert verifier.given == [expected]
        await cache.close()


@pytest.mark.parametrize("artifact", [VERIFIER_MODEL, ALIGNED_MODEL, NLI_MODEL])
def test_shipped_artifacts_carry_their_fits_pair_thresholds(artifact: Path) -> None:
    shipped = json.loads(artifact.read_text())
    figures = json.loads(sidecar_of(artifact).read_text())["figures"]
    assert shipped[ONE_CANDIDATE] == figures["thresholds_per_pair"]
    for name in STRICTNESS:
        assert 0 < shipped[ONE_CANDIDATE][name] <= shipped["thresholds"][name]


def test_amend_writes_the_sidecars_thresholds_and_refuses_a_changed_artifact(
    tmp_path: Path,
) -> None:
    artifact = tmp_path / "verifier_model.json"
    shipped = json.loads(VERIFIER_MODEL.read_text())
    shipped.pop(ONE_CANDIDATE, None)
    artifact.write_text(json.dumps(shipped, separators=(",", ":")) + "\n")
    sidecar = json.loads(sidecar_of(VERIFIER_MODEL).read_text())
    sidecar_of(artifact).write_text(json.dumps(sidecar | {"sha256": "not this file"}))
    with pytest.raises(ValueError, match="not the artifact"):
        amend(artifact)
    sidecar_of(artifact).write_text(json.dumps(sidecar | {"sha256": sha256_of(artifact)}))
    written = amend(artifact)
    assert written == sidecar["figures"]["thresholds_per_pair"]
    assert json.loads(artifact.read_text())[ONE_CANDIDATE] == written
    assert json.loads(sidecar_of(artifact).read_text())["sha256"] == sha256_of(artifact)
    assert PairVerifier.load(artifact).one_candidate == written


def between_thresholds(verifier: PairVerifier, embedder: Embedder) -> tuple[str, str]:
    """A train pair the shipped logistic model scores between its balanced one-candidate and
    lookup thresholds, its stored question with "!" added too (a second candidate)."""
    low, high = verifier.one_candidate["balanced"], verifier.thresholds["balanced"]
    rows = [json.loads(line) for line in REAL_PAIRS.read_text().splitlines() if line.strip()]
    for row in (r for r in rows if r["split"] == "train" and r["should_hit"]):
        a, b = row["a"], row["b"]
        vectors = embedder.embed_many([a, b, b + "!"])
        cosines = [float(vectors[0] @ vectors[i]) for i in (1, 2)]
        pairs = zip((b, b + "!"), cosines, strict=True)
        probs = [verifier.probability(a, c, cos)[0] for c, cos in pairs]
        if min(cosines) >= 0.5 and all(low <= p < high - 0.01 for p in probs):
            return a, b
    raise AssertionError("no train pair between the two thresholds")


async def test_the_shipped_logistic_serves_a_lone_rewording_it_refuses_among_two(
    tmp_path, embedder
) -> None:
    verifier = PairVerifier.load()
    a, b = between_thresholds(verifier, embedder)
    alone = await opened(tmp_path / "alone", embedder, verifier)
    await store(alone, embedder, b)
    assert (await lookup(alone, embedder, a)).outcome == "semantic"
    await alone.close()
    crowded = await opened(tmp_path / "two", embedder, verifier)
    await store(crowded, embedder, b)
    await store(crowded, embedder, b + "!")
    found = await lookup(crowded, embedder, a)
    assert (found.outcome, found.refused) == ("miss", 2)
    await crowded.close()


def test_calibrate_cache_compares_pairs_with_the_threshold_a_lone_pair_meets() -> None:
    """Pair by pair each pair is a lookup with one candidate: the policy's current point is
    its one-candidate threshold; per lookup, or with the key off, the crowded-scope one."""
    from types import SimpleNamespace

    from training.cache.calibrate_cli import _current

    verifier = PairVerifier.load()
    lone, crowded = verifier.one_candidate["balanced"], verifier.thresholds["balanced"]
    on = SimpleNamespace(cache=CacheSettings())
    off = SimpleNamespace(cache=CacheSettings(one_candidate_thresholds=False))
    fixed = SimpleNamespace(cache=CacheSettings(verifier_threshold=0.9))
    assert _current(on) == (0.6, lone) and lone < crowded
    assert _current(on, per_lookup=True) == (0.6, crowded)
    assert _current(off) == (0.6, crowded)
    assert _current(fixed) == (0.6, 0.9)
