"""Which projections' int8 activations move a model's answers away from fp32?

Our fp32 engine (the GGUF's weights dequantized), with the activations entering chosen
projections rounded as `blocks` and llama.cpp round them (int8 per group of 32, scale
max|x| / 127: engine/quantization/quant.py quantize_rows), and nothing else changed.
Teacher-forced on fp32's own greedy answers to greedy_agreement.py's chat prompts: per
configuration, the share of answer positions whose argmax stays fp32's, and the prompts
with any flip. Configurations: each site alone (qkv, o, gate_up, down, the LM head),
all of them (what `blocks` does to activations), all but one site (what keeping that
site's activations in fp32 would buy), and then the worst site alone layer by layer.
"""

import argparse
from collections.abc import Callable
from typing import Any

from bench import common
from bench import greedy_agreement as ga
from engine.quantization.quant import quantize_rows

SITES = ("qkv", "o", "gate_up", "down", "head")
GROUP = 32  # llama.cpp's Q8_0 / Q8_1 block, and gemm_blocks.c's activation group


def site_modules(model: Any, site: str, layers: list[int]) -> list[Any]:
    parts = {"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj"}
    parts |= {"gate_up": "mlp.gate_up_proj", "down": "mlp.down_proj"}
    return [model.layers[i].get_submodule(parts[site]) for i in layers]


def quantize_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x, *rest: fn(quantize_rows(x, GROUP), *rest)


def configure(model: Any, sites: dict[str, list[int]]) -> None:
    """Round the inputs of `sites` (site -> layers; the head ignores its list) to int8."""
    model.__dict__.pop("compute_logits", None)  # an earlier configuration's overrides
    for m in model.modules():
        m.__dict__.pop("forward", None)
    for site, layers in sites.items():
        if site == "head":
            model.compute_logits = quantize_inputs(type(model).compute_logits.__get__(model))
            continue
        for m in site_modules(model, site, layers):
            m.forward = quantize_inputs(type(m).forward.__get__(m))


def measure(
    engine: Any, seqs: list[list[int]], starts: list[int], ref: Any, prompts: list[str]
) -> dict[str, Any]:
    top1 = ga.forced_top1(engine, seqs)
    flipped = [q for q, a, b, s in zip(prompts, top1, ref, starts, strict=True) if a[s:] != b[s:]]
    return {
        "forced_top1_agreement": ga.forced_agreement(top1, ref, starts),
        "prompts_with_a_flip": len(flipped),
        "france_flipped": ga.PROMPTS[0] in flipped,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=common.MODEL)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--result", default="act_quant_sites")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    engine = ga.build(args.model, "fp32")
    tok, model = engine.tokenizer, engine.runner.model
    stop = set(tok.eos_token_ids)
    prompts = [ga.chat_ids(tok, q) for q in ga.PROMPTS]
    answers = ga.greedy_answers(engine, prompts, args.max_tokens, stop)
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    starts = [len(p) - 1 for p in prompts]
    ref = ga.forced_top1(engine, seqs)
    every = list(range(len(model.layers)))
    configs = {"all": dict.fromkeys(SITES, every)}
    configs |= {f"only_{s}": {s: every} for s in SITES}
    configs |= {f"all_but_{s}": {t: every for t in SITES if t != s} for s in SITES}
    out: dict[str, Any] = {}
    for name, sites in configs.items():
        configure(model, sites)
        out[name] = measure(engine, seqs, starts, ref, ga.PROMPTS)
        print(name, out[name], flush=True)
    alone = {s: out[f"only_{s}"]["forced_top1_agreement"] for s in SITES}
    worst = min(alone, key=alone.__getitem__)
    # layer by layer on the prompts that site flips alone (the others cannot flip)
    configure(model, {worst: every})
    top1 = ga.forced_top1(engine, seqs)
    keep = [i for i, (a, b, s) in enumerate(zip(top1, ref, starts, strict=True)) if a[s:] != b[s:]]
    sub = [[x[i] for i in keep] for x in (seqs, starts, ref)]
    per_layer = {}
    for i in every:
        configure(model, {worst: [i]})
        per_layer[i] = measure(engine, *sub, prompts=[ga.PROMPTS[j] for j in keep])
        print(worst, i, per_layer[i], flush=True)
    configure(model, {})
    payload = {
        "model": args.model,
        "cpu": common.cpu_model(),
        "threads": 1,
        "group": GROUP,
        "prompts": len(prompts),
        "configs": out,
        "worst_site": worst,
        "worst_site_per_layer": {"prompts": len(keep), "layers": per_layer},
    }
    common.write_result(args.result, payload)


if __name__ == "__main__":
    main()
