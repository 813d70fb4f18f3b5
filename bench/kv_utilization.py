"""How well the paged KV pool is used, on ShareGPT-like mixed prompt and output lengths.

1. Utilisation: after every engine step, the share of allocated KV slots (pages held by
   running sequences x page size) that hold a live token. Paging leaves only each
   sequence's last page part empty, so this should stay >= 0.95.
2. Concurrency: the most sequences running at once under a fixed KV budget, vs a server
   that reserves max_model_len contiguous KV slots per request (budget // max_model_len
   requests at a time). Goal >= 3x.
The budget is set to hold a few max-length requests, and the workload has several times
more requests than the budget can hold at once, so the queue stays non-empty; max_num_seqs is
raised so that the KV budget, not the sequence cap, is what limits concurrency. The peak is
the goal's figure; the mean while requests wait and the preemption count say whether that
peak was sustained or bought with recompute.
Utilisation depends on sequence length (page_size / 2 tokens wasted per sequence on
average), so the short --quick workload reads lower than the full one.
"""

import argparse
from typing import Any

from bench import common
from bench import engine_driver as ed

GOALS = {"mean_utilisation": 0.95, "concurrency_ratio": 3.0}


class Sampler:
    """Per-step samples of KV slot use and running sequences."""

    def __init__(self) -> None:
        self.utilisation: list[float] = []
        self.live = 0
        self.allocated = 0
        self.running: list[int] = []
        self.waiting: list[int] = []

    def __call__(self, engine: Any, _outputs: list[Any]) -> None:
        live, allocated = ed.kv_slot_usage(engine)
        self.running.append(len(engine.scheduler.running))
        self.waiting.append(len(engine.scheduler.waiting))
        if allocated:
            self.utilisation.append(live / allocated)
            self.live += live
            self.allocated += allocated


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    p.add_argument("--requests", type=int, help="default 192 (quick 96)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    max_prompt, max_output = (256, 64) if args.quick else (512, 256)
    count = args.requests or (96 if args.quick else 192)
    budget_requests = 8 if args.quick else 12  # the contiguous baseline fits this many
    tokenizer = common.load_tokenizer()
    items = common.sharegpt_workload(
        tokenizer, count, max_prompt_tokens=max_prompt, max_output=max_output, seed=2
    )
    max_model_len = max_prompt + max_output
    dims = ed.model_dims()
    budget_slots = budget_requests * max_model_len
    engine = ed.make_engine(
        kv_cache_bytes=budget_slots * dims.kv_bytes_per_token,
        max_model_len=max_model_len,
        max_num_seqs=count,  # never the limit: the KV budget is
        max_waiting=count,
    )
    slots = engine.num_pages * engine.page_size  # what the engine made of the budget
    sampler = Sampler()
    stats = ed.run_requests(
        engine, [i.prompt_ids for i in items], [i.output_tokens for i in items], sampler
    )
    snapshot = engine.metrics.snapshot()
    contiguous = slots // max_model_len  # requests a max-length reservation scheme runs at once
    peak = max(sampler.running)
    saturated = [r for r, w in zip(sampler.running, sampler.waiting, strict=True) if w > 0]
    mean_util = sum(sampler.utilisation) / len(sampler.utilisation)
    result = {
        "workload": {
            "requests": len(items),
            "quick": args.quick,
            "mean_prompt_tokens": round(sum(len(i.prompt_ids) for i in items) / len(items), 1),
            "mean_output_tokens": round(sum(i.output_tokens for i in items) / len(items), 1),
            "max_model_len": max_model_len,
        },
        "kv": {"budget_slots": budget_slots, "slots": slots, "page_size": engine.page_size},
        "utilisation": {
            "steps_sampled": len(sampler.utilisation),
            "mean": round(mean_util, 4),
            "min": round(min(sampler.utilisation), 4),
            "p5": round(common.percentile(sampler.utilisation, 5), 4),
            "token_weighted": round(sampler.live / sampler.allocated, 4),
        },
        "concurrency": {
            "ours_peak": peak,
            "ours_mean_while_queue_nonempty": round(sum(saturated) / len(saturated), 1)
            if saturated
            else None,
            "contiguous_max_len_baseline": contiguous,
            "preemptions": snapshot.preemptions,
        },
        "run": {"steps": stats.steps, "seconds": round(stats.seconds, 1)},
        "goals": {
            "mean_utilisation": common.goal(round(mean_util, 4), GOALS["mean_utilisation"]),
            "concurrency_ratio": common.goal(
                common.ratio(peak, contiguous), GOALS["concurrency_ratio"]
            ),
        },
    }
    print(f"KV utilisation per step: {result['utilisation']}")
    print(f"concurrency: {result['concurrency']}")
    print(f"goals: {result['goals']}")
    common.write_result("kv_utilization", result)


if __name__ == "__main__":
    main()
