"""Hit rate over time through the live gateway, on a replayed workload of repeated,
reworded and must-not questions (`make bench`; JSON to bench/results/cache_replay.json).

The workload comes from the test split of the verifier's pair set
(training/data/cache_pairs.jsonl: pairs never seen in training). Each pair's stored question
is asked first (a miss that fills the cache), its other question some requests later: a
rewording or near repeat that should hit, or a negation / entity / number / scope change
that must not. Popular stored questions are asked again word for word along the way
(Zipf popularity), as real traffic repeats itself. Everything goes through the real
gateway over HTTP with the real small engine, the embedder and the verifier.
Figures: hit rate per window of requests and overall, exact vs semantic hits, the share of
should-hit rewordings served from the cache, and wrong hits (must-not questions answered
from the cache). Goal: wrong hits <= 1% of must-not questions.

    python -m bench.cache_replay [--quick] [--pairs N]
"""

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench import common
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn
from training.cache.train_verifier import DEFAULT_PAIRS

PAIRS = DEFAULT_PAIRS  # training/data/cache_pairs.jsonl
KEY = "sk-replay-0123456789"
WINDOW = 100


def policy(cache_path: Path) -> str:
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: replay}}]}}
cache: {{enabled: true, path: {cache_path}}}
engines:
  smollm2-135m: {{kv_cache_mb: 64, max_num_seqs: 16, max_model_len: 1024}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
routes:
  auto: {{default: small}}
"""


def workload(pairs: list[dict], rng: random.Random) -> list[dict]:
    """Events in order: each pair's stored question, later its other one, and repeats."""
    events: list[dict] = []
    pending: list[dict] = []
    popular = []
    for p in pairs:
        events.append({"text": p["b"], "role": "stored", "kind": p["kind"]})
        popular.append(p["b"])
        pending.append({"text": p["a"], "role": "probe", "kind": p["kind"], "label": p["label"]})
        if len(pending) > 3 and rng.random() < 0.7:  # asked a few requests later
            events.append(pending.pop(rng.randrange(len(pending))))
        if rng.random() < 0.5:  # a word-for-word repeat of a popular question
            rank = min(int(rng.paretovariate(1.2)), len(popular)) - 1
            events.append({"text": popular[rank], "role": "repeat", "kind": "exact"})
    rng.shuffle(pending)
    return events + pending


def ask(client: httpx.Client, text: str) -> str:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    body |= {"max_tokens": 8, "temperature": 0}
    response = client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return response.headers["x-tiergate-cache"]


def replay(url: str, events: list[dict]) -> list[str]:
    outcomes = []
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        for event in events:
            outcome = ask(client, event["text"])
            outcomes.append(outcome)
            time.sleep(0.02)  # a store runs after its answer: let it land as traffic would
    return outcomes


def summarise(events: list[dict], outcomes: list[str]) -> dict:
    hits = [o == "hit" for o in outcomes]
    windows = [
        round(sum(hits[i : i + WINDOW]) / len(hits[i : i + WINDOW]), 3)
        for i in range(0, len(hits), WINDOW)
    ]
    probes = [(e, o) for e, o in zip(events, outcomes, strict=True) if e["role"] == "probe"]
    should = [o == "hit" for e, o in probes if e["label"] == 1]
    must_not = [(e["kind"], o == "hit") for e, o in probes if e["label"] == 0]
    wrong_by_kind = Counter(k for k, hit in must_not if hit)
    repeats = [o == "hit" for e, o in zip(events, outcomes, strict=True) if e["role"] == "repeat"]
    wrong = sum(hit for _, hit in must_not)
    return {
        "requests": len(outcomes),
        "outcomes": dict(Counter(outcomes)),
        "hit_rate": round(sum(hits) / len(hits), 3),
        "hit_rate_per_window": windows,
        "window": WINDOW,
        "repeat_hit_rate": round(sum(repeats) / max(len(repeats), 1), 3),
        "rewording_hit_rate": round(sum(should) / max(len(should), 1), 3),
        "rewordings": len(should),
        "must_not_questions": len(must_not),
        "wrong_hits": wrong,
        "wrong_hit_rate": round(wrong / max(len(must_not), 1), 4),
        "wrong_hits_by_kind": dict(wrong_by_kind),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="120 pairs")
    p.add_argument("--pairs", type=int, help="test pairs to replay (default 400)")
    args = p.parse_args()
    rng = random.Random(7)
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line]
    pairs = [p for p in pairs if p["split"] == "test"]
    rng.shuffle(pairs)
    pairs = pairs[: args.pairs or (120 if args.quick else 400)]
    events = workload(pairs, rng)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cache-replay-") as tmp:
        app = create_app(parse_policy(policy(Path(tmp) / "cache.sqlite3"), env={}))
        with run_uvicorn(app) as url:
            outcomes = replay(url, events)
    result = summarise(events, outcomes)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["goals"] = {"wrong_hit_rate": common.goal(result["wrong_hit_rate"], 0.01, False)}
    print(json.dumps({k: v for k, v in result.items() if k != "hit_rate_per_window"}, indent=1))
    print("hit rate per window of", WINDOW, ":", result["hit_rate_per_window"])
    common.write_result("cache_replay", result)


if __name__ == "__main__":
    main()
