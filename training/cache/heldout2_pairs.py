"""Build the second held-out set: hand-written pairs that no model or threshold has seen.

    python -m training cache heldout2-pairs   # writes cache_pairs_real/pairs_heldout2.jsonl
                                              #    and pairs_heldout2.provenance.json beside it

The first held-out split (real_pairs.py) has too few must-not pairs to show a 1% wrong-hit
bound, and it has been looked at while choosing verifiers. These pairs were written after
every shipped model and threshold was fixed (handwritten_heldout2.txt), so all of them are
split `heldout2`, source `handwritten2`, in pairs.jsonl's row schema. The build refuses a
question (after case and punctuation) that any model could have seen: one in pairs.jsonl,
either split, or in the rule-made cache_pairs.jsonl the first verifier was trained on.
"""

import argparse
import json
from collections import Counter

from training.artifacts import CACHE_PAIRS, REAL_PAIRS, REAL_PAIRS_HELDOUT2, write_artifact
from training.cache import real_sources
from training.cache.real_pairs import pair_id
from training.cache.sharegpt_repeats import normal_key

SPLIT = "heldout2"


def seen_questions() -> set[str]:
    """Every question a shipped model was trained, tuned or measured on, as a key."""
    keys: set[str] = set()
    for path in (REAL_PAIRS, CACHE_PAIRS):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            keys |= {normal_key(row["a"]), normal_key(row["b"])}
    return keys


def stale(rows: list[dict], seen: set[str]) -> list[str]:
    return sorted({q for r in rows for q in (r["a"], r["b"]) if normal_key(q) in seen})


def build() -> list[dict]:
    rows = real_sources.handwritten2()
    if reused := stale(rows, seen_questions()):
        raise ValueError(f"{len(reused)} questions were seen before, e.g. {reused[:3]}")
    ids = Counter((r["a"], r["b"]) for r in rows)
    if twice := [k for k, n in ids.items() if n > 1]:
        raise ValueError(f"pairs written twice: {twice[:3]}")
    pairs = [{"id": pair_id(r["a"], r["b"]), "split": SPLIT} | r for r in rows]
    return sorted(pairs, key=lambda p: (p["category"], p["id"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    pairs = build()
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    tally = Counter(f"{p['domain']}/{p['category']}" for p in pairs)
    figures = {
        "pairs": len(pairs),
        "should_hit": sum(p["should_hit"] for p in pairs),
        "must_not": sum(not p["should_hit"] for p in pairs),
        "seen_questions_checked": "pairs.jsonl (both splits), cache_pairs.jsonl",
        "counts": dict(sorted(Counter(p["category"] for p in pairs).items())),
        "by_domain": dict(sorted(tally.items())),
    }
    inputs = [real_sources.HANDWRITTEN2, REAL_PAIRS, CACHE_PAIRS]
    sidecar = write_artifact(REAL_PAIRS_HELDOUT2, text, inputs, figures)
    print(json.dumps({k: figures[k] for k in ("pairs", "should_hit", "must_not", "counts")}))
    print(f"wrote {REAL_PAIRS_HELDOUT2} and {sidecar}")
