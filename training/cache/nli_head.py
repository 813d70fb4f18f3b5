"""The `nli` verifier's head: a logistic model of ours over the NLI model's states (the
pooled pair its classifier reads, and the last layer's states averaged over word pieces:
768 numbers per direction), and its stacking.

The package's own two logits answer "does the second statement follow from the first";
the head answers "does one answer do for both questions", fitted on both directions of
each train pair as samples. Stacked: the verifier's model reads head logits the head gave
out of fold (`with_oof_columns`), so it weighs them as they come on pairs the head never
saw, and the thresholds come from probabilities out of fold twice over (train_aligned.py).
Chosen out of fold on the train pairs with train2 (479 people's must-not): the people's
should-hit pairs served at 0 / 1 / 2 / 4 / 8 / 14 wrong went from 48.0 / 61.6 / 65.2 /
67.7 / 71.5 / 76.7% (the margins alone) to 61.2 / 63.0 / 66.1 / 72.7 / 79.1 / 81.4% with a
head over the pooled state alone, and to 67.0 / 67.5 / 68.1 / 74.5 / 80.3 / 83.4% over it
and the mean of the last states (the word-piece mean alone: 65.0 / 68.6 / 68.6 / 70.4 /
81.6 / 83.0%; the [CLS] piece's last state alone: 57.9 / 65.9 / 67.7 / 72.2 / 79.1 / 82.3%).
HEAD_L2 100; 300 was within a point or two.
"""

import math

import numpy as np

from gateway.cache.nli_verifier import HEAD_FEATURES, NliVerifier
from gateway.cache.verifier import LogisticModel
from training.cache.logistic_fit import fit_logistic

HEAD_L2 = 100.0
_COLUMNS = [NliVerifier.FEATURES.index(name) for name in HEAD_FEATURES]


def read_states(verifier: NliVerifier, rows: list[dict]) -> None:
    """Each row's two directions' states, as row["states"] (the NLI LRU answers for rows
    the verifier has just read)."""
    for r in rows:
        ab, ba = verifier.nli.read(r["a"], r["b"]), verifier.nli.read(r["b"], r["a"])
        r["states"] = (ab.states, ba.states)


def fit_head(rows: list[dict], l2: float = HEAD_L2) -> LogisticModel:
    """The head fitted on both directions of `rows`, each weighing its row's "weight"."""
    states = np.array([s for r in rows for s in r["states"]])
    y = np.array([float(r["should_hit"]) for r in rows for _ in (0, 1)])
    weight = np.array([r["weight"] for r in rows for _ in (0, 1)])
    return fit_logistic(states, y, weight, l2=l2)


def head_logits(head: LogisticModel, row: dict) -> tuple[float, float]:
    ab, ba = row["states"]
    return head.logit(ab.tolist()), head.logit(ba.tolist())


def with_columns(rows: list[dict], head: LogisticModel) -> list[dict]:
    """Copies of `rows` whose features hold `head`'s logits (HEAD_FEATURES)."""
    out = []
    for r in rows:
        ab, ba = head_logits(head, r)
        x = list(r["x"])
        x[_COLUMNS[0]], x[_COLUMNS[1]] = min(ab, ba), (ab + ba) / 2
        out.append(r | {"x": x})
    return out


def with_oof_columns(rows: list[dict]) -> list[dict]:
    """Copies of `rows`, each row's head columns from a head fitted on the other folds."""
    out: dict[int, dict] = {}
    for k in sorted({r["fold"] for r in rows}):
        inside = [i for i, r in enumerate(rows) if r["fold"] == k]
        head = fit_head([r for r in rows if r["fold"] != k])
        for i, row in zip(inside, with_columns([rows[i] for i in inside], head), strict=True):
            out[i] = row
    return [out[i] for i in range(len(rows))]


def ranges_seen(rows: list[dict], head: LogisticModel) -> dict[str, list[float]]:
    """The lowest and highest margin and `head` logit of any direction of `rows`, widened
    to 4 decimals outwards: what the verifier takes a direction not read yet to reach."""
    low, mean = (NliVerifier.FEATURES.index(n) for n in ("nli_min", "nli_mean"))
    margins = [m for r in rows for m in (r["x"][low], 2 * r["x"][mean] - r["x"][low])]
    heads = [h for r in rows for h in head_logits(head, r)]
    return {"margin": _outwards(margins), "head": _outwards(heads)}


def _outwards(values: list[float]) -> list[float]:
    return [math.floor(min(values) * 1e4) / 1e4, math.ceil(max(values) * 1e4) / 1e4]
