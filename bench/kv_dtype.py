"""KV cache element type (kv_dtype fp32, bf16 and int8) on SmolLM2-135M, all in one run.

Capacity: pages, and sequences of SEQ_TOKENS that fit at once, at one KV budget.
Quality: perplexity on bench/precision.py's pydoc text fed in chunks of CHUNK tokens
(every chunk after a window's first reads the earlier K/V from the pages, as chunked
prefill and decode do; one whole-window prefill would attend to its fp32 K/V and hide the
pages' type), and greedy agreement over precision.py's prompts (decode reads the pages).
Speed: decode tokens/s at batch 32 with ~300-token contexts, the engines alternating;
and the C attention kernel alone on the same shape (one layer), the dtypes alternating.
Weights fp32 in all, so only the KV type differs.
int8 scale granularity: the fp32 pages the perplexity run left (real K/V, every layer)
quantized with one scale per token and KV head, the same with an offset (min..max: what
kv_dtype int8 stores for K; V keeps the symmetric one), and one scale per page and KV
head; relative RMS error of K and V for each.
"""

import argparse
import json
from statistics import median
from typing import Any

from bench import common
from bench import engine_driver as ed
from bench.common import cpu_model
from bench.precision import PROMPTS, common_prefix, greedy_tokens, ppl_text

KV_DTYPES = ("fp32", "bf16", "int8")
KV_BYTES = 64 << 20  # the budget whose capacity is reported
RUN_KV_BYTES = 512 << 20  # the engines': room for the speed batch without preemption
SEQ_TOKENS = 512
CHUNK = 64
WINDOW = 512


def chunked_perplexity(runner: Any, ids: list[int]) -> float:
    import torch

    from engine.attention import build_context
    from engine.batch import SeqChunk

    nll, count = 0.0, 0
    pages = list(range(WINDOW // runner.page_size))
    for start in range(0, len(ids) - 1, WINDOW):
        window = ids[start : start + WINDOW + 1]
        for c in range(0, len(window) - 1, CHUNK):
            x, y = window[c : c + CHUNK], torch.tensor(window[c + 1 : c + CHUNK + 1])
            x = x[: len(y)]
            chunk = SeqChunk(0, x, c, pages, True, ed.greedy(1))
            with torch.inference_mode():
                ctx = build_context([chunk], runner.page_size, kernels=runner.ops.kernels)
                pos = torch.arange(c, c + len(x))
                hidden = runner.model(torch.tensor(x), pos, ctx, runner.kv_caches)
                logits = runner.model.compute_logits(hidden)
            nll += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            count += len(y)
    return float(torch.tensor(nll / count).exp())


def scale_granularity(runner: Any, pages: int) -> dict[str, dict[str, float]]:
    """Relative RMS error of the first `pages` pages' K and V (fp32 pools) quantized to
    int8 per token and KV head (symmetric, absmax / 127; and min..max with an offset, what
    kv_dtype int8 stores for K), and per page and KV head (symmetric)."""
    import torch

    from engine.kv.pages import quantize_kv_int8, quantize_kv_int8_offset

    def rel_err(x: torch.Tensor, per_page: bool, offset: bool) -> float:
        # x [pages, KVH, tokens, D]: rows of D (per token), or of tokens * D (per page)
        rows = x.flatten(2) if per_page else x
        if offset:
            q, scale, shift = quantize_kv_int8_offset(rows)
            back = q.float() * scale[..., None] + shift[..., None]
        else:
            q, scale = quantize_kv_int8(rows)
            back = q.float() * scale[..., None]
        return float((back.view_as(x) - x).norm() / x.norm())

    out: dict[str, dict[str, float]] = {}
    for name, per_page, offset in (
        ("per_token_head", False, False),
        ("per_token_head_with_offset", False, True),
        ("per_page_head", True, False),
    ):
        errs = {"k": 0.0, "v": 0.0}
        for k_pool, v_pool in runner.kv_caches:
            errs["k"] += rel_err(k_pool[:pages].transpose(2, 3), per_page, offset)
            errs["v"] += rel_err(v_pool[:pages], per_page, offset)
        n = len(runner.kv_caches)
        out[name] = {f"{kv}_relative_rms_error": round(e / n, 5) for kv, e in errs.items()}
    return out


def attention_kernel_us(kernels: Any, dtypes: dict[str, Any], rounds: int) -> dict[str, float]:
    """The C paged attention kernel alone, one layer: 32 decodes of 300-token contexts over
    pages scattered at random (SmolLM2's 9 heads, 3 KV heads, 64 dims), median of
    `rounds` alternating rounds of 20 calls each, microseconds per call."""
    import statistics
    import time

    import torch

    from engine.attention import build_context, kernel_attention
    from engine.batch import SeqChunk
    from engine.kv.pages import new_kv_pools

    batch, context, page, per_seq = 32, 300, 16, 19
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(batch * per_seq, generator=gen).tolist()
    chunks = [
        SeqChunk(i, [1], context - 1, order[i * per_seq : (i + 1) * per_seq], True, ed.greedy(1))
        for i in range(batch)
    ]
    rows = build_context(chunks, page, kernels=kernels).decode_rows
    q, out = torch.randn(batch, 9, 64, generator=gen), torch.empty(batch, 9, 64)
    pools = {}
    for kv, dtype in dtypes.items():
        k_pool, v_pool = new_kv_pools(batch * per_seq, page, 3, 64, dtype)
        for pool in (k_pool, v_pool):  # int8: the values; their scales stay 0 (as fast)
            pool.copy_(torch.randn(pool.shape, generator=gen).mul(40).clamp(-127, 127))
        pools[kv] = (k_pool, v_pool)
    times: dict[str, list[float]] = {kv: [] for kv in dtypes}
    for _ in range(rounds):
        for kv, (k_pool, v_pool) in pools.items():
            start = time.perf_counter()
            for _ in range(20):
                kernel_attention(kernels, q, k_pool, v_pool, rows, out)
            times[kv].append((time.perf_counter() - start) / 20 * 1e6)
    return {kv: round(statistics.median(t), 1) for kv, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ppl-chars", type=int, default=8000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="(bench/run.py) one speed round")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    engines = {
        kv: ed.make_engine(kv_cache_bytes=RUN_KV_BYTES, kv_dtype=kv, num_threads=args.threads)
        for kv in KV_DTYPES
    }
    tok = engines["fp32"].tokenizer
    ids = tok.encode(ppl_text(args.ppl_chars))
    prompts = [tok.encode(t) for t in PROMPTS]
    greedy = {kv: greedy_tokens(e, prompts, 32) for kv, e in engines.items()}
    out: dict[str, Any] = {}
    for kv, e in engines.items():
        r = e.runner
        pages = KV_BYTES // r.bytes_per_page(r.model_config, r.page_size, kv)
        pairs = list(zip(greedy[kv], greedy["fp32"], strict=True))
        prefix = [common_prefix(a, b) for a, b in pairs]
        out[kv] = {
            "pages": pages,
            f"sequences_of_{SEQ_TOKENS}_tokens": pages // (SEQ_TOKENS // r.page_size),
            "chunked_perplexity": round(chunked_perplexity(r, ids), 4),
            "greedy_identical_prompts": f"{sum(a == b for a, b in pairs)}/{len(pairs)}",
            "greedy_mean_common_prefix_tokens": round(sum(prefix) / len(prefix), 2),
        }
    # the fp32 pages the perplexity run left, before the speed runs overwrite them
    granularity = scale_granularity(
        engines["fp32"].runner, WINDOW // engines["fp32"].runner.page_size
    )
    batch = [(q * 12)[:300] for q in (prompts * 4)[:32]]
    rates: dict[str, list[float]] = {kv: [] for kv in engines}
    for e in engines.values():
        ed.warm_up(e, prompts[0])
    for _ in range(1 if args.quick else args.rounds):
        for kv, e in engines.items():
            rates[kv].append(ed.decode_rate(e, batch, 12)["tokens_per_s"])
    for kv in engines:
        out[kv]["decode_tokens_per_s_batch32_ctx300"] = round(max(rates[kv]), 1)
        # on a shared machine one lucky round can make the best; the median is steadier
        out[kv]["decode_tokens_per_s_batch32_ctx300_median"] = round(median(rates[kv]), 1)
    r = engines["fp32"].runner
    torch_dtypes = {kv: e.runner.kv_dtype for kv, e in engines.items()}
    kernel_us = attention_kernel_us(r.ops.kernels, torch_dtypes, 5 if args.quick else 15)
    ppl = {kv: out[kv]["chunked_perplexity"] for kv in KV_DTYPES}
    sequences = {kv: out[kv][f"sequences_of_{SEQ_TOKENS}_tokens"] for kv in KV_DTYPES}
    rate = {kv: out[kv]["decode_tokens_per_s_batch32_ctx300_median"] for kv in KV_DTYPES}
    ratios = {
        "int8_vs_bf16_pages": round(out["int8"]["pages"] / out["bf16"]["pages"], 3),
        "int8_vs_bf16_sequences": round(sequences["int8"] / sequences["bf16"], 3),
        "int8_vs_fp32_perplexity": round(ppl["int8"] / ppl["fp32"], 5),
        "bf16_vs_fp32_perplexity": round(ppl["bf16"] / ppl["fp32"], 5),
        "int8_vs_bf16_decode_tokens_per_s_median": round(rate["int8"] / rate["bf16"], 3),
        "int8_vs_bf16_attention_kernel_time": round(kernel_us["int8"] / kernel_us["bf16"], 3),
    }
    payload = {
        "model": common.MODEL,
        "cpu": cpu_model(),
        "threads": args.threads,
        "kv_budget_mib": KV_BYTES >> 20,
        "kv": out,
        "rounds": rates,
        "attention_kernel_us_batch32_ctx300": kernel_us,
        "ratios": ratios,
        "int8_scale_granularity_fp32_pages": granularity,
        "goals": {
            "bf16_kv_ppl_increase_le_0.5pct": common.goal(
                ppl["bf16"] / ppl["fp32"] - 1, 0.005, False
            ),
            "int8_kv_ppl_increase_le_2pct": common.goal(ppl["int8"] / ppl["fp32"] - 1, 0.02, False),
            "int8_kv_sequences_ge_1.8x_bf16": common.goal(ratios["int8_vs_bf16_sequences"], 1.8),
        },
    }
    print(json.dumps(payload, indent=2))
    common.write_result("kv_dtype", payload)


if __name__ == "__main__":
    main()
