"""Build a pair set written after the first models: more train pairs, or a held-out set
of hand-written pairs no model has seen.

    python -m training cache later-set --set train2     # -> pairs_train2.jsonl
    python -m training cache later-set --set heldout2   # -> pairs_heldout2.jsonl
    python -m training cache later-set --set heldout3   # -> pairs_heldout3.jsonl
    python -m training cache later-set --set heldout4   # -> pairs_heldout4.jsonl
    python -m training cache later-set --set train3     # -> pairs_train3.jsonl
    python -m training cache later-set --set heldout5   # -> pairs_heldout5.jsonl
    python -m training cache later-set --set train4     # -> pairs_train4.jsonl
    python -m training cache later-set --set heldout6   # -> pairs_heldout6.jsonl
                                                        #    (and .provenance.json beside)

The first held-out split (real_pairs.py) has too few must-not pairs to show a 1% wrong-hit
bound, and it has been looked at while choosing verifiers. heldout2 was written after the
models and thresholds of 2026-12-02 were fixed; it too was looked at while the verifiers of
2026-12-03 were chosen, so heldout3 was written on 2026-12-03 by someone who had not read
the vetoes or word lists, after the models of that day were fixed. train2 holds more train
pairs in free rewordings (split `train`: aligned and nli fit on it with pairs.jsonl's train
split); heldout4 was written beside it, by another writer, as the set that judges the models
fitted on it. train3 and heldout5 (2026-12-04) were written the same way, side by side, by
two more writers, after heldout4 had been scored twice; train4 and heldout6 likewise, by
two more, after heldout5 had been scored once. Each set's rows are in
pairs.jsonl's row schema, all in one split. The build
refuses a question (after case and punctuation) that a model or an earlier set could have
seen: one in pairs.jsonl (either split), in the rule-made cache_pairs.jsonl the first
verifier was trained on, or in an earlier later set.
"""

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from training.artifacts import (
    CACHE_PAIRS,
    REAL_PAIRS,
    REAL_PAIRS_HELDOUT2,
    REAL_PAIRS_HELDOUT3,
    REAL_PAIRS_HELDOUT4,
    REAL_PAIRS_HELDOUT5,
    REAL_PAIRS_HELDOUT6,
    REAL_PAIRS_TRAIN2,
    REAL_PAIRS_TRAIN3,
    REAL_PAIRS_TRAIN4,
    write_artifact,
)
from training.cache import real_sources
from training.cache.real_pairs import pair_id
from training.cache.sharegpt_repeats import normal_key


@dataclass(frozen=True)
class LaterSet:
    split: str  # the rows' split, as bench/cache_eval.py reads it
    source: str  # the rows' source
    written: Path  # the hand-written text file
    pairs: Path  # the built JSONL
    seen: tuple[Path, ...]  # pair files whose questions it must not share


_BEFORE_TRAIN3 = (
    REAL_PAIRS,
    CACHE_PAIRS,
    REAL_PAIRS_HELDOUT2,
    REAL_PAIRS_HELDOUT3,
    REAL_PAIRS_TRAIN2,
    REAL_PAIRS_HELDOUT4,
)
SETS = {
    "heldout2": LaterSet(
        "heldout2",
        "handwritten2",
        real_sources.HANDWRITTEN2,
        REAL_PAIRS_HELDOUT2,
        (REAL_PAIRS, CACHE_PAIRS),
    ),
    "heldout3": LaterSet(
        "heldout3",
        "handwritten3",
        real_sources.HANDWRITTEN3,
        REAL_PAIRS_HELDOUT3,
        (REAL_PAIRS, CACHE_PAIRS, REAL_PAIRS_HELDOUT2),
    ),
    "train2": LaterSet(
        "train",
        "handwritten_train2",
        real_sources.HANDWRITTEN_TRAIN2,
        REAL_PAIRS_TRAIN2,
        (REAL_PAIRS, CACHE_PAIRS, REAL_PAIRS_HELDOUT2, REAL_PAIRS_HELDOUT3),
    ),
    "heldout4": LaterSet(
        "heldout4",
        "handwritten4",
        real_sources.HANDWRITTEN4,
        REAL_PAIRS_HELDOUT4,
        (REAL_PAIRS, CACHE_PAIRS, REAL_PAIRS_HELDOUT2, REAL_PAIRS_HELDOUT3, REAL_PAIRS_TRAIN2),
    ),
    "train3": LaterSet(
        "train",
        "handwritten_train3",
        real_sources.HANDWRITTEN_TRAIN3,
        REAL_PAIRS_TRAIN3,
        _BEFORE_TRAIN3,
    ),
    "heldout5": LaterSet(
        "heldout5",
        "handwritten5",
        real_sources.HANDWRITTEN5,
        REAL_PAIRS_HELDOUT5,
        (*_BEFORE_TRAIN3, REAL_PAIRS_TRAIN3),
    ),
    "train4": LaterSet(
        "train",
        "handwritten_train4",
        real_sources.HANDWRITTEN_TRAIN4,
        REAL_PAIRS_TRAIN4,
        (*_BEFORE_TRAIN3, REAL_PAIRS_TRAIN3, REAL_PAIRS_HELDOUT5),
    ),
    "heldout6": LaterSet(
        "heldout6",
        "handwritten6",
        real_sources.HANDWRITTEN6,
        REAL_PAIRS_HELDOUT6,
        (*_BEFORE_TRAIN3, REAL_PAIRS_TRAIN3, REAL_PAIRS_HELDOUT5, REAL_PAIRS_TRAIN4),
    ),
}


def seen_questions(later: LaterSet) -> set[str]:
    """Every question a shipped model or an earlier set holds, as a key."""
    keys: set[str] = set()
    for path in later.seen:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            keys |= {normal_key(row["a"]), normal_key(row["b"])}
    return keys


def stale(rows: list[dict], seen: set[str]) -> list[str]:
    return sorted({q for r in rows for q in (r["a"], r["b"]) if normal_key(q) in seen})


def build(later: LaterSet) -> list[dict]:
    rows = real_sources.read_labelled(later.written, later.source)
    if reused := stale(rows, seen_questions(later)):
        raise ValueError(f"{len(reused)} questions were seen before, e.g. {reused[:3]}")
    ids = Counter((r["a"], r["b"]) for r in rows)
    if twice := [k for k, n in ids.items() if n > 1]:
        raise ValueError(f"pairs written twice: {twice[:3]}")
    pairs = [{"id": pair_id(r["a"], r["b"]), "split": later.split} | r for r in rows]
    return sorted(pairs, key=lambda p: (p["category"], p["id"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    later = SETS[parser.parse_args(argv).set]
    pairs = build(later)
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    tally = Counter(f"{p['domain']}/{p['category']}" for p in pairs)
    figures = {
        "pairs": len(pairs),
        "should_hit": sum(p["should_hit"] for p in pairs),
        "must_not": sum(not p["should_hit"] for p in pairs),
        "seen_questions_checked": [path.name for path in later.seen],
        "counts": dict(sorted(Counter(p["category"] for p in pairs).items())),
        "by_domain": dict(sorted(tally.items())),
    }
    sidecar = write_artifact(later.pairs, text, [later.written, *later.seen], figures)
    print(json.dumps({k: figures[k] for k in ("pairs", "should_hit", "must_not", "counts")}))
    print(f"wrote {later.pairs} and {sidecar}")
