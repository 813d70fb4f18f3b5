"""Which of two questions is stored first is chance: the `logistic`, `aligned` and `nli`
verifiers score a pair the same either way round (the pair files always put the question
first and its rewording or edit second; a model that read the sides apart learned that
order: docs/cache-runs.md). Pairs from the train split that no rule decides."""

import pytest

from gateway.cache.verifier import PairVerifier
from gateway.cache.verifiers import load_verifier
from training.artifacts import REAL_PAIRS
from training.cache.train_pair_model import load_rows


def open_pairs(verifier: PairVerifier, n: int) -> list[dict]:
    rows = [r for r in load_rows(REAL_PAIRS) if r["split"] == "train" and r["a"] != r["b"]]
    return [r for r in rows if verifier.decide(r["a"], r["b"]) is None][:n]


@pytest.mark.parametrize("model", ["logistic", "aligned", "nli"])
def test_a_pair_scores_the_same_either_way_round(model: str) -> None:
    verifier = load_verifier(model)
    pairs = open_pairs(verifier, 30)
    assert len(pairs) == 30
    forward = [verifier.probability(r["a"], r["b"], 0.8)[0] for r in pairs]
    backward = [verifier.probability(r["b"], r["a"], 0.8)[0] for r in pairs]
    assert forward == pytest.approx(backward, abs=1e-6)
    assert max(forward) - min(forward) > 0.3  # pairs the model tells apart, not a constant
