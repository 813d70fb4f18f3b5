"""Where a single stream's decode step goes: the fused C call (layers + LM head), sampling,
detokenizing, scheduling and other Python bookkeeping, then the asyncio hop and HTTP.

Three ways to serve the same requests one at a time, on one engine (same weights, same run):
  1. LLMEngine.step in a loop (what bench/single_stream.py times), with timers around the
     runner's and the engine's stages (wrappers installed by this script only);
  2. AsyncEngine.generate (the step loop in its thread, outputs over asyncio queues);
  3. the engine's HTTP server (engine/entrypoints/server.py's app under uvicorn) streamed
     with the official openai client, token ids in, ignore_eos.
Each reports decode tokens/s with the first token timed apart (single_stream.summary), so
2 - 1 is the asyncio hop and 3 - 2 is HTTP + SSE. The LM head is also timed alone (one row
through the packed head, the same kernel the fused call ends with).

    python -m bench.decode_overhead --model qwen2.5-coder-0.5b --weights w8a8 --quick
"""

import argparse
import asyncio
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from bench import common, single_stream
from bench import engine_driver as ed

Steps = list[dict[str, float]]  # per step: seconds in each timed stage
STEP = "step (all)"
FUSED = "fused C call (layers + LM head)"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=common.MODEL)
    p.add_argument("--weights", default="w8a8")
    p.add_argument("--kv-dtype", default="fp32")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="64-token outputs (else 128)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-http", action="store_true")
    return p.parse_args()


def timed(steps: Steps, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, adding its seconds to the current step's entry `name` ("step" opens a step)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name == STEP:
            steps.append(defaultdict(float))
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            steps[-1][name] += time.perf_counter() - start

    return wrapper


@contextlib.contextmanager
def stage_timers(engine: Any) -> Iterator[Steps]:
    """Timers around each stage of a step, on this engine's objects only; removed after."""
    import engine.runner as runner_mod
    from engine.detokenizer import IncrementalDetokenizer

    steps: Steps = []
    runner = engine.runner
    patches = [
        (engine, "step", STEP),
        (engine.scheduler, "schedule", "schedule"),
        (engine.scheduler, "on_executed", "on_executed"),
        (engine, "_on_token", "on_token (detok, metrics, output)"),
        (runner, "execute", "runner.execute (all)"),
        (runner, "_pack", "runner._pack"),
        (runner, "_sample", "sampling"),
        (runner.model.rotary, "forward", "rope cos/sin"),
        (runner.fused, "logits", FUSED),
        (runner_mod, "build_context", "attention context"),
        (IncrementalDetokenizer, "add", "detokenize"),
    ]
    saved = []
    for obj, attr, name in patches:
        if obj is None:
            continue
        saved.append((obj, attr, obj.__dict__.get(attr)))
        setattr(obj, attr, timed(steps, name, getattr(obj, attr)))
    try:
        yield steps
    finally:
        for obj, attr, old in saved:
            if old is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)


def breakdown(steps: Steps) -> dict[str, Any]:
    """Mean ms per decode step (the steps that took the fused call) for each stage, and its
    share of the step; "other" rows are what the timed stages inside them leave over."""
    decodes = [s for s in steps if FUSED in s]
    n = len(decodes)
    mean = {k: 1e3 * sum(s[k] for s in decodes) / n for k in set().union(*decodes)}
    per_step = mean[STEP]
    mean["step other (metrics, loop)"] = per_step - sum(
        mean[k]
        for k in (
            "runner.execute (all)",
            "schedule",
            "on_executed",
            "on_token (detok, metrics, output)",
        )
    )
    mean["runner.execute other"] = mean["runner.execute (all)"] - sum(
        mean[k] for k in (FUSED, "sampling", "attention context", "runner._pack", "rope cos/sin")
    )
    mean["on_token other"] = mean["on_token (detok, metrics, output)"] - mean["detokenize"]
    return {
        "decode_steps": n,
        "ms_per_step": round(per_step, 3),
        "ms": {k: round(v, 3) for k, v in sorted(mean.items(), key=lambda kv: -kv[1])},
        "share": {k: round(v / per_step, 4) for k, v in mean.items()},
    }


def lm_head_ms(runner: Any, repeats: int = 30) -> float:
    """One row through the packed LM head (the kernel decode_step ends with), median ms; a
    head smaller than the last-level cache (SmolLM2's 28 MiB) may be read from it."""
    import torch

    model = runner.model
    h = torch.randn(1, model.config.hidden_size)
    with torch.inference_mode():
        model.compute_logits(h)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.compute_logits(h)
            times.append(time.perf_counter() - start)
    return round(1e3 * common.median(times), 3)


def step_weight_bytes(runner: Any) -> int:
    """Bytes of the projection and LM-head weights one decode step reads (values and scales)."""
    model = runner.model
    weights = [model.packed_head]
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights += [p.packed for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    return sum(w.nbytes for w in weights)


def read_gb_per_s(mib: int = 384, repeats: int = 3) -> float:
    """What one thread streams from memory in a plain sum (torch, best of a few): the
    ceiling for a GEMV that reads each weight byte once."""
    import torch

    data = torch.ones(mib << 18)  # fp32: mib MiB
    best = min(_seconds(data.sum) for _ in range(repeats))
    return round(data.nbytes / best / 1e9, 1)


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gemvs_ms(runner: Any, repeats: int = 10) -> float:
    """One row through every projection of every layer and the LM head, in the fused call's
    order (so no weight is still in cache from its last use), median ms. Each is one
    ops.linear call: its Python (~10 us a call) is in the figure."""
    import torch

    model, ops = runner.model, runner.ops
    calls = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            calls.append((torch.randn(1, proj.in_features), proj.packed))
    calls.append((torch.randn(1, model.config.hidden_size), model.packed_head))
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for x, weight in calls:
                ops.linear(x, weight)
            times.append(time.perf_counter() - start)
    return round(1e3 * common.median(times[1:]), 3)


def in_process(engine: Any, items: list[common.ChatItem]) -> tuple[dict, dict]:
    plain = single_stream.summary(
        [single_stream._timed(engine, f"p{k}", i) for k, i in enumerate(items)]
    )
    with stage_timers(engine) as steps:
        for k, item in enumerate(items):
            single_stream._timed(engine, f"t{k}", item)
    return plain, breakdown(steps)


async def _async_one(engine: Any, rid: str, item: common.ChatItem) -> dict[str, float]:
    start = time.perf_counter()
    first, tokens = None, 0
    async for out in engine.generate(list(item.prompt_ids), ed.greedy(item.output_tokens), rid):
        tokens = out.completion_tokens
        if first is None and tokens:
            first = time.perf_counter() - start
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "first_s": first or 0.0}


def over_asyncio(engine: Any, items: list[common.ChatItem]) -> dict[str, Any]:
    async def run() -> list[dict[str, float]]:
        return [await _async_one(engine, f"a{k}", i) for k, i in enumerate(items)]

    return single_stream.summary(asyncio.run(run()))


def over_http(engine: Any, items: list[common.ChatItem], served: str) -> dict[str, Any]:
    import openai

    from engine.entrypoints.server import create_engine_app
    from tests.servers import run_uvicorn

    with run_uvicorn(create_engine_app(engine, served)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        timed_requests = []
        for item in items:
            start = time.perf_counter()
            first, tokens = None, 0
            stream = client.completions.create(
                model=served,
                prompt=list(item.prompt_ids),
                max_tokens=item.output_tokens,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.choices and first is None:
                    first = time.perf_counter() - start
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            timed_requests.append(
                {"tokens": tokens, "seconds": time.perf_counter() - start, "first_s": first or 0}
            )
    return single_stream.summary(timed_requests)


def main() -> None:
    args = parse_args()
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    tokenizer = common.load_tokenizer(args.model)
    items = common.sharegpt_workload(
        tokenizer,
        args.requests,
        max_prompt_tokens=256,
        max_output=64 if args.quick else 128,
        seed=1,
    )
    items = [common.ChatItem(i.question, i.prompt_ids, 64 if args.quick else 128) for i in items]
    dims = ed.model_dims(args.model)
    longest = max(len(i.prompt_ids) + i.output_tokens for i in items)
    engine = ed.make_engine(
        model=args.model,
        kv_cache_bytes=max(2 * longest, 4096) * dims.kv_bytes_per_token,
        num_threads=args.threads,
        weights=args.weights,
        kv_dtype=args.kv_dtype,
    )
    ed.warm_up(engine, items[0].prompt_ids)
    plain, stages = in_process(engine, items)
    head, gemvs = lm_head_ms(engine.runner), gemvs_ms(engine.runner)
    step_bytes, read_rate = step_weight_bytes(engine.runner), read_gb_per_s()
    fused_rate = step_bytes / stages["ms"][FUSED] / 1e6
    print(f"in process: {plain['decode_tokens_per_s']} tok/s; LM head alone {head} ms,")
    print(f"  every GEMV of a step (layers + head) alone {gemvs} ms")
    print(f"  weights read per step {step_bytes / 2**20:.0f} MiB: the fused call streams")
    print(f"  {fused_rate:.1f} GB/s, a plain one-thread sum {read_rate} GB/s")
    for name, ms in stages["ms"].items():
        print(f"  {name:40s} {ms:8.3f} ms  {100 * stages['share'][name]:5.1f}%")
    config = EngineConfig(model=args.model, num_threads=args.threads, weights=args.weights)
    async_engine = AsyncEngine(config, engine.runner)  # the same loaded model
    async_engine.start()
    try:
        hop = over_asyncio(async_engine, items)
        print(f"AsyncEngine: {hop['decode_tokens_per_s']} tok/s")
        http = {"skipped": "--skip-http"}
        if not args.skip_http:
            http = over_http(async_engine, items, args.model)
            print(f"HTTP + SSE: {http['decode_tokens_per_s']} tok/s")
    finally:
        async_engine.shutdown()
    result = {
        "model": args.model,
        "weights": args.weights,
        "kv_dtype": args.kv_dtype,
        "threads": args.threads,
        "requests": len(items),
        "output_tokens_each": items[0].output_tokens,
        "in_process": plain,
        "step_breakdown": stages,
        "lm_head_one_row_ms": head,
        "all_gemvs_one_row_ms": gemvs,
        "step_weight_bytes": step_bytes,
        "fused_call_gb_per_s": round(fused_rate, 1),
        "one_thread_sum_gb_per_s": read_rate,
        "async_engine": hop,
        "http_sse": http,
    }
    common.write_result(f"decode_overhead_{args.model}_{args.weights}", result)


if __name__ == "__main__":
    main()
