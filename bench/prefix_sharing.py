"""Prefix sharing: 64 requests with one ~1,000-token system prompt and short distinct questions.

The same workload runs twice on fresh engines under the same KV budget, prefix caching on
and off (EngineConfig.enable_prefix_caching). Figures: prompt tokens actually computed
(goal: >= 90% fewer with sharing) and requests/s (goal: >= 3x). Neither engine is warmed
with the system prompt: the first request of the sharing run pays for the prefix itself.
"""

import argparse
import gc
from typing import Any

from bench import common
from bench import engine_driver as ed

GOALS = {"prefill_reduction": 0.90, "throughput_ratio": 3.0}
SYSTEM_TOKENS = 1000


def system_prompt(tokenizer: Any, tokens: int = SYSTEM_TOKENS) -> str:
    """~`tokens` tokens of real English: Python's own help topics (shipped with CPython)."""
    from pydoc_data.topics import topics

    text = "You are a helpful assistant. Use this reference when it helps:\n\n"
    text += "\n\n".join(topics[k] for k in sorted(topics))[:20_000]
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def questions(count: int, max_tokens: int = 40) -> list[str]:
    """Short, distinct first user turns from ShareGPT."""
    seen: set[str] = set()
    out: list[str] = []
    for conv in common.iter_sharegpt(4000):
        pair = common.first_exchange(conv)
        if not pair:
            continue
        q = pair[0].strip()
        if q and q not in seen and 3 <= len(q.split()) <= max_tokens * 0.6:
            seen.add(q)
            out.append(q)
            if len(out) == count:
                return out
    raise RuntimeError(f"only {len(out)} short ShareGPT questions found")


def run_once(prompts: list[list[int]], output_tokens: int, caching: bool, kv_bytes: int) -> Any:
    engine = ed.make_engine(kv_cache_bytes=kv_bytes, enable_prefix_caching=caching)
    ed.warm_up(engine, [1, 2, 3, 4, 5, 6, 7, 8])  # unrelated: warms threads, not the cache
    stats = ed.run_requests(engine, prompts, [output_tokens] * len(prompts))
    del engine
    gc.collect()
    return stats


def summary(stats: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_tokens,
        "computed_prefill_tokens": stats.computed_prefill_tokens,
        "output_tokens": stats.output_tokens,
        "seconds": round(stats.seconds, 2),
        "requests_per_s": round(stats.requests_per_s, 3),
        "output_tokens_per_s": round(stats.output_tokens_per_s, 2),
        "steps": stats.steps,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 output tokens instead of 32")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--kv-mb", type=int, default=1024, help="KV budget of both runs (MiB)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    output_tokens = 8 if args.quick else 32
    tokenizer = common.load_tokenizer()
    system = system_prompt(tokenizer)
    prompts = [common.chat_prompt_ids(tokenizer, q, system) for q in questions(args.requests)]
    kv_bytes = args.kv_mb * 1024 * 1024
    on = run_once(prompts, output_tokens, True, kv_bytes)
    print(f"sharing on:  {summary(on)}", flush=True)
    off = run_once(prompts, output_tokens, False, kv_bytes)
    print(f"sharing off: {summary(off)}", flush=True)
    reduction = 1 - on.computed_prefill_tokens / off.computed_prefill_tokens
    speedup = on.requests_per_s / off.requests_per_s
    shared = len(common.chat_prompt_ids(tokenizer, "", system)) - 5  # the common head, roughly
    result = {
        "workload": {
            "requests": len(prompts),
            "system_prompt_tokens": shared,
            "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
            "output_tokens_each": output_tokens,
            "kv_budget_mb": args.kv_mb,
            "quick": args.quick,
        },
        "sharing_on": summary(on),
        "sharing_off": summary(off),
        "goals": {
            "prefill_reduction": common.goal(round(reduction, 4), GOALS["prefill_reduction"]),
            "throughput_ratio": common.goal(round(speedup, 3), GOALS["throughput_ratio"]),
        },
    }
    print(f"goals: {result['goals']}")
    common.write_result("prefix_sharing", result)


if __name__ == "__main__":
    main()
