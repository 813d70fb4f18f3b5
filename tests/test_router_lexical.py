"""The kernel's word similarity (gateway/routing/lexical.py): what it reads, and that it
tells apart prompts the embedding cannot."""

import numpy as np
import pytest

from gateway.policy import Blend
from gateway.routing.difficulty import DifficultyScorer
from gateway.routing.features import extract_features
from gateway.routing.lexical import MAX_CHARS, LexicalIndex, lexical_features, lexical_tokens
from gateway.routing.nearest import Kernel, example_similarities
from gateway.routing.router import RoutingInput
from gateway.routing.signals import compute_signals


def test_numbers_read_as_their_digit_count() -> None:
    assert lexical_tokens("What is 47 days after Monday, 2.5?") == [
        "what", "is", "#2", "days", "after", "monday", ",", "#1f", "?",
    ]  # fmt: skip
    assert lexical_tokens("123456789012") == ["#8"]
    assert lexical_tokens("Ünïcode wörds") == ["ünïcode", "wörds"]


def test_similarities_are_cosines_and_match_the_gram() -> None:
    texts = ["12 + 7 = ?", "12 + 7 = ?", "345 * 678 = ?", "Name the capital of France."]
    index = LexicalIndex.build(texts)
    gram = index.gram()
    assert np.allclose(np.diag(gram), 1.0)
    assert gram[0, 1] == pytest.approx(1.0) and gram[0, 3] == pytest.approx(0.0)
    assert 0.0 < gram[0, 2] < 1.0  # "+" differs from "*", and so do the sizes; "= ?" is shared
    for i, text in enumerate(texts):
        assert np.allclose(index.similarities(text), gram[i])
    # an empty prompt shares one feature, "no numbers", with the one example without any
    empty = index.similarities("")
    assert not empty[:3].any() and 0 < empty[3] < 0.5


def test_a_huge_prompt_is_read_up_to_the_cap() -> None:
    head = "add 3 and 4. " * (MAX_CHARS // 13 + 1)
    huge = head + "x" * 1_000_000
    assert np.array_equal(lexical_features(huge), lexical_features(head[:MAX_CHARS]))


def arithmetic_kernel(lexical_share: float) -> tuple[Kernel, np.ndarray]:
    """Examples that all embed alike: short numbers easy (0), long ones hard (1)."""
    easy = [f"What is {a} + {b}?" for a in range(2, 8) for b in range(2, 5)]
    hard = [f"What is {a} + {b}?" for a in range(2100, 2106) for b in range(37, 40)]
    texts, targets = easy + hard, np.array([0.0] * len(easy) + [1.0] * len(hard))
    vectors = np.tile(np.eye(4, dtype=np.float32)[0], (len(texts), 1))
    kernel = Kernel.fit(vectors, targets, 0.3, 0.3, LexicalIndex.build(texts), lexical_share)
    return kernel, vectors[0]


async def test_the_scorer_reads_the_last_user_message_for_the_words() -> None:
    kernel, same = arithmetic_kernel(0.5)
    scorer = DifficultyScorer(None, Blend(classifier=0.0, kernel=1.0), 4, {"kernel": kernel})

    async def embed() -> np.ndarray:
        return same

    async def score(last_user: str) -> float:
        messages = [
            {"role": "user", "content": "What is 4817 + 55?"},
            {"role": "assistant", "content": "4872"},
            {"role": "user", "content": last_user},
        ]
        features = extract_features(messages, None)
        scored = await scorer.score(
            RoutingInput("auto", features, embed), compute_signals(features)
        )
        assert scored is not None
        return scored.score

    # the hard first message plays no part
    assert await score("What is 9 + 8?") < 0.2 < 0.8 < await score("What is 3106 + 77?")


def test_the_word_share_separates_prompts_that_embed_alike() -> None:
    """Every example has the same embedding, so the embedding cosine cannot tell them
    apart; short numbers are easy (0) and long ones hard (1). With a lexical share the
    kernel scores a new prompt by the size of its numbers; without, all alike."""
    words, same = arithmetic_kernel(0.5)
    assert words.predict(same, "What is 9 + 8?") < 0.2
    assert words.predict(same, "What is 4817 + 55?") > 0.8
    blind, _ = arithmetic_kernel(0.0)
    assert blind.lexical is None
    assert blind.predict(same, "What is 9 + 8?") == pytest.approx(
        blind.predict(same, "What is 4817 + 55?")
    )
    many = words.predict_many(np.tile(same, (2, 1)), ["What is 9 + 8?", "What is 4817 + 55?"])
    assert many[0] < 0.2 < 0.8 < many[1]


def test_the_kernel_solve_in_place_matches_the_textbook_one() -> None:
    """Training solves by Cholesky in the similarities' own memory; the result equals the
    textbook solve, and `solve` says it overwrote its input."""
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((40, 6)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [f"What is {i} + {i * 37}?" for i in range(40)]
    targets = rng.random(40)
    index = LexicalIndex.build(texts)
    similarity = example_similarities(vectors, index, 0.5)
    kept = similarity.copy()
    kernel = Kernel.solve(vectors, similarity, targets, 0.4, 0.3, index, 0.5)
    assert not np.array_equal(similarity, kept)  # overwritten: callers pass a copy to reuse it
    v = vectors.astype(np.float64)
    direct = 0.5 * (v @ v.T) + 0.5 * index.gram()
    gram = np.exp((direct - 1) / 0.4) + 0.3 * np.eye(40)
    expected = np.linalg.solve(gram, targets - targets.mean())
    assert np.allclose(kernel.alpha, expected, atol=1e-10)
    assert np.allclose(Kernel.fit(vectors, targets, 0.4, 0.3, index, 0.5).alpha, expected)


def test_a_ridge_too_small_for_the_examples_is_a_clear_error() -> None:
    """Identical examples make the kernel matrix singular; a vanishing ridge cannot fix it."""
    vectors = np.tile(np.eye(3, dtype=np.float32)[0], (30, 1))
    with pytest.raises(ValueError, match=r"difficulty\.kernel_ridge: 1e-300 is too small"):
        Kernel.fit(vectors, np.linspace(0, 1, 30), 0.3, 1e-300)


def test_kernel_centres_fit_every_example_and_score_against_the_centres() -> None:
    """Subset of regressors: with every example a centre it is the kernel ridge solve above;
    with fewer it keeps only the centres' vectors and still predicts the examples' targets
    (words included)."""
    from gateway.routing.difficulty import fit_kernel

    rng = np.random.default_rng(5)
    hard, easy = np.eye(6)[0], np.eye(6)[1]
    vectors = np.vstack(
        [hard + 0.1 * rng.standard_normal((30, 6)), easy + 0.1 * rng.standard_normal((30, 6))]
    )
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    targets = np.array([1.0] * 30 + [0.0] * 30)
    texts = [f"prove lemma {i}" for i in range(30)] + [f"say hi {i}" for i in range(30)]
    full = fit_kernel(texts, vectors, targets, 0.3, 0.3, 0.5)
    assert np.allclose(fit_kernel(texts, vectors, targets, 0.3, 0.3, 0.5, 60).alpha, full.alpha)
    few = fit_kernel(texts, vectors, targets, 0.3, 0.3, 0.5, 12)
    assert few.vectors.shape == (12, 6) and len(few.alpha) == 12 and len(few.lexical) == 12
    predicted = np.array([few.predict(v, t) for v, t in zip(vectors, texts, strict=True)])
    assert (predicted[:30] > 0.7).all() and (predicted[30:] < 0.3).all()
    exact = np.array([full.predict(v, t) for v, t in zip(vectors, texts, strict=True)])
    assert np.abs(predicted - exact).max() < 0.2


def test_kernel_centres_beyond_the_limit_are_a_clear_error() -> None:
    from gateway.routing.nearest import KERNEL_MAX_EXAMPLES, centre_indices

    many = KERNEL_MAX_EXAMPLES + 1
    prompts = [f"p{i}" for i in range(many + 10)]
    chosen = centre_indices(prompts, many)
    assert len(chosen) == many and (np.diff(chosen) > 0).all()
    cross = np.ones((many + 10, many))
    with pytest.raises(ValueError, match=r"difficulty\.kernel_centres"):
        Kernel.solve_centres(
            np.zeros((many + 10, 2), np.float32),
            cross,
            chosen,
            np.zeros(many + 10),
            0.3,
            0.3,
            None,
            0.0,
        )
