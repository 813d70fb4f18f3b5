"""Streams that survive a dying deployment: N greedy chat streams through the gateway, the
`tiergate engine` serving each SIGKILLed at a random point; the other engine of the tier
continues it (gateway/backends/resume.py).

Measured in one run, on two `tiergate engine` processes (smollm2-135m, one thread each)
behind an in-process gateway, each stream first served without a failure (the baseline):
- the share of killed streams whose text equals the uninterrupted text (goal 100%), and
  of those that ended without an error;
- the resume's extra latency: the gap between the last piece before the kill and the
  first piece after it, against the median gap between pieces of the same stream
  uninterrupted; and the whole stream's time against its uninterrupted time.

The engine killed is restarted between streams (not timed). Prompts are written here
(varied tasks); the figure is of the mechanism, not of a model's quality.

    python -m bench.stream_resume [--n 12] [--max-tokens 64] [--seed 0]
"""

import argparse
import itertools
import random
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

from bench import common
from bench.common import cpu_model
from tests.resume_streams import Streamed, body_for, engines_and_gateway, metric, stream

PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "List ten ideas for a rainy weekend with children.",
    "Describe the water cycle to a ten year old.",
    "Write a letter to a friend about moving to a new city.",
    "What are the pros and cons of working from home?",
    "Give me a recipe for a simple tomato soup.",
    "Summarise the plot of a detective novel you invent.",
    "How do I start learning to play the guitar?",
    "Write a short speech for a school graduation.",
    "Explain what a database index is and why it helps.",
    "Describe a walk through a forest in autumn.",
]


def warm_up(api_base: str) -> None:
    body = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    httpx.post(f"{api_base}/chat/completions", json=body, timeout=300).raise_for_status()


def _gaps(streamed: Streamed) -> list[float]:
    times = streamed.arrivals
    return [b - a for a, b in itertools.pairwise(times)]


def _seconds(streamed: Streamed) -> float:
    return streamed.arrivals[-1] - streamed.arrivals[0] if streamed.arrivals else 0.0


def run(n: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    rows = []
    with tempfile.TemporaryDirectory() as logs, engines_and_gateway(Path(logs)) as (engines, url):
        first = engines[0]
        for engine in engines:  # first-use costs out of the figures
            warm_up(engine.api_base())
        for i in range(n):
            body = body_for(PROMPTS[i % len(PROMPTS)], max_tokens)
            clean = stream(url, body)
            kill_at = rng.randint(1, max_tokens - 8)
            cut = stream(url, body, kill_at, first.kill)
            # pieces already on their way when the engine died still arrive at decode pace:
            # the resume is the longest gap after the kill
            gap = max(_gaps(cut)[kill_at - 1 :]) if cut.error is None else None
            rows.append(
                {
                    "kill_after_pieces": kill_at,
                    "equal": cut.text == clean.text,
                    "error": (cut.error or {}).get("message"),
                    "resume_gap_s": gap,
                    "baseline_gap_s": statistics.median(_gaps(clean)),
                    "seconds": _seconds(cut),
                    "baseline_seconds": _seconds(clean),
                    "completion_tokens": (cut.usage or {}).get("completion_tokens"),
                }
            )
            print(rows[-1])
            first.start()  # back on its port for the next stream (not timed)
        resumed = metric(url, "tiergate_stream_resumes_total", outcome="resumed")
    return summarise(rows, resumed, max_tokens)


def summarise(rows: list[dict], resumed: float, max_tokens: int) -> dict:
    equal = sum(r["equal"] for r in rows) / len(rows)
    clean_end = sum(r["error"] is None for r in rows) / len(rows)
    gaps = [r["resume_gap_s"] for r in rows if r["resume_gap_s"] is not None]
    base_gap = common.median([r["baseline_gap_s"] for r in rows])
    extra = [r["seconds"] - r["baseline_seconds"] for r in rows if r["error"] is None]
    base_seconds = common.median([r["baseline_seconds"] for r in rows])
    return {
        "cpu_model": cpu_model(),
        "streams": len(rows),
        "max_tokens": max_tokens,
        "resumed_counted": resumed,
        "equal_share": round(equal, 3),
        "ended_without_error_share": round(clean_end, 3),
        "resume_gap_s": {
            "median": round(common.median(gaps), 4),
            "p90": round(common.percentile(gaps, 90), 4),
            "baseline_gap_between_pieces_median": round(base_gap, 4),
            "ratio": common.ratio(common.median(gaps), base_gap),
        },
        "stream_seconds": {
            "extra_median": round(common.median(extra), 4),
            "baseline_median": round(base_seconds, 4),
        },
        "rows": rows,
        "goals": {"equal_share": common.goal(round(equal, 3), 1.0)},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=12, help="streams killed")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    result = run(args.n, args.max_tokens, args.seed)
    print({k: v for k, v in result.items() if k != "rows"})
    common.write_result("stream_resume", result)
    return 0 if result["goals"]["equal_share"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
