"""How often the semantic cache hits, and how often wrongly: cosine alone vs the verifier.

    python -m bench.cache_eval [--no-embed] [--live-cosines]

On the labelled pairs (training/cache/build_pairs.py; the verifier never trained or tuned
on the test split): the curve of hit rate (should-hit pairs accepted) against wrong-hit
rate (must-not pairs accepted) for a cosine threshold alone (the baseline, same run) and
for the shipped verifier (gateway/cache/verifier_model.json), per must-not category, and
the strict / balanced / lenient operating points on dev and test. Also the verifier's time
per pair, next to one query's embedding (a cost every lookup already pays) on each
embedder backend. `--live-cosines` scores dev and test with the cosines of the embedder
the gateway ships (ONNX Runtime by default) instead of those stored in the pair set, and
reports how far they drift.
Writes bench/results/cache_eval.json.
"""

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import common
from gateway.cache.pair_text import analyse
from gateway.cache.verifier import DEFAULT_ARTIFACT, STRICTNESS, PairVerifier
from training.cache.train_verifier import DEFAULT_PAIRS, load_pairs

GOAL_WRONG, GOAL_HITS = 0.01, 0.70
FLOORS = (0.0, 0.5, 0.6, 0.7)  # a similarity floor the cache may apply before verifying


def rates(accepted: list[bool], pairs: list[dict]) -> dict[str, float]:
    pos = [a for a, p in zip(accepted, pairs, strict=True) if p["label"] == 1]
    neg = [a for a, p in zip(accepted, pairs, strict=True) if p["label"] == 0]
    return {
        "hit_rate": round(sum(pos) / max(len(pos), 1), 4),
        "wrong_hit_rate": round(sum(neg) / max(len(neg), 1), 4),
        "wrong_hits": sum(neg),
        "must_not": len(neg),
        "should_hit": len(pos),
    }


def by_kind(accepted: list[bool], pairs: list[dict]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({p["kind"] for p in pairs}):
        picked = [(a, p) for a, p in zip(accepted, pairs, strict=True) if p["kind"] == kind]
        label = picked[0][1]["label"]
        share = sum(a for a, _ in picked) / len(picked)
        out[kind] = {
            "pairs": len(picked),
            "label": label,
            "hit_rate" if label else "wrong_hit_rate": round(share, 4),
        }
    return out


def curve(scores: list[float], pairs: list[dict], thresholds: list[float]) -> list[dict]:
    return [{"threshold": t, **rates([s >= t for s in scores], pairs)} for t in thresholds]


def best_under(points: list[dict], wrong: float) -> dict | None:
    ok = [p for p in points if p["wrong_hit_rate"] <= wrong]
    return max(ok, key=lambda p: (p["hit_rate"], -p["threshold"]), default=None)


def evaluate(verifier: PairVerifier, pairs: list[dict]) -> dict[str, Any]:
    cosines = [p["cosine"] for p in pairs]
    probs, reasons = zip(
        *(verifier.probability(p["a"], p["b"], p["cosine"]) for p in pairs), strict=True
    )
    grid = [round(i / 100, 2) for i in range(40, 101)]
    cos_curve = curve(cosines, pairs, grid)
    ver_curve = curve(list(probs), pairs, [round(i / 50, 2) for i in range(51)])
    points = {}
    for name in STRICTNESS:
        t = verifier.thresholds[name]
        for floor in FLOORS:
            accepted = [p >= t and c >= floor for p, c in zip(probs, cosines, strict=True)]
            key = name if floor == 0 else f"{name}@cosine>={floor}"
            points[key] = {"threshold": t, "floor": floor, **rates(accepted, pairs)}
            if floor == 0:
                points[key]["by_kind"] = by_kind(accepted, pairs)
    cos_at_1 = best_under(cos_curve, GOAL_WRONG)
    vetoes = Counter(r for r, p in zip(reasons, pairs, strict=True) if r)
    return {
        "pairs": len(pairs),
        "cosine_alone": {
            "curve": cos_curve,
            "best_at_1pct_wrong": cos_at_1,
            "by_kind_at_0.80": by_kind([c >= 0.8 for c in cosines], pairs),
        },
        "verifier": {
            "curve": ver_curve,
            "operating_points": points,
            "veto_reasons": dict(vetoes.most_common()),
            "should_hit_vetoed": sum(
                1 for r, p in zip(reasons, pairs, strict=True) if r and p["label"] == 1
            ),
        },
    }


def time_verifier(verifier: PairVerifier, pairs: list[dict]) -> dict[str, float]:
    """Each pair twice: both texts new to the analysis cache, then both analysed already."""
    analyse.cache_clear()
    new, seen, cpu = [], [], []  # cpu: this thread's CPU time, blind to descheduling
    for p in pairs:
        for times in (new, seen):
            start, start_cpu = time.perf_counter(), time.thread_time()
            verifier.verify(p["a"], p["b"], p["cosine"])
            times.append((time.perf_counter() - start) * 1e6)
            if times is new:
                cpu.append((time.thread_time() - start_cpu) * 1e6)
    return {
        "verify_us_p50": round(common.percentile(new, 50), 1),
        "verify_us_p99": round(common.percentile(new, 99), 1),
        "verify_cpu_us_p99": round(common.percentile(cpu, 99), 1),
        "verify_cached_texts_us_p50": round(common.percentile(seen, 50), 1),
    }


def time_embedding(texts: list[str]) -> dict[str, float]:
    """One query's embedding, wall and this thread's CPU, per embedder backend (same run)."""
    import torch

    from gateway.embedding.embedder import Embedder

    torch.set_num_threads(1)
    out: dict[str, float] = {}
    for backend in ("onnx", "torch"):
        embedder = Embedder(backend=backend)
        embedder.embed_many(texts[:2])
        wall, cpu = [], []
        for t in texts:
            start, start_cpu = time.perf_counter(), time.thread_time()
            embedder.embed_many([t])
            wall.append((time.perf_counter() - start) * 1e6)
            cpu.append((time.thread_time() - start_cpu) * 1e6)
        suffix = "" if backend == "onnx" else f"_{backend}"  # the default backend unsuffixed
        out[f"embed_one_query_us_p50{suffix}"] = round(common.percentile(wall, 50), 1)
        out[f"embed_one_query_cpu_us_p50{suffix}"] = round(common.percentile(cpu, 50), 1)
    return out


def live_cosines(pairs: list[dict]) -> dict[str, float]:
    """Replace each pair's stored cosine (measured when the set was built, on torch) with
    the shipped embedder's, so the operating points are those a live gateway gets."""
    from gateway.embedding.embedder import Embedder

    embedder = Embedder()
    texts = sorted({p["a"] for p in pairs} | {p["b"] for p in pairs})
    vectors = embedder.embed_many(texts)
    row = {t: i for i, t in enumerate(texts)}
    drift = []
    for p in pairs:
        cosine = float(vectors[row[p["a"]]] @ vectors[row[p["b"]]])
        drift.append(abs(cosine - p["cosine"]))
        p["cosine"] = cosine
    return {
        "backend": embedder.backend,
        "pairs": len(pairs),
        "cosine_drift_mean": round(sum(drift) / len(drift), 6),
        "cosine_drift_max": round(max(drift), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-embed", action="store_true", help="skip the embedding timing")
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument(
        "--live-cosines",
        action="store_true",
        help="score dev/test with the shipped embedder's cosines, not the stored ones",
    )
    args = parser.parse_args()
    verifier = PairVerifier.load(args.artifact)
    pairs = load_pairs(args.pairs)
    result: dict[str, Any] = {"cpu_model": common.cpu_model(), "thresholds": verifier.thresholds}
    if args.live_cosines:
        result["live_cosines"] = live_cosines([p for p in pairs if p["split"] != "train"])
        print("live cosines", result["live_cosines"])
    for split in ("dev", "test"):
        result[split] = evaluate(verifier, [p for p in pairs if p["split"] == split])
    test = [p for p in pairs if p["split"] == "test"]
    result["speed"] = time_verifier(verifier, test)
    if not args.no_embed:
        result["speed"].update(time_embedding([p["a"] for p in test[:50]]))
    bal = result["test"]["verifier"]["operating_points"]["balanced"]
    result["goals"] = {
        "test_wrong_hit_rate_balanced": common.goal(bal["wrong_hit_rate"], GOAL_WRONG, False),
        "test_hit_rate_balanced": common.goal(bal["hit_rate"], GOAL_HITS),
    }
    for split in ("dev", "test"):
        cos = result[split]["cosine_alone"]["best_at_1pct_wrong"]
        print(
            f"[{split}] cosine alone at <=1% wrong: threshold {cos and cos['threshold']}, "
            f"hits {cos and cos['hit_rate']}"
        )
        for name, pt in result[split]["verifier"]["operating_points"].items():
            print(
                f"[{split}] {name:28} hits {pt['hit_rate']:.3f}  wrong {pt['wrong_hit_rate']:.4f}"
                f" ({pt['wrong_hits']}/{pt['must_not']})"
            )
    print("speed", result["speed"], "cpu", result["cpu_model"])
    common.write_result("cache_eval", result)


if __name__ == "__main__":
    main()
