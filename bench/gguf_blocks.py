"""w8a8 on a GGUF's own Q8_0 / Q5_0 / Q4_0 blocks against w8a8 requantized from the fp32
dequantization (the engine before engine/quantization/gguf_blocks.py) and fp32, all in one run.

Perplexity and teacher-forced top-1 agreement with fp32 on bench/precision.py's text
(a slice of Python's pydoc topics), one thread. Default model Qwen2.5-Coder-0.5B, whose
file stores q/k/o/gate/up and the embedding as Q5_0, the LM head and half the v
projections as Q8_0 (those are kept), ffn_down as Q4_K / Q6_K (requantized either way).
"""

import argparse
import json
from pathlib import Path

from bench import common, precision
from bench import engine_driver as ed


def build(model: str, weights: str, keep_blocks: bool) -> object:
    from engine.quantization import file_blocks

    kept = file_blocks.BLOCK_FORMATS
    file_blocks.BLOCK_FORMATS = kept if keep_blocks else ()  # the old path: requantize
    try:
        return ed.make_engine(model=model, kv_cache_bytes=64 << 20, weights=weights, num_threads=1)
    finally:
        file_blocks.BLOCK_FORMATS = kept


def int8_activations(e: object) -> object:
    """The fp32 engine (the file's weights exactly, whatever their block type) with each
    matmul's input rounded as w8a8 rounds it: what a w4a8 kernel on kept Q4_0 / Q4_1
    blocks would compute, measured before writing one."""
    import torch

    from engine.quantization.quant import W8A8_GROUP, quantize_rows

    ops = e.runner.ops
    linear = ops.linear

    def rounded(x: torch.Tensor, weight: object, bias: torch.Tensor | None = None) -> object:
        if x.shape[1] % W8A8_GROUP == 0:
            x = quantize_rows(x, W8A8_GROUP)
        return linear(x, weight, bias)

    ops.linear = rounded
    return e


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--ppl-chars", type=int, default=8000)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    runs = {"fp32": ("fp32", True), "w8a8_file_blocks": ("w8a8", True)}
    runs["w8a8_requantized"] = ("w8a8", False)
    runs["fp32_weights_int8_activations"] = ("fp32", True)
    quality, ids, ref_top1 = {}, None, None
    for name, (weights, keep) in runs.items():
        e = build(args.model, weights, keep)
        e = int8_activations(e) if name == "fp32_weights_int8_activations" else e
        ids = ids or e.tokenizer.encode(precision.ppl_text(args.ppl_chars))
        ppl, top1 = precision.perplexity(e.runner, ids)
        ref_top1 = ref_top1 or top1
        agree = sum(a == b for a, b in zip(top1, ref_top1, strict=True)) / len(top1)
        quality[name] = {"perplexity": round(ppl, 4), "top1_agreement": round(agree, 4)}
        del e
    fp32 = quality["fp32"]["perplexity"]
    for q in quality.values():
        q["ppl_vs_fp32"] = round(q["perplexity"] / fp32 - 1, 5)
    payload = {
        "model": args.model,
        "machine": common.machine_info(),
        "threads": 1,
        "ppl_text": {"source": "pydoc_data.topics", "chars": args.ppl_chars, "tokens": len(ids)},
        "quality": quality,
    }
    print(json.dumps(payload, indent=2))
    common.write_result(f"gguf_blocks_{Path(args.model).name.removesuffix('.gguf')}", payload)


if __name__ == "__main__":
    main()
