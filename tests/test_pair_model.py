"""The cross-encoder pair model and the verifier around it: the shipped ONNX file loads and
scores, a batch scores as its pairs one by one, concurrent lookups share forward passes,
the vetoes still decide first, and bad calls fail loudly."""

import asyncio
import json
from pathlib import Path

import pytest

from gateway.cache import pair_model
from gateway.cache.cross_verifier import CrossVerifier
from gateway.cache.pair_model import (
    PAIR_CONFIG,
    PAIR_MODEL,
    PairBatcher,
    PairModel,
    PairModelUnavailable,
)
from gateway.cache.verifier import STRICTNESS
from training.artifacts import sha256_of

PARAPHRASE = ("What's the best way to learn Python quickly?", "How can I learn Python fast?")
SCOPE = ("How do I learn Python for data science?", "How do I learn Python?")
PAIRS = [
    PARAPHRASE,
    SCOPE,
    ("Why is the sky blue?", "What makes the sky look blue?"),
    ("How do I center a div in CSS?", "What is the capital of Peru?"),
    ("Write a haiku about autumn leaves falling slowly to the ground", "haiku on autumn"),
]


@pytest.fixture(scope="module")
def model() -> PairModel:
    return PairModel()


@pytest.fixture(scope="module")
def verifier() -> CrossVerifier:
    return CrossVerifier.load()


def test_the_shipped_model_is_the_one_its_thresholds_were_picked_for() -> None:
    config = json.loads(PAIR_CONFIG.read_text())
    assert config["onnx_sha256"] == sha256_of(PAIR_MODEL)
    assert PAIR_MODEL.stat().st_size < 50e6
    t = config["thresholds"]
    assert set(t) == set(STRICTNESS) and t["strict"] >= t["balanced"] >= t["lenient"] > 0


def test_scores_are_probabilities_that_tell_a_rewording_from_another_ask(model) -> None:
    probs = model.score_pairs([a for a, _ in PAIRS], [b for _, b in PAIRS])
    assert len(probs) == len(PAIRS) and all(0.0 <= p <= 1.0 for p in probs)
    assert probs[0] > 0.5 > probs[3]  # a rewording; an unrelated question
    assert probs[0] > probs[1]  # a narrower ask scores below the rewording


def test_a_batch_scores_as_its_pairs_one_by_one(model) -> None:
    batch = model.score_pairs([a for a, _ in PAIRS], [b for _, b in PAIRS])
    single = [model.score_pairs([a], [b])[0] for a, b in PAIRS]
    assert batch == single  # exactly: a pair's score never depends on its neighbours


def test_long_texts_are_cut_not_refused(model) -> None:
    long = "Explain this log line by line: " + "error at frame 12 in module x; " * 400
    (p,) = model.score_pairs([long], [long[:500]])
    assert 0.0 <= p <= 1.0


def test_bad_calls_fail_loudly(model, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="as many"):
        model.score_pairs(["a", "b"], ["a"])
    assert model.score_pairs([], []) == []
    with pytest.raises(PairModelUnavailable, match="training cache pair-model"):
        PairModel(tmp_path / "missing.onnx")


async def test_concurrent_lookups_share_forward_passes(model) -> None:
    batcher = PairBatcher(model, batch_size=16, max_wait_ms=20)
    before = model.passes
    try:
        results = await asyncio.gather(*(batcher.score([a], [b]) for a, b in PAIRS))
    finally:
        await batcher.close()
    assert model.passes - before < len(PAIRS)  # batched: fewer turns than lookups
    alone = [model.score_pairs([a], [b])[0] for a, b in PAIRS]
    assert [r[0] for r in results] == pytest.approx(alone, abs=1e-4)


async def test_vetoes_decide_before_the_model_and_verdicts_follow_thresholds(verifier) -> None:
    query, stored = PARAPHRASE
    p = verifier.model.score_pairs([query], [stored])[0]
    cands = [stored, "What's the best way to learn Python 3 quickly?", query.upper()]
    verdicts = await verifier.verify_many(query, cands, "lenient")
    assert verdicts[1].reason == "numbers differ" and verdicts[1].probability == 0.0
    assert verdicts[2].accept and verdicts[2].probability == 1.0  # the same words
    assert verdicts[0].probability == pytest.approx(p, abs=1e-4)
    assert verdicts[0].accept == (p >= verifier.thresholds["lenient"])
    assert verifier.verify(query, stored, 0.0, "strict").accept == (
        p >= verifier.thresholds["strict"]
    )
    assert not verifier.verify(query, stored, 0.0, "lenient", threshold=1.0).accept
    scores = verifier.score_pairs([query, query], [stored, cands[1]])
    assert scores[0] == pytest.approx(p, abs=1e-4) and scores[1] == 0.0
    with pytest.raises(ValueError, match="strictness"):
        await verifier.verify_many(query, [stored], "paranoid")
    await verifier.close()


def test_where_products_saturate_the_exact_graph_is_written_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a CPU without VNNI (or told so) the rewritten graph lands in the cache folder
    and the next start reads it instead of rewriting; both score the same."""
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pair_model, "products_saturate", lambda: True)
    first = PairModel()
    (written,) = tmp_path.glob("*/*.onnx")
    stamp = written.stat().st_mtime_ns
    second = PairModel()
    assert written.stat().st_mtime_ns == stamp
    queries, candidates = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    assert first.score_pairs(queries, candidates) == second.score_pairs(queries, candidates)
