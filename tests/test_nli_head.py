"""The nli verifier's head and its stacking (training/cache/nli_head.py), on generated
states (unit tests of the mechanics, not figures): a row's head columns never come
from a head that saw its fold, so the stacked out-of-fold probabilities stay at chance on
labels the states do not predict; the ranges cover every direction; a feature with almost
no spread cannot make a logit infinite."""

import math

import numpy as np

from gateway.cache.nli_verifier import ALL_FEATURES, HEAD_FEATURES
from training.cache.logistic_fit import fit_logistic
from training.cache.nli_head import fit_head, ranges_seen, with_columns, with_oof_columns
from training.cache.train_aligned import FOLDS, out_of_fold

HEAD_AT = [ALL_FEATURES.index(name) for name in HEAD_FEATURES]


def rows(n: int, seed: int, informative: bool) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        should_hit = bool(i % 2)
        shift = (1.0 if should_hit else -1.0) if informative else 0.0
        states = tuple(rng.normal(size=768) + shift * (np.arange(768) < 8) for _ in (0, 1))
        x = list(rng.normal(size=len(ALL_FEATURES)))
        out.append(
            {
                "id": f"p{i}",
                "fold": i % FOLDS,
                "weight": 1.0,
                "should_hit": should_hit,
                "source": "handwritten",
                "states": states,
                "x": x,
            }
        )
    return out


def auc(probs: list[float], labels: list[bool]) -> float:
    pos = [p for p, y in zip(probs, labels, strict=True) if y]
    neg = [p for p, y in zip(probs, labels, strict=True) if not y]
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def test_a_rows_head_columns_come_from_the_other_folds() -> None:
    data = rows(100, seed=1, informative=True)
    stacked = with_oof_columns(data)
    fold0 = [r for r in data if r["fold"] == 0]
    expected = with_columns(fold0, fit_head([r for r in data if r["fold"] != 0]))
    got = [r for r in stacked if r["fold"] == 0]
    assert [r["x"] for r in got] == [r["x"] for r in expected]
    assert [r["x"] for r in stacked] != [r["x"] for r in with_columns(data, fit_head(data))]


def test_stacked_probabilities_stay_at_chance_on_noise() -> None:
    """768 noisy numbers per direction for 200 pairs: a head fitted on them all separates
    its own rows; out of fold, the stacked model must not."""
    data = rows(200, seed=2, informative=False)
    labels = [r["should_hit"] for r in data]
    in_sample = with_columns(data, fit_head(data))
    assert auc([r["x"][HEAD_AT[1]] for r in in_sample], labels) > 0.8
    assert 0.25 < auc(out_of_fold(data, l2=10.0, stacked=True), labels) < 0.75  # leaky: 0.997


def test_stacked_probabilities_find_a_real_signal() -> None:
    data = rows(200, seed=3, informative=True)
    labels = [r["should_hit"] for r in data]
    assert auc(out_of_fold(data, l2=10.0, stacked=True), labels) > 0.9


def test_the_ranges_cover_every_direction() -> None:
    data = rows(60, seed=4, informative=True)
    head = fit_head(data)
    seen = ranges_seen(data, head)
    logits = [head.logit(p.tolist()) for r in data for p in r["states"]]
    low, high = seen["head"]
    assert low <= min(logits) and max(logits) <= high and high - max(logits) < 1e-4
    nli_min, nli_mean = ALL_FEATURES.index("nli_min"), ALL_FEATURES.index("nli_mean")
    margins = [m for r in data for m in (r["x"][nli_min], 2 * r["x"][nli_mean] - r["x"][nli_min])]
    assert seen["margin"][0] <= min(margins) and max(margins) <= seen["margin"][1]


def test_a_feature_with_almost_no_spread_stays_finite() -> None:
    """The artifact keeps 6 decimals: a spread rounded to 0 must not become a divisor."""
    rng = np.random.default_rng(5)
    x = np.column_stack([rng.normal(size=80), 0.5 + 1e-8 * rng.normal(size=80)])
    y = (x[:, 0] > 0).astype(float)
    model = fit_logistic(x, y, np.ones(80), l2=1.0)
    assert min(model.scale) > 0 and math.isfinite(model.logit([0.3, 0.7]))
