"""Fit the default `logistic` verifier (gateway/cache/verifier.py) as `aligned` and `nli`
are fitted: on the people's train pairs, the rule-made ones and the judged crowded-scope
lookups, thresholds picked out of fold for the same wrong-hit targets.

    python -m training cache verifier [--l2 1]   # -> gateway/cache/verifier_model.json

Until 2026-12-07 it was fitted on the rule-made pair file (cache_pairs.jsonl, whose
hand-written paraphrase groups weighed 10x) with thresholds picked on that file's dev
slice: 96 of the pairs it was fitted on were the people's held-out pairs, and one pair
more or less on dev moved the strict threshold by 0.06 (docs/cache.md). ~1 min of
embedding on one core, then seconds of fitting (train_aligned.py says the rest).
"""

import json
from pathlib import Path

from training.artifacts import CACHE_PAIRS
from training.cache.train_aligned import main as fit

DEFAULT_PAIRS = CACHE_PAIRS  # the rule-made pairs: pairs.jsonl takes its `rules` rows


def load_pairs(path: Path = DEFAULT_PAIRS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    return fit(argv, kind="logistic")


if __name__ == "__main__":
    raise SystemExit(main())
