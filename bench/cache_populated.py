"""The semantic cache with many entries in one scope: wrong hits where a lookup has neighbours.

    python -m bench.cache_populated [--limit N]

bench/cache_eval.py keeps each held-out pair in a scope of its own, so a lookup meets one
candidate: it measures the verifier pair by pair. A deployment's scope holds many questions,
and a lookup verifies up to `cache.candidates` of them, each one more chance of a wrong hit.
Here one scope holds every stored question of the six held-out sets and, as neighbours, every
question of the train pairs (both sides); then each held-out pair's new question is looked
up once (nothing is stored on a miss). A hit serves the pair's own stored question ("own":
right for a should-hit pair, wrong for a must-not one), a question joined to the asked one
through should-hit pairs ("joined": right), one that a must-not pair sets apart from it
("different": wrong), or another ("other": not judged; listed in the JSON, asked and served,
for a person to judge); the wrong hits are listed the same way. Pairs of every file in
training/data/cache_pairs_real/ count, with populated_judged.jsonl: earlier runs' other
hits, judged (never read by training).

Settings in the same run: `nli` as docs/cache.md recommends it (balanced, floor 0.4,
`cache.model_reads: 1`: one candidate a lookup read by the NLI model), the same reading every
candidate, and the default policy. Figures on all six held-out sets (people's pairs):
each kind of pair served own / joined / different / other; goals (nli): the wrong hits
known, over all lookups, at most 1% with the upper 95% Clopper-Pearson bound at most 2%,
and no hit left unjudged.
Writes cache_populated.json (TIERGATE_BENCH_RESULTS).
"""

import argparse
import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from bench.cache_eval import (
    ANSWER,
    MUST_NOT,
    NLI_RECOMMENDED,
    SHOULD_HIT,
    bench_query,
    held_out,
    share,
)
from gateway.cache.semantic import SemanticCache
from gateway.cache.verifiers import load_verifier
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings
from training.artifacts import REAL_PAIRS, REAL_PAIRS_DIR
from training.bounds import upper_bound
from training.cache.real_pairs import groups_of, normal_key

HELDOUT_FILES = {
    "heldout": REAL_PAIRS,
    **{f"heldout{n}": REAL_PAIRS_DIR / f"pairs_heldout{n}.jsonl" for n in range(2, 7)},
}
GOAL_WRONG, GOAL_BOUND = 0.01, 0.02
SCOPE = "populated"


def all_pairs() -> list[dict]:
    """Every row of every pair file, the judged hits' too."""
    rows = []
    for path in sorted(REAL_PAIRS_DIR.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def neighbours(rows: list[dict]) -> list[str]:
    """Both questions of every train pair."""
    return [q for r in rows if r["split"].startswith("train") for q in (r["a"], r["b"])]


@dataclass(frozen=True)
class Labels:
    """What the pair files say of two questions: joined through should-hit pairs (their
    group), or set apart by a must-not pair."""

    groups: dict[str, str]
    apart: frozenset[frozenset[str]]

    @classmethod
    def of(cls, rows: list[dict]) -> "Labels":
        groups = groups_of([r for r in rows if r["should_hit"]])
        apart = frozenset(
            frozenset((normal_key(r["a"]), normal_key(r["b"]))) for r in rows if not r["should_hit"]
        )
        return cls(groups, apart)

    def same(self, a: str, b: str) -> bool:
        return a == b or self.groups.get(a, a) == self.groups.get(b, b)


def judge(row: dict, served: str | None, labels: Labels) -> str:
    """'miss', 'own' (the pair's own stored question), 'joined', 'different' or 'other'."""
    if served is None:
        return "miss"
    if served == row["b"]:
        return "own"
    asked, got = normal_key(row["a"]), normal_key(served)
    if labels.same(asked, got):
        return "joined"
    return "different" if frozenset((asked, got)) in labels.apart else "other"


async def run(
    rows: list[dict],
    stored: list[str],
    vectors: dict[str, np.ndarray],
    embedder: Embedder,
    settings: dict,
) -> list[str | None]:
    """`stored` in one scope, then each row's new question looked up: the question of the
    entry it served (None: a miss)."""
    with tempfile.TemporaryDirectory() as tmp:
        policy = CacheSettings(enabled=True, path=str(Path(tmp) / "c.sqlite3"), **settings)
        cache = await SemanticCache.open(policy, embedder, load_verifier(policy.verifier_model))
        for text in stored:
            await cache.store(bench_query(SCOPE, text), _vector(vectors[text]), ANSWER, None)
        route, served = policy.for_route(None), []
        for r in rows:
            found = await cache.lookup(bench_query(SCOPE, r["a"]), _vector(vectors[r["a"]]), route)
            hit = found.outcome in ("exact", "semantic") and found.entry_id is not None
            served.append(_stored(cache, found.entry_id) if hit else None)
        await cache.close()
    return served


def _stored(cache: SemanticCache, entry_id: str) -> str | None:
    held = cache.tables.get(entry_id)
    return held.question if held is not None else None


def _vector(vector: np.ndarray):
    async def embed() -> np.ndarray:
        return vector

    return embed


WAYS = ("own", "joined", "different", "other")


def figures(rows: list[dict], served: list[str | None], judged: list[str]) -> dict[str, Any]:
    """Per kind of the people's pairs, how many were served each way; the wrong hits known
    (a must-not pair's own edit, a question set apart) and the other hits, listed."""
    people = [i for i, r in enumerate(rows) if r["source"] != "rules"]
    out: dict[str, Any] = {}
    for kind, categories in (("should_hit", SHOULD_HIT), ("must_not", MUST_NOT)):
        picked = [judged[i] for i in people if rows[i]["category"] in categories]
        out[kind] = {"pairs": len(picked)} | {f"served_{w}": picked.count(w) for w in WAYS}
    hit, nots = out["should_hit"], out["must_not"]
    hit["right_share"] = share(hit["served_own"] + hit["served_joined"], hit["pairs"])
    wrong = hit["served_different"] + nots["served_own"] + nots["served_different"]
    unjudged = hit["served_other"] + nots["served_other"]
    lookups = hit["pairs"] + nots["pairs"]
    out["wrong"] = {
        "lookups": lookups,
        "known": wrong,
        "share": share(wrong, lookups),
        "upper_95": round(upper_bound(wrong, lookups), 4),
        "unjudged": unjudged,
        "share_if_unjudged_wrong": share(wrong + unjudged, lookups),
    }
    out["other_hits"] = listed(rows, served, [i for i in people if judged[i] == "other"])
    counted = [i for i in people if rows[i]["category"] in SHOULD_HIT + MUST_NOT]
    wrong_at = [i for i in counted if judged[i] == "different" or _wrong_own(rows[i], judged[i])]
    out["wrong_hits"] = listed(rows, served, wrong_at)
    return out


def _wrong_own(row: dict, way: str) -> bool:
    return way == "own" and row["category"] in MUST_NOT


def listed(rows: list[dict], served: list[str | None], at: list[int]) -> list[dict]:
    """The hits at `at`: the asked pair's set and kind, what was asked, served and its own."""
    return [
        {"split": rows[i]["split"], "category": rows[i]["category"], "asked": rows[i]["a"]}
        | {"served": served[i], "own": rows[i]["b"]}
        for i in at
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N pairs of each set")
    args = parser.parse_args()
    rows = [r for split, path in HELDOUT_FILES.items() for r in held_out(path, split, args.limit)]
    every = all_pairs()
    labels = Labels.of(every)
    stored = list(dict.fromkeys([r["b"] for r in rows] + neighbours(every)))
    texts = list(dict.fromkeys(stored + [r["a"] for r in rows]))
    embedder = Embedder()
    vectors = dict(zip(texts, embedder.embed_many(texts), strict=True))
    runs = {
        "nli_balanced": NLI_RECOMMENDED,
        "nli_balanced_every_read": NLI_RECOMMENDED | {"model_reads": None},
        "default": {},
    }
    result: dict[str, Any] = {
        "cpu_model": common.cpu_model(),
        "stored_questions": len(stored),
        "heldout_lookups": len(rows),
    }
    for name, settings in runs.items():
        served = asyncio.run(run(rows, stored, vectors, embedder, settings))
        judged = [judge(r, s, labels) for r, s in zip(rows, served, strict=True)]
        result[name] = {"settings": settings}
        result[name] |= figures(rows, served, judged)
        shown = {k: v for k, v in result[name].items() if not k.endswith("_hits")}
        print(name, json.dumps(shown), f"{len(result[name]['other_hits'])} other hits")
    wrong = result["nli_balanced"]["wrong"]
    result["goals"] = {
        "wrong_share": common.goal(wrong["share"], GOAL_WRONG, False),
        "wrong_upper_95": common.goal(wrong["upper_95"], GOAL_BOUND, False),
        "hits_unjudged": common.goal(wrong["unjudged"], 0, False),
    }
    print("cpu", result["cpu_model"])
    common.write_result("cache_populated", result)


if __name__ == "__main__":
    main()
