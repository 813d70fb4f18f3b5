"""What the new sampling fields cost the engine: decode throughput of a batch that asks for
penalties, logit_bias, min_tokens and top-5 logprobs, against the same batch without them,
in one run on the real SmolLM2 (greedy, fixed output lengths with ignore_eos).

Runs alternate (plain, adjusted, plain, adjusted...) so machine load drifts hit both alike;
the figure is the median ratio of adjusted to plain tokens/s.

    python -m bench.sampling_fields [--quick]
"""

import argparse
import time

import torch

from bench import common
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

PROMPTS = [f"Question {i}: explain why the sky is blue, in detail." for i in range(16)]


def tokens_per_s(engine: LLMEngine, params: SamplingParams, batch: int) -> float:
    engine.reset_prefix_cache()
    started = time.perf_counter()
    engine.generate(PROMPTS[:batch], [params] * batch)
    return batch * params.max_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    batch, tokens, rounds = (8, 32, 2) if args.quick else (16, 64, 3)
    torch.set_num_threads(1)
    config = EngineConfig(model=common.MODEL, kv_cache_bytes=64 << 20, max_num_seqs=batch)
    engine = LLMEngine(config)
    plain = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    adjusted = SamplingParams(
        temperature=0,
        max_tokens=tokens,
        ignore_eos=True,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.1,
        logit_bias={100: 2.0, 200: -5.0},
        min_tokens=8,
        logprobs=5,
    )
    tokens_per_s(engine, plain, batch)  # warm-up: kernels compiled, pages touched
    runs: dict[str, list[float]] = {"plain": [], "adjusted": []}
    for _ in range(rounds):
        runs["plain"].append(tokens_per_s(engine, plain, batch))
        runs["adjusted"].append(tokens_per_s(engine, adjusted, batch))
    ratios = [a / p for a, p in zip(runs["adjusted"], runs["plain"], strict=True)]
    result = {
        "cpu_model": common.cpu_model(),
        "batch": batch,
        "output_tokens": tokens,
        "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        "adjusted_vs_plain": round(common.median(ratios), 3),
        "goals": {"adjusted_vs_plain": common.goal(round(common.median(ratios), 3), 0.9)},
    }
    print(result)
    common.write_result("sampling_fields", result)


if __name__ == "__main__":
    main()
