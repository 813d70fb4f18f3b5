"""KV cache element type (kv_dtype fp32 vs bf16) on SmolLM2-135M, both in one run.

Capacity: pages, and sequences of SEQ_TOKENS that fit at once, at one KV budget.
Quality: perplexity on bench/precision.py's pydoc text fed in chunks of CHUNK tokens
(every chunk after a window's first reads the earlier K/V from the pages, as chunked
prefill and decode do; one whole-window prefill would attend to its fp32 K/V and hide the
pages' type), and greedy agreement over precision.py's prompts (decode reads the pages).
Speed: decode tokens/s at batch 32 with ~300-token contexts, the two alternating.
Weights fp32 in both, so only the KV type differs.
"""

import argparse
import json
from typing import Any

from bench import common
from bench import engine_driver as ed
from bench.common import cpu_model
from bench.precision import PROMPTS, common_prefix, greedy_tokens, ppl_text

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
        for kv in ("fp32", "bf16")
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
    batch = [(q * 12)[:300] for q in (prompts * 4)[:32]]
    rates: dict[str, list[float]] = {kv: [] for kv in engines}
    for e in engines.values():
        ed.warm_up(e, prompts[0])
    for _ in range(1 if args.quick else args.rounds):
        for kv, e in engines.items():
            rates[kv].append(ed.decode_rate(e, batch, 12)["tokens_per_s"])
    for kv in engines:
        out[kv]["decode_tokens_per_s_batch32_ctx300"] = round(max(rates[kv]), 1)
    ppl32, ppl16 = out["fp32"]["chunked_perplexity"], out["bf16"]["chunked_perplexity"]
    payload = {
        "model": common.MODEL,
        "cpu": cpu_model(),
        "threads": args.threads,
        "kv_budget_mib": KV_BYTES >> 20,
        "kv": out,
        "rounds": rates,
        "goals": {"bf16_kv_ppl_increase_le_0.5pct": common.goal(ppl16 / ppl32 - 1, 0.005, False)},
    }
    print(json.dumps(payload, indent=2))
    common.write_result("kv_dtype", payload)


if __name__ == "__main__":
    main()
