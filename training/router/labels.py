"""What "needs the large tier" means for a task, from both tiers' recorded outcomes.

- `greedy` (the first shipped labels): 1 when the small tier's one greedy answer is wrong
  and the large tier's is right. Noisy: near-identical templated tasks flip at random.
- `rate` (from several answers per tier, training/router/outcomes.py --samples N): 1 when the
  large tier's share of right answers beats the small tier's by at least RATE_GAP; i.e. the
  large tier answers it well where the small one does not.
- `gap` (a graded target for training): the large tier's right-answer share minus the small
  tier's, floored at 0: how much routing the task up buys.

Quality for cost and accuracy curves: a tier's right-answer share on the task (its one
greedy answer, right or wrong, when only that was recorded).
"""

from collections.abc import Callable

RATE_GAP = 0.5


def greedy_label(row: dict) -> float:
    return float(row["large"]["correct"] and not row["small"]["correct"])


def quality(row: dict, tier: str) -> float:
    outcome = row[tier]
    return float(outcome["rate"] if "rate" in outcome else outcome["correct"])


def gap(row: dict) -> float:
    return round(max(0.0, quality(row, "large") - quality(row, "small")), 4)


def rate_label(row: dict) -> float:
    return float(quality(row, "large") - quality(row, "small") >= RATE_GAP - 1e-9)


def answers_slice(row: dict, start: int, stop: int) -> dict:
    """The row as if only answers [start, stop) of each tier had been recorded: their rate
    (answer 0 is the greedy one, so `correct` is kept only when the slice starts there)."""
    out = dict(row)
    for tier in ("small", "large"):
        right = row[tier]["answers"][start:stop]
        if len(right) < stop - start:
            raise ValueError(f"{row['id']}: {len(row[tier]['answers'])} answers, not {stop}")
        outcome = dict(row[tier], answers=right, rate=round(sum(right) / len(right), 4))
        outcome["correct"] = right[0] if start == 0 else None
        out[tier] = outcome
    return out


TARGETS: dict[str, Callable[[dict], float]] = {
    "greedy": greedy_label,
    "rate": rate_label,
    "gap": gap,
}
# What the shipped examples are trained on, chosen by 5-fold CV on the train split
# (training/router/label_cv.py); bench/router_eval.py defaults to it.
SHIPPED_TARGET = "gap"
