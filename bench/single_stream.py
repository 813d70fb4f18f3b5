"""One request at a time: the wait a single user sees, ours vs llama-cpp-python.

Both engines serve the same requests (token ids, exact output lengths, EOS barred) one after
another. Each request's first token (prefill plus one sampled token) is timed apart from the
rest, so the decode rate is (tokens - 1) / (seconds - first-token seconds), summed over the
requests: decode is what memory bandwidth and weight bytes decide.
"""

import gc
import time
from collections.abc import Sequence
from typing import Any

from bench import common
from bench import engine_driver as ed


def summary(per_request: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Decode and end-to-end rates over requests timed as {tokens, seconds, first_s}."""
    tokens = sum(r["tokens"] for r in per_request)
    seconds = sum(r["seconds"] for r in per_request)
    decode_s = sum(r["seconds"] - r["first_s"] for r in per_request)
    rates = [(r["tokens"] - 1) / (r["seconds"] - r["first_s"]) for r in per_request]
    return {
        "requests": len(per_request),
        "output_tokens": tokens,
        "seconds": round(seconds, 2),
        "decode_tokens_per_s": round((tokens - len(per_request)) / decode_s, 1),
        "end_to_end_tokens_per_s": round(tokens / seconds, 1),
        "median_first_token_s": round(common.median([r["first_s"] for r in per_request]), 3),
        # per request: steadier where another process's burst stalls one request's threads
        "median_request_decode_tokens_per_s": round(common.median(rates), 1),
        "per_request_decode_tokens_per_s": [round(r, 1) for r in rates],
    }


def run_ours(
    items: Sequence[common.ChatItem], model: str, threads: int, weights: str
) -> dict[str, Any]:
    """Each item alone on one engine (no other sequence running), after a warm-up request."""
    dims = ed.model_dims(model)
    longest = max(len(i.prompt_ids) + i.output_tokens for i in items)
    engine = ed.make_engine(
        model=model,
        kv_cache_bytes=max(2 * longest, 4096) * dims.kv_bytes_per_token,
        num_threads=threads,
        weights=weights,
    )
    ed.warm_up(engine, items[0].prompt_ids)
    per_request = [_timed(engine, f"s{k}", item) for k, item in enumerate(items)]
    del engine
    gc.collect()
    return summary(per_request)


def _timed(engine: Any, request_id: str, item: common.ChatItem) -> dict[str, float]:
    start = time.perf_counter()
    engine.add_request(request_id, list(item.prompt_ids), ed.greedy(item.output_tokens))
    first = None
    tokens = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens = out.completion_tokens
            if first is None and tokens:
                first = time.perf_counter() - start
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "first_s": first or 0.0}
