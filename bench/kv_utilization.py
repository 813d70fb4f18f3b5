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
3. Admission reserve (engine/scheduler.py): the same workload runs twice in this run, with
   the engine's default reserve (kv_watermark, kv_reserve_tokens) and with it off (both 0,
   the baseline: admit whenever the prompt fits); preemptions per request (goal <= 0.1) and
   output tokens/s both ways, their ratio the throughput cost of the reserve.
"""

import argparse
from typing import Any

from bench import common
from bench import engine_driver as ed

GOALS = {"mean_utilisation": 0.95, "concurrency_ratio": 3.0, "preemptions_per_request": 0.1}
RESERVE_OFF = {"kv_watermark": 0.0, "kv_reserve_tokens": 0}


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


def run_once(items: list[ed.ChatItem], max_model_len: int, kv_bytes: int, **reserve: Any) -> Any:
    """One engine, the whole workload: its per-step samples, run stats and the engine."""
    engine = ed.make_engine(
        kv_cache_bytes=kv_bytes,
        max_model_len=max_model_len,
        max_num_seqs=len(items),  # never the limit: the KV budget is
        max_waiting=len(items),
        **reserve,
    )
    ed.warm_up(engine, [1, 2, 3, 4, 5, 6, 7, 8])  # thread pools and kernels out of the timing
    sampler = Sampler()
    stats = ed.run_requests(
        engine, [i.prompt_ids for i in items], [i.output_tokens for i in items], sampler
    )
    return engine, sampler, stats


def summarise(engine: Any, sampler: Sampler, stats: ed.RunStats, contiguous: int) -> dict:
    """Utilisation, concurrency, preemptions and throughput of one run."""
    preemptions = engine.metrics.snapshot().preemptions
    saturated = [r for r, w in zip(sampler.running, sampler.waiting, strict=True) if w > 0]
    mean_util = sum(sampler.utilisation) / len(sampler.utilisation)
    return {
        "reserve": {
            "kv_watermark": engine.config.kv_watermark,
            "kv_reserve_tokens": engine.config.kv_reserve_tokens,
        },
        "utilisation": {
            "steps_sampled": len(sampler.utilisation),
            "mean": round(mean_util, 4),
            "min": round(min(sampler.utilisation), 4),
            "p5": round(common.percentile(sampler.utilisation, 5), 4),
            "token_weighted": round(sampler.live / sampler.allocated, 4),
        },
        "concurrency": {
            "ours_peak": max(sampler.running),
            "ours_mean_while_queue_nonempty": round(sum(saturated) / len(saturated), 1)
            if saturated
            else None,
            "contiguous_max_len_baseline": contiguous,
            "preemptions": preemptions,
            "preemptions_per_request": round(preemptions / stats.requests, 4),
        },
        "run": {
            "steps": stats.steps,
            "seconds": round(stats.seconds, 1),
            "output_tokens_per_s": round(stats.output_tokens_per_s, 1),
        },
    }


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
    budget_slots = budget_requests * max_model_len
    kv_bytes = budget_slots * ed.model_dims().kv_bytes_per_token
    runs = {}
    for name, reserve in (("reserve_off", RESERVE_OFF), ("reserve_on", {})):
        engine, sampler, stats = run_once(items, max_model_len, kv_bytes, **reserve)
        slots = engine.num_pages * engine.page_size  # what the engine made of the budget
        contiguous = slots // max_model_len  # requests a max-length reservation runs at once
        runs[name] = summarise(engine, sampler, stats, contiguous)
        print(f"{name}: {runs[name]}", flush=True)
    on, off = runs["reserve_on"], runs["reserve_off"]
    result = {
        "workload": {
            "requests": len(items),
            "quick": args.quick,
            "mean_prompt_tokens": round(sum(len(i.prompt_ids) for i in items) / len(items), 1),
            "mean_output_tokens": round(sum(i.output_tokens for i in items) / len(items), 1),
            "max_model_len": max_model_len,
        },
        "kv": {"budget_slots": budget_slots, "slots": slots, "page_size": engine.page_size},
        **on,  # the engine's defaults: the figures the goals read
        "baseline_reserve_off": off,
        "reserve_vs_off": {
            "preemptions_per_request": [
                on["concurrency"]["preemptions_per_request"],
                off["concurrency"]["preemptions_per_request"],
            ],
            "throughput_ratio": common.ratio(
                on["run"]["output_tokens_per_s"], off["run"]["output_tokens_per_s"]
            ),
            "mean_concurrency_ratio": common.ratio(
                on["concurrency"]["ours_mean_while_queue_nonempty"] or 0,
                off["concurrency"]["ours_mean_while_queue_nonempty"] or 0,
            ),
        },
        "goals": {
            "mean_utilisation": common.goal(on["utilisation"]["mean"], GOALS["mean_utilisation"]),
            "concurrency_ratio": common.goal(
                common.ratio(on["concurrency"]["ours_peak"], contiguous),
                GOALS["concurrency_ratio"],
            ),
            "preemptions_per_request": common.goal(
                on["concurrency"]["preemptions_per_request"],
                GOALS["preemptions_per_request"],
                higher_is_better=False,
            ),
        },
    }
    print(f"reserve on vs off: {result['reserve_vs_off']}")
    print(f"goals: {result['goals']}")
    common.write_result("kv_utilization", result)


if __name__ == "__main__":
    main()
