"""Quality of 4- and 5-bit weights: the GGUF's fp32 dequantization requantized by
llama.cpp's Q4_0, Q4_1 and Q5_0 rules (blocks of 32 along k), against fp32, same run.

Each variant builds the fp32 engine on weights requantized and dequantized back to fp32
before packing, so its figure is the weights' rounding alone (no kernel of ours differs):
every projection, and the LM head too unless the variant says "proj". A tied LM head gets
its own requantized copy; the input embedding (a row lookup, no bandwidth to save) stays
as the file has it. "+a8": the symmetric blocks go, exactly, into the w8a8 engine as
int8 values and scales (engine/quantization/gguf_blocks.py's path for a file's own Q4_0 / Q5_0), so
the activations are rounded to int8 too by the real kernels: what a w4a8 kernel computes;
Q4_1 (no int8 form) gets the same rounding of each matmul's input in torch.
Quality as bench/precision.py measures it: perplexity on its pydoc_data.topics slice,
teacher-forced top-1 agreement, greedy agreement over its 8 prompts x 32 tokens.
"""

import argparse
import contextlib
import gc
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import common, gguf_blocks, precision
from bench import engine_driver as ed

GROUP = 32  # k values per block, as every llama.cpp block type here


@dataclass(frozen=True)
class BlockRule:
    bits: int
    symmetric: bool  # Q4_0 / Q5_0: scale from the signed max, codes offset; Q4_1: min + scale


RULES = {"q4_0": BlockRule(4, True), "q4_1": BlockRule(4, False), "q5_0": BlockRule(5, True)}


@dataclass
class Requantized:
    codes: torch.Tensor  # uint8 [N, K], 0 .. 2^bits - 1
    scale: torch.Tensor  # fp32 [N, K / GROUP], fp16 values (the file stores fp16)
    low: torch.Tensor  # fp32 [N, K / GROUP]: what code 0 stands for (-2^(bits-1) * scale)

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        g = self.codes.float().view(n, k // GROUP, GROUP)
        return (g * self.scale[..., None] + self.low[..., None]).view(n, k)

    def int8(self, rule: BlockRule) -> Any:
        """Symmetric blocks as w8a8's plain Int8Weight: the same values, exactly."""
        from engine.quantization.quant import Int8Weight

        assert rule.symmetric
        q = (self.codes.to(torch.int16) - (1 << (rule.bits - 1))).to(torch.int8)
        return Int8Weight(q, self.scale.contiguous(), GROUP)


def requantize(weight: torch.Tensor, rule: BlockRule) -> Requantized:
    """weight [N, K] (K a multiple of GROUP) -> blocks, by llama.cpp's reference rule
    (gguf-py's quantize_blocks): codes from the fp32 scale, truncating x / d + offset +
    0.5 then clamping to the top code; the scale (and Q4_1's min) stored as fp16."""
    n, k = weight.shape
    g = weight.detach().float().reshape(n, k // GROUP, GROUP)
    top = (1 << rule.bits) - 1
    if rule.symmetric:
        half = 1 << (rule.bits - 1)
        signed_max = g.gather(2, g.abs().argmax(dim=2, keepdim=True))  # first of ties
        d, low, x = signed_max / -half, None, g
        shift = half + 0.5
    else:
        low = g.amin(dim=2, keepdim=True)
        d, x, shift = (g.amax(dim=2, keepdim=True) - low) / top, g - low, 0.5
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    codes = (x * inv + shift).trunc_().clamp_(0, top).to(torch.uint8)
    d16 = d.half().float()
    low16 = -half * d16 if low is None else low.half().float()
    return Requantized(codes.view(n, k), d16.squeeze(2), low16.squeeze(2))


@dataclass(frozen=True)
class Variant:
    rule: str | None  # None: the fp32 reference
    head: bool = True  # the LM head requantized too
    int8_activations: bool = False  # rounded per token in groups of 32, as w8a8 does

    @property
    def name(self) -> str:
        if self.rule is None:
            return "fp32"
        return self.rule + ("" if self.head else "_proj") + ("+a8" if self.int8_activations else "")


VARIANTS = {
    v.name: v
    for v in (
        Variant(None),
        Variant("q4_0"),
        Variant("q4_0", head=False),
        Variant("q4_1"),
        Variant("q4_1", head=False),
        Variant("q5_0"),
        Variant("q4_0", int8_activations=True),
        Variant("q5_0", int8_activations=True),
        Variant("q4_1", int8_activations=True),
        Variant("q4_1", head=False, int8_activations=True),
    )
}


def requantize_model(model: Any, v: Variant, as_blocks: bool) -> None:
    """Replace the model's matmul weights before it is packed: fp32 dequantized blocks,
    or (as_blocks) the blocks themselves for w8a8 to take as a file's own."""
    rule = RULES[v.rule]
    linears = [m for m in model._linears() if v.head or m is not model.lm_head]
    for lin in linears:
        r = requantize(lin.weight, rule)
        if as_blocks:
            lin.blocks = r.int8(rule)
        else:  # a new tensor: the loaded one may map the weight cache's file
            lin.weight = torch.nn.Parameter(r.dequantize(), requires_grad=False)
    if v.head and model.lm_head is None:  # tied: the head's copy only
        r = requantize(model.embed_tokens.weight, rule)
        if as_blocks:
            model.head_blocks = r.int8(rule)
        else:
            model.packed_head = model.ops.pack_weight(r.dequantize(), _batch_hint())


def _batch_hint() -> int:
    """What the runner packs for: the engine's default max_num_seqs (build() keeps it)."""
    from engine.config import EngineConfig

    return EngineConfig(model="").max_num_seqs


@contextlib.contextmanager
def loaded_with(transform: Callable[[Any], None]) -> Iterator[None]:
    """Engines built inside get their model through `transform` after loading."""
    import engine.runner

    load = engine.runner.load_model

    def patched(resolved: Any, ops: Any = None) -> Any:
        config, model = load(resolved, ops)
        transform(model)
        return config, model

    engine.runner.load_model = patched
    try:
        yield
    finally:
        engine.runner.load_model = load


def build(model: str, v: Variant) -> Any:
    """The variant's engine: symmetric blocks with int8 activations on the w8a8 kernels,
    Q4_1's (no int8 form) on the fp32 engine with each matmul's input rounded as w8a8
    rounds it (bench/gguf_blocks.py) and decode steps through that forward, not fused."""
    kernels = v.int8_activations and RULES[v.rule].symmetric
    weights = "w8a8" if kernels else "fp32"
    with contextlib.ExitStack() as stack:
        if v.rule is not None:
            stack.enter_context(loaded_with(lambda m: requantize_model(m, v, as_blocks=kernels)))
        e = ed.make_engine(model=model, kv_cache_bytes=64 << 20, weights=weights, num_threads=1)
    if v.int8_activations and not kernels:
        gguf_blocks.int8_activations(e)
        e.runner.fused = None
    return e


def measure(model: str, names: list[str], ppl_chars: int) -> dict[str, Any]:
    """Each variant in turn (one engine alive at a time), scored against the first."""
    quality, ref, ids, prompts = {}, None, None, None
    for name in names:
        start = time.perf_counter()
        e = build(model, VARIANTS[name])
        tok = e.tokenizer
        ids = ids or tok.encode(precision.ppl_text(ppl_chars))
        prompts = prompts or [tok.encode(p) for p in precision.PROMPTS]
        ppl, top1 = precision.perplexity(e.runner, ids)
        greedy = precision.greedy_tokens(e, prompts, 32)
        ref = ref or {"ppl": ppl, "top1": top1, "greedy": greedy}
        pairs = list(zip(greedy, ref["greedy"], strict=True))
        same = [a == b for a, b in pairs]
        prefix = [precision.common_prefix(a, b) for a, b in pairs]
        agree = sum(a == b for a, b in zip(top1, ref["top1"], strict=True)) / len(top1)
        quality[name] = {
            "perplexity": round(ppl, 4),
            "ppl_vs_fp32": round(ppl / ref["ppl"] - 1, 5),
            "teacher_forced_top1_agreement": round(agree, 4),
            "greedy_identical_prompts": f"{sum(same)}/{len(same)}",
            "greedy_mean_common_prefix_tokens": round(sum(prefix) / len(prefix), 2),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(name, json.dumps(quality[name]), flush=True)
        del e
        gc.collect()
    return {"tokens": len(ids), "quality": quality}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=common.MODEL, help="bundled name or .gguf")
    p.add_argument("--ppl-chars", type=int, default=8000, help="as bench/precision.py")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; fp32 first")
    p.add_argument("--quick", action="store_true", help="(bench/run.py) the same run")
    args = p.parse_args()
    names = args.variants.split(",")
    if names[0] != "fp32" or any(n not in VARIANTS for n in names):
        p.error(f"variants: fp32 first, then any of {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    run = measure(args.model, names, args.ppl_chars)
    quality = run.pop("quality")
    goals = {
        f"{n}_ppl_increase_le_2pct": common.goal(q["ppl_vs_fp32"], 0.02, False)
        for n, q in quality.items()
        if VARIANTS[n].rule and RULES[VARIANTS[n].rule].bits == 4
    }
    payload = {
        "model": args.model,
        "cpu": common.cpu_model(),
        "threads": 1,
        "group": GROUP,
        "ppl_text": {"source": "pydoc_data.topics", "chars": args.ppl_chars} | run,
        "quality": quality,
        "goals": goals,
    }
    print(json.dumps(payload, indent=2))
    print(table(quality))
    model = Path(args.model).name.removesuffix(".gguf")
    common.write_result("requant4" if args.model == common.MODEL else f"requant4_{model}", payload)


def table(quality: dict[str, Any]) -> str:
    rows = ["| variant | perplexity (vs fp32) | top-1 agreement | greedy identical / prefix |"]
    rows.append("|---|---|---|---|")
    for n, q in quality.items():
        rows.append(
            f"| {n} | {q['perplexity']:.3f} ({q['ppl_vs_fp32']:+.2%}) "
            f"| {q['teacher_forced_top1_agreement']:.1%} "
            f"| {q['greedy_identical_prompts']} / {q['greedy_mean_common_prefix_tokens']} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
