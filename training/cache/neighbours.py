"""The train questions' crowded-scope neighbours, for judging: labelled data on lookups.

    python -m training cache neighbours --out FILE [--candidates 3 --floor 0.4 --above 0.02]
                                        [--ask a|b] [--scope-questions FILE]

A deployment's scope holds many questions, and a lookup's verifier meets the new question's
nearest stored ones, most of them joined to it by no pair (bench/cache_populated.py). Here
one scope holds both questions of every train pair (train files only); each train pair's
new question is looked up in it, its own text left out, and its `--candidates` nearest
stored questions at cosine `--floor` or more are kept when no pair file says anything of
the two (the same group, or a must-not pair) and the shipped nli verifier gives them at
least `--above`: the pairs it may serve or nearly serve. `--scope-questions` adds stored
questions that no pair joins (scope_questions_train.txt: the held-out benchmark's scope
holds ~1.4x the train questions, and a lookup's wrong hits grow with its neighbours).
Written one row a pair in pairs.jsonl's schema with `should_hit` null, for a judge to fill
in; judged, they go to neighbours_judged_train.jsonl, or with `--scope-questions`
neighbours_judged_scope.jsonl (training/data/cache_pairs_real/, split `judged_train`), which
train_aligned.py fits on. No held-out file is read.
"""

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gateway.cache.nli_verifier import NliVerifier
from gateway.embedding.embedder import Embedder
from training.artifacts import REAL_PAIRS_DIR, SCOPE_QUESTIONS_TRAIN
from training.cache.real_pairs import groups_of, pair_id
from training.cache.sharegpt_repeats import normal_key


def train_files() -> list[Path]:
    """Every pair file a trainer may read: the train sets and the judged train hits."""
    held_out = ("heldout", "populated_judged.jsonl")
    return sorted(
        p for p in REAL_PAIRS_DIR.glob("*.jsonl") if not any(h in p.name for h in held_out)
    )


def read_rows(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def scope_questions(path: Path) -> list[str]:
    """The questions of a `domain | question` file (lines starting with # are comments)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line.split("|", 1)[1].strip() for line in lines if line and not line.startswith("#")]


def unlabelled(rows: list[dict]) -> Callable[[str, str], bool]:
    """A test of two questions: True when no row joins or sets them apart."""
    groups = groups_of([r for r in rows if r["should_hit"]])
    apart = {frozenset((normal_key(r["a"]), normal_key(r["b"]))) for r in rows}

    def test(a: str, b: str) -> bool:
        ka, kb = normal_key(a), normal_key(b)
        same = ka == kb or groups.get(ka, ka) == groups.get(kb, kb)
        return not same and frozenset((ka, kb)) not in apart

    return test


def nearest(
    asked: list[str], stored: list[str], vectors: dict[str, np.ndarray], k: int, floor: float
) -> list[list[tuple[str, float]]]:
    """Each asked question's `k` nearest stored ones at cosine `floor` or more, itself out."""
    matrix = np.stack([vectors[s] for s in stored])
    out = []
    for q in asked:
        sims = matrix @ vectors[q]
        order = [i for i in np.argsort(-sims) if normal_key(stored[i]) != normal_key(q)]
        out.append([(stored[i], float(sims[i])) for i in order[:k] if sims[i] >= floor])
    return out


def candidates(args: argparse.Namespace) -> list[dict]:
    rows = read_rows(train_files())
    pairs = [r for r in rows if r["split"].startswith("train") and r["source"] != "rules"]
    train = [r for r in rows if r["split"].startswith("train")]
    stored = list(dict.fromkeys(q for r in train for q in (r["a"], r["b"])))
    if args.scope_questions:
        stored = list(dict.fromkeys(stored + scope_questions(args.scope_questions)))
    asked = list(dict.fromkeys(r[args.ask] for r in pairs))
    texts = list(dict.fromkeys(stored + asked))
    vectors = dict(zip(texts, Embedder().embed_many(texts), strict=True))
    verifier, free = NliVerifier.load(), unlabelled(rows)
    out, seen = [], set()
    near = nearest(asked, stored, vectors, args.candidates, args.floor)
    for q, found in zip(asked, near, strict=True):
        for s, cos in found:
            key = frozenset((normal_key(q), normal_key(s)))
            if key in seen or not free(q, s):
                continue
            seen.add(key)
            p, reason = verifier.probability(q, s, cos)
            if p >= args.above and not reason:
                out.append(_row(q, s, round(p, 4), round(cos, 4)))
    return out


def _row(asked: str, stored: str, p: float, cos: float) -> dict:
    return {
        "id": pair_id(asked, stored),
        "split": "judged_train",
        "a": asked,
        "b": stored,
        "should_hit": None,
        "category": "neighbour",
        "source": "judged",
        "domain": None,
        "detail": {"nli_probability": p, "cosine": cos},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--floor", type=float, default=0.4)
    parser.add_argument("--above", type=float, default=0.02)
    # b: the pairs' stored questions asked in turn, for more judged lookups than a's alone
    parser.add_argument("--ask", choices=("a", "b"), default="a")
    parser.add_argument(
        "--scope-questions",
        type=Path,
        nargs="?",
        const=SCOPE_QUESTIONS_TRAIN,
        help=f"more stored questions (default file: {SCOPE_QUESTIONS_TRAIN.name})",
    )
    args = parser.parse_args(argv)
    found = candidates(args)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in found))
    print(f"{len(found)} neighbour pairs to judge -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
