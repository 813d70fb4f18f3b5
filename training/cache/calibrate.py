"""The cache's similarity floor and verifier threshold for a wrong-hit bound, from labelled pairs.

    python -m training cache calibrate [--pairs FILE] [--target-wrong 0.01]
        [--confidence 0.95] [--split train] [--policy P] [--write]
    (also `tiergate calibrate-cache ...`)

Each pair is looked up as the issue measured it, in a scope of its own: `b` is stored, `a`
asked. It is served when the texts are the same up to spacing (the exact table: no floor, no
verifier) or when its cosine (the policy's embedder, as the gateway computes it) reaches the
floor and the verifier's probability (pair_scores.py) reaches the threshold. Over a grid of
(floor, threshold) the chosen point serves the most should-hit pairs whose one-sided upper
Clopper-Pearson bound on the wrong-hit rate (must-not pairs served / must-not pairs) is at or
below the target. Grid search picks among many points on the same pairs, so the bound is
checked again on the held-out split, never tuned on, when the file has one.

Not scored: `followup` pairs (the same words in two conversations; the scope, which holds the
earlier turns, keeps them apart, not the verifier: bench/cache_followups.py measures that)
and, unless --with-rule-edits, source `rules` (rule-made edits the shipped verifier was
trained on). The file: one JSON object a line with `a`, `b`, `should_hit` and optionally
`category`, `split`, `source` (training/data/cache_pairs_real/README.md; also what
GET /admin/cache/reports/export writes). A row without `split` is in every split.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache.entry import normalise
from training.bounds import pairs_needed, upper_bound
from training.cache.pair_scores import score_pairs

Embed = Callable[[list[str]], np.ndarray]
FLOORS = tuple(round(0.3 + 0.05 * i, 2) for i in range(14))  # 0.30 .. 0.95
THRESHOLDS = tuple(round(0.01 * i, 2) for i in range(1, 101))  # 0 would pass vetoed pairs
UNSCORED_CATEGORIES = ("followup",)  # kept apart by the conversation's scope


@dataclass
class Scored:
    """The pairs as the grid reads them, one array entry a pair."""

    rows: list[dict]
    cosine: np.ndarray
    probability: np.ndarray
    exact: np.ndarray  # served by the exact table whatever the floor and threshold

    def served(self, floor: float, threshold: float) -> np.ndarray:
        return self.exact | ((self.cosine >= floor) & (self.probability >= threshold))


def read_pairs(path: Path) -> list[dict]:
    """The labelled pairs of a file; a malformed line is a ValueError naming it."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        ok = isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("a", "b"))
        if not ok or not isinstance(row.get("should_hit"), bool):
            raise ValueError(f"{path}:{n}: needs string `a`, `b` and a boolean `should_hit`")
        rows.append(with_category(row))
    return rows


def with_category(row: dict) -> dict:
    """A row without a category (a deployer's own file) counts under its label's name."""
    return {"category": "should_hit" if row["should_hit"] else "must_not"} | row


def scored_rows(rows: list[dict], split: str, with_rule_edits: bool) -> list[dict]:
    return [
        r
        for r in rows
        if split in ("all", r.get("split", split))
        and r["category"] not in UNSCORED_CATEGORIES
        and (with_rule_edits or r.get("source") != "rules")
    ]


def score(rows: list[dict], embed: Embed, model: str = "logistic") -> Scored:
    """`model`: the policy's `cache.verifier_model`, the verifier that scores the pairs."""
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vectors = embed(texts) if texts else np.zeros((0, 1), dtype=np.float32)
    at = {t: i for i, t in enumerate(texts)}
    cosine = [float(vectors[at[r["a"]]] @ vectors[at[r["b"]]]) for r in rows]
    probability = score_pairs([r["a"] for r in rows], [r["b"] for r in rows], cosine, model)
    return scored_of(rows, cosine, probability)


def scored_of(rows: list[dict], cosine: list[float], probability: list[float]) -> Scored:
    exact = [normalise(r["a"]) == normalise(r["b"]) for r in rows]  # the exact table's form
    return Scored(rows, np.array(cosine), np.array(probability, dtype=float), np.array(exact))


def figures(scored: Scored, served: np.ndarray, confidence: float) -> dict[str, Any]:
    """Served and wrong shares overall and per category, with the wrong rate's upper bound."""
    label = np.array([r["should_hit"] for r in scored.rows], dtype=bool)
    wrong, must_not = int((served & ~label).sum()), int((~label).sum())
    out: dict[str, Any] = {
        "should_hit": int(label.sum()),
        "should_hit_served": int((served & label).sum()),
        "served_rate": _share(int((served & label).sum()), int(label.sum())),
        "must_not": must_not,
        "wrong_hits": wrong,
        "wrong_rate": _share(wrong, must_not),
        "wrong_rate_upper": round(upper_bound(wrong, must_not, confidence), 4),
        "by_category": {},
    }
    categories = np.array([r["category"] for r in scored.rows])
    for category in sorted(set(categories.tolist())):
        mask = categories == category
        n, k = int(mask.sum()), int((served & mask).sum())
        row: dict[str, Any] = {"pairs": n, "served": k, "rate": _share(k, n)}
        if not label[mask].any():  # a must-not category: its own bound too
            row["upper"] = round(upper_bound(k, n, confidence), 4)
        out["by_category"][category] = row
    return out


def choose(scored: Scored, target: float, confidence: float) -> dict[str, Any] | None:
    """The grid point serving the most should-hit pairs within the bound; None when none is."""
    label = np.array([r["should_hit"] for r in scored.rows], dtype=bool)
    must_not = int((~label).sum())

    def measure(floor: float, threshold: float) -> tuple[int, int, int]:
        served = scored.served(floor, threshold)
        return int((served & label).sum()), int((served & ~label).sum()), must_not

    return best_point(measure, target, confidence)


def best_point(
    measure: Callable[[float, float], tuple[int, int, int]], target: float, confidence: float
) -> dict[str, Any] | None:
    """The (floor, threshold) of the grid serving the most right where the upper bound of
    the wrong rate is within `target`; `measure` gives (right, wrong, the rate's base) of a
    point. Ties: fewer wrong, then the stricter point. None when no point is within."""
    best: tuple | None = None
    for floor in FLOORS:
        for threshold in THRESHOLDS:
            right, wrong, base = measure(floor, threshold)
            if upper_bound(wrong, base, confidence) > target:
                continue
            key = (right, -wrong, threshold, floor)
            best = max(best, key) if best else key
    if best is None:
        return None
    return {"min_similarity": best[3], "verifier_threshold": best[2]}


def calibrate(
    rows: list[dict],
    embed: Embed,
    target: float = 0.01,
    confidence: float = 0.95,
    split: str = "train",
    current: tuple[float, float] | None = None,
    with_rule_edits: bool = False,
    model: str = "logistic",
) -> dict[str, Any]:
    """The report: the chosen point and its figures, the current point's in the same run
    (`current`: the policy's floor and threshold), and the held-out check."""
    rows = [with_category(r) for r in rows]
    tuned = scored_rows(rows, split, with_rule_edits)
    if not any(r["should_hit"] for r in tuned) or all(r["should_hit"] for r in tuned):
        raise ValueError(f"split {split!r} needs both should-hit and must-not pairs")
    scored = score(tuned, embed, model)
    chosen = choose(scored, target, confidence)
    report: dict[str, Any] = {
        "split": split,
        "verifier_model": model,
        "target_wrong": target,
        "confidence": confidence,
        "must_not_needed": pairs_needed(target, confidence),
        "not_scored": _not_scored(rows, split, with_rule_edits),
        "chosen": chosen,
    }
    if chosen is not None:
        point = (chosen["min_similarity"], chosen["verifier_threshold"])
        report["chosen"] |= figures(scored, scored.served(*point), confidence)
    if current is not None:
        report["current"] = {"min_similarity": current[0], "verifier_threshold": current[1]}
        report["current"] |= figures(scored, scored.served(*current), confidence)
    check = [r for r in scored_rows(rows, "all", with_rule_edits) if r.get("split") == "heldout"]
    if chosen is not None and split != "heldout" and check and split != "all":
        held = score(check, embed, model)
        report["heldout_check"] = figures(held, held.served(*point), confidence)
    return report


def _not_scored(rows: list[dict], split: str, with_rule_edits: bool) -> dict[str, int]:
    kept = {id(r) for r in scored_rows(rows, split, with_rule_edits)}
    out: dict[str, int] = {}
    for r in rows:
        if id(r) not in kept and split in ("all", r.get("split", split)):
            why = r["category"] if r["category"] in UNSCORED_CATEGORIES else "rule_edit"
            out[why] = out.get(why, 0) + 1
    return out


def _share(k: int, n: int) -> float:
    return round(k / n, 4) if n else 0.0
