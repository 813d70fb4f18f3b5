"""Judged lookups of a crowded train scope, as rows the `nli` and `aligned` models fit on.

A judged row (split `judged_train`, source `judged`) is a train question and another stored
train question that no pair file joins or sets apart, met by a lookup and judged blind:
would the stored answer answer the asked question (populated_judged_train.jsonl, the hits;
neighbours_judged_train.jsonl, the nearest neighbours; README beside them). They teach the
model what a crowded scope shows it and the pair files do not: another aspect, a reversed
direction, an added constraint. Thresholds stay picked on the people's pairs (a judged
row is one lookup's candidate, not a pair someone wrote), and the judged rows' own
out-of-fold figures are reported beside them.
"""

from training.cache.real_pairs import groups_of, key_hash
from training.cache.sharegpt_repeats import normal_key

# a judged row weighs as a people's pair: it is a person-style judgement of real wording
JUDGED_WEIGHT = 3.0


def is_people(row: dict) -> bool:
    """A pair written by people (not a rule edit, not a judged lookup)."""
    return row["source"] not in ("rules", "judged")


def with_folds(judged: list[dict], train: list[dict], folds: int, weight: float) -> list[dict]:
    """The judged rows, each in a fold of one of its questions, the same for a pair and its
    reverse (the model reads both directions, so a reversed pair in another fold would be
    scored by a model fitted on it): the train group's fold of the question whose key sorts
    first, or for a question the fitted pairs leave out (a follow-up, an exact repeat) a
    fold by its own hash."""
    group = groups_of(train)
    fold_of = {group[normal_key(r["a"])]: r["fold"] for r in train}
    out = []
    for r in judged:
        first = min(normal_key(r["a"]), normal_key(r["b"]))
        key = group.get(first, first)
        fold = fold_of.get(key, key_hash(key) % folds)
        out.append(r | {"fold": fold, "weight": weight})
    return out


def judged_report(rows: list[dict], scored: dict[str, float], thresholds: dict) -> dict:
    """Per strictness, the judged rows served out of fold: the same ask served (right) and
    a different one served (a crowded scope's wrong hit). Every judged row is at cosine 0.4
    or more, the floor of nli's recommended setting (balanced@0.4)."""
    judged = [r for r in rows if r["source"] == "judged"]
    same = [r for r in judged if r["should_hit"]]
    apart = [r for r in judged if not r["should_hit"]]
    report = {"judged": f"{len(same)} same, {len(apart)} not"}
    for name, t in thresholds.items():
        report[name] = {
            "same_served": f"{sum(scored[r['id']] >= t for r in same)}/{len(same)}",
            "not_same_served": f"{sum(scored[r['id']] >= t for r in apart)}/{len(apart)}",
        }
    return report
