"""The `aligned` verifier: the word-piece states agree with the torch model and come with
a lookup's embeddings, the shipped artifact matches the features, the vetoes decide before
any forward pass, a lookup's query is run once for all its candidates, and through a real
cache a rewording is served while a changed piece of the question is not. Pairs from the
train split."""

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from gateway.cache.aligned_verifier import ALL_FEATURES, AlignedVerifier
from gateway.cache.entry import CachedAnswer
from gateway.cache.semantic import CacheQuery, SemanticCache
from gateway.cache.token_states import TOKEN_FEATURES, TokenStates, alignment
from gateway.cache.verifiers import VERIFIER_MODELS, load_verifier
from gateway.embedding.embedder import Embedder, default_model_path
from gateway.policy import CacheSettings
from tests.pair_verifiers import cached_lookups, check_shipped_artifact, cosine
from training.cache.train_aligned import pick_thresholds, served_at_wrong

REWORDING = ("How many people live in Tokyo?", "What's Tokyo's population?")
NARROWER = ("How do I reverse a list in Python?", "How do I reverse a linked list in Python?")


@pytest.fixture(scope="module")
def verifier() -> AlignedVerifier:
    return AlignedVerifier.load()


def test_states_follow_the_torch_model(verifier: AlignedVerifier, one_torch_thread) -> None:
    import torch
    from transformers import AutoModel

    text = NARROWER[1]
    net = AutoModel.from_pretrained(str(default_model_path())).eval()
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to 128
    e = tokenizer.encode(text)
    ids = torch.tensor([e.ids])
    with torch.inference_mode():
        hidden = net(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
    keep = [i for i, t in enumerate(e.tokens) if t in ("reverse", "linked", "list", "python")]
    reference = hidden.numpy()[keep]
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    states = TokenStates().content_states(text)
    assert states.shape == (4, reference.shape[1])  # stop words and [CLS]/[SEP]/"?" left out
    assert (states * reference).sum(axis=1).min() > 0.9999  # the embedder's own fp32 graph


async def test_a_lookup_takes_its_texts_states_from_the_embedders_pass(
    tmp_path: Path, embedder: Embedder
) -> None:
    settings = CacheSettings(
        enabled=True, path=str(tmp_path / "c.sqlite3"), verifier_model="aligned"
    )
    verifier = load_verifier("aligned")
    cache = await SemanticCache.open(settings, embedder, verifier)
    stored, asked = REWORDING[1], REWORDING[0]
    answer = CachedAnswer("the answer", "stop", 10, 5, "small", "m", None)

    async def embed(text: str) -> np.ndarray:
        return await embedder.embed(text)

    def query(text: str) -> CacheQuery:
        return CacheQuery("s", "t", "auto", text, None, 0.0)

    await cache.store(query(stored), lambda: embed(stored), answer, None)
    found = await cache.lookup(query(asked), lambda: embed(asked), settings.for_route(None))
    assert found.outcome == "semantic"
    assert verifier.states.passes == 0  # both texts' states came with their embeddings
    own = TokenStates().content_states(asked)  # a pass of its own: the same states
    assert np.allclose(verifier.states.content_states(asked), own, atol=1e-4)
    await cache.close()
    assert embedder.states_sink is None  # a closed cache takes no more


def test_the_shipped_artifact_matches_the_features(tmp_path: Path) -> None:
    assert AlignedVerifier.FEATURES == ALL_FEATURES
    check_shipped_artifact(AlignedVerifier, tmp_path)


def test_alignment_sees_a_piece_without_a_match() -> None:
    same = np.eye(3, dtype=np.float32)
    assert alignment(same, same) == [1.0] * len(TOKEN_FEATURES)
    extra = np.vstack([same, np.array([[0.0, 0.0, 0.0]], dtype=np.float32)])
    feats = dict(zip(TOKEN_FEATURES, alignment(same, extra), strict=True))
    assert feats["tok_min"] == 0.0 and feats["tok_min_high"] == 1.0
    assert feats["tok_mean_low"] == 0.75 and feats["tok_mean_high"] == 1.0
    assert alignment(extra, same) == alignment(same, extra)  # the same either way round


def test_vetoes_decide_before_any_forward_pass(verifier, embedder) -> None:
    a, b = "What is 2+2?", "What is 2+3?"
    before = verifier.states.passes
    verdict = verifier.verify(a, b, cosine(embedder, a, b), "lenient")
    assert (verdict.accept, verdict.probability, verdict.reason) == (False, 0.0, "numbers differ")
    assert verifier.states.passes == before


def test_a_rewording_scores_above_a_changed_piece(verifier, embedder) -> None:
    rewording = verifier.verify(*REWORDING, cosine(embedder, *REWORDING), "balanced")
    narrower = verifier.verify(*NARROWER, cosine(embedder, *NARROWER), "lenient")
    assert rewording.accept and rewording.reason == "ok"
    assert not narrower.accept and narrower.reason == "low probability"
    assert rewording.probability > narrower.probability + 0.3


def test_a_query_is_run_once_for_all_its_candidates(verifier: AlignedVerifier) -> None:
    query = "What is the quickest way to learn juggling?"
    candidates = ["How do I learn juggling fast?", "juggling tips", "How can I learn to juggle?"]
    assert all(verifier.decide(query, c) is None for c in candidates)  # the model decides
    before = verifier.states.passes
    for c in candidates:
        verifier.verify(query, c, 0.8, "strict")
    assert verifier.states.passes - before == 1 + len(candidates)
    verifier.verify(query, candidates[0], 0.8, "strict")
    assert verifier.states.passes - before == 1 + len(candidates)  # both texts remembered


async def test_through_a_real_cache(tmp_path: Path, embedder: Embedder) -> None:
    hit, miss = await cached_lookups(
        tmp_path,
        embedder,
        "aligned",
        REWORDING[1],
        [REWORDING[0], "What is the area of Tokyo?"],
        "balanced",
    )
    assert hit.outcome == "semantic" and hit.answer.text == f"the answer to {REWORDING[1]}"
    assert miss.outcome == "miss"


def test_unknown_verifier_models_are_refused() -> None:
    assert "aligned" in VERIFIER_MODELS
    with pytest.raises(ValueError, match="verifier_model"):
        load_verifier("cosine")


def test_thresholds_and_the_comparison_count_people_only() -> None:
    def row(i: int, hit: bool, source: str = "handwritten", cos: float = 0.9) -> dict:
        return {"id": str(i), "should_hit": hit, "source": source, "cos": cos}

    rows = [row(0, True), row(1, True), row(2, False), row(3, False), row(4, False, "rules")]
    scored = {"0": 0.9, "1": 0.5, "2": 0.7, "3": 0.0, "4": 0.99}
    assert served_at_wrong(rows, scored, 0.6) == {
        "0_wrong": 0.5,
        "1_wrong": 1.0,
        "2_wrong": 1.0,
        "3_wrong": 1.0,
    }
    probs = [scored[r["id"]] for r in rows]
    t = pick_thresholds(rows, probs, 0.6, negatives=2)
    assert t["strict"] == pytest.approx(0.7 + 1e-6)  # the rule-made 0.99 does not count
    low_cosine = [r | {"cos": 0.5} for r in rows]
    assert pick_thresholds(low_cosine, probs, 0.6, negatives=2)["strict"] == 0.5


def test_calibration_scores_with_the_policys_verifier_model(verifier, embedder) -> None:
    from training.cache.calibrate import score

    rows = [
        {"a": a, "b": b, "should_hit": hit, "category": "paraphrase" if hit else "scope"}
        for (a, b), hit in ((REWORDING, True), (NARROWER, False))
    ]
    scored = score(rows, embedder.embed_many, "aligned")
    expected = [
        verifier.probability(r["a"], r["b"], c)[0] for r, c in zip(rows, scored.cosine, strict=True)
    ]
    assert list(scored.probability) == pytest.approx(expected)
    logistic = score(rows, embedder.embed_many, "logistic")
    assert list(logistic.probability) != pytest.approx(expected)  # another model's scores
