"""Output tokens/s of our engine on 32 concurrent ShareGPT-like chat requests, vs baselines.

Baselines, measured in the same run on the same weights and the same token ids:
  (a) transformers generate, static padded batches of 32 (goal: ours >= 2x);
  (b) llama-cpp-python on the same GGUF, one request after another (goal: >= 3x);
  (c) vLLM's CPU build on an HF folder converted from the GGUF, in float32 and in bfloat16
      (vLLM's recommended dtype where the CPU has bf16) (goal: >= 1.2x its best dtype).
Single stream: the first --single-stream requests one at a time, ours vs llama-cpp-python,
decode tokens/s with the first token timed apart (goal: >= 1.5x; see single_stream.py).
Plus decode at batch 64 as a share of this machine's fp32 matmul peak (goal: >= 50%), with
transformers' own batch-64 decode step as its same-run reference.

Every engine generates exactly each request's token count (EOS barred), so tokens/s compare
the same work. Start-up and weight loading are excluded from every timing (and recorded).
"""

import argparse
import gc
import os
import sys
import time
from typing import Any

from bench import common, single_stream
from bench import engine_driver as ed
from bench.hf_folder import ensure_hf_folder
from bench.venv_baselines import run_llamacpp, run_vllm, venv_or_skip

GOALS = {
    "vs_transformers": 2.0,
    "vs_llamacpp": 3.0,
    "vs_vllm": 1.2,
    "single_stream_vs_llamacpp": 1.5,  # issue #27
    "decode64_peak_share": 0.5,
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="outputs <= 64 tokens, shorter prompts")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--model", default=common.MODEL, help="a bundled model (GGUF) for every engine")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--skip-llamacpp", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--no-install", action="store_true", help="skip baselines not installed yet")
    p.add_argument(
        "--weights",
        default="fp32",
        help="our engine's weight formats, comma-separated (fp32, bf16, int8, w8a8, auto), each"
        " measured; the first is 'ours'. Not fp32 or another model: the result is written as"
        " throughput_<weights>[_<model>].json",
    )
    p.add_argument(
        "--vllm-dtypes",
        default="float32,bfloat16",
        help="vLLM dtypes, comma-separated, each run; goals compare with the fastest",
    )
    p.add_argument(
        "--single-stream",
        type=int,
        default=8,
        help="requests served one at a time by ours and llama-cpp-python (0: skip)",
    )
    p.add_argument("--skip-decode64", action="store_true", help="skip the batch-64 decode figure")
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 2,
        help="CPU threads for every engine (default: all cores); 1 can win on a busy machine",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of our engine and of vLLM (the close pair); each reports its median run",
    )
    return p.parse_args()


def workload(quick: bool, count: int, model: str) -> list[common.ChatItem]:
    tokenizer = common.load_tokenizer(model)
    max_out, max_prompt = (64, 256) if quick else (256, 512)
    return common.sharegpt_workload(
        tokenizer, count, max_prompt_tokens=max_prompt, max_output=max_out, seed=1
    )


def useful_tokens(items: list[common.ChatItem]) -> int:
    return sum(i.output_tokens for i in items)


# ---------------------------------------------------------------- ours


def run_ours(
    items: list[common.ChatItem], threads: int, repeats: int, weights: str, model: str
) -> dict[str, Any]:
    """The workload `repeats` times, each on a fresh engine (no prefix-cache carry-over);
    tokens_per_s is the median run."""
    dims = ed.model_dims(model)
    # Room for every request at its full length: this measures batching, not preemption.
    slots = sum(len(i.prompt_ids) + i.output_tokens for i in items) * 5 // 4
    runs = []
    for _ in range(repeats):
        engine = ed.make_engine(
            model=model,
            kv_cache_bytes=max(slots, 4096) * dims.kv_bytes_per_token,
            num_threads=threads,
            weights=weights,
        )
        ed.warm_up(engine, items[0].prompt_ids)
        cpu = time.process_time()  # every thread of this process: what capacity.py counts
        stats = ed.run_chat_items(engine, items)
        cpu = time.process_time() - cpu
        runs.append({"seconds": round(stats.seconds, 2), "steps": stats.steps, "cpu_s": cpu})
        del engine
        gc.collect()
    return common.median_run(stats.output_tokens, runs)


def decode64_ours(
    items: list[common.ChatItem], timed_steps: int, threads: int, weights: str, model: str
) -> dict[str, Any]:
    prompts = batch64_prompts(items)
    dims = ed.model_dims(model)
    kv_bytes = 64 * 256 * dims.kv_bytes_per_token
    engine = ed.make_engine(
        model=model,
        kv_cache_bytes=kv_bytes,
        max_num_seqs=64,
        num_threads=threads,
        weights=weights,
    )
    ed.warm_up(engine, prompts[0])
    result = ed.decode_rate(engine, prompts, timed_steps)
    del engine
    gc.collect()
    return result


def batch64_prompts(items: list[common.ChatItem], length: int = 64) -> list[list[int]]:
    """64 prompts of one length (no padding for transformers), cycled from the workload."""
    pool = [i.prompt_ids for i in items]
    prompts = []
    for k in range(64):
        ids = pool[k % len(pool)]
        ids = (ids * (length // len(ids) + 1))[:length]
        prompts.append([*ids[: length - 1], (k * 7919) % 30000 + 1000])  # distinct last token
    return prompts


# ---------------------------------------------------------------- transformers


def load_transformers(model: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_hf_folder(model), dtype="float32").eval()


def run_transformers(items: list[common.ChatItem], name: str, batch: int = 32) -> dict[str, Any]:
    """Static batches: left-padded, each runs until its longest request is done."""
    model = load_transformers(name)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    _generate(model, [items[0].prompt_ids], 4, pad)  # warm-up
    start = time.perf_counter()
    for k in range(0, len(items), batch):
        group = items[k : k + batch]
        _generate(model, [i.prompt_ids for i in group], max(i.output_tokens for i in group), pad)
    seconds = time.perf_counter() - start
    del model
    gc.collect()
    tokens = useful_tokens(items)  # tokens past a request's own length are waste, not output
    return {"output_tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": tokens / seconds}


def _generate(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> None:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # EOS barred, like every other engine here
            do_sample=False,
            pad_token_id=pad,
        )


def decode64_transformers(
    items: list[common.ChatItem], timed_steps: int, name: str
) -> dict[str, Any]:
    """transformers' batched decode step at batch 64 (KV cache on): the same-run reference."""
    import torch

    model = load_transformers(name)
    prompts = batch64_prompts(items)
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(2):  # settle, as for ours
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        step_seconds = []
        for _ in range(timed_steps):
            start = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            step_seconds.append(time.perf_counter() - start)
    del model, past, out
    gc.collect()
    context = len(prompts[0]) + 3 + timed_steps / 2
    return ed.decode_summary(64, 64 * timed_steps, step_seconds, context)


# ---------------------------------------------------------------- report


def peak_share(decode: dict[str, Any], peak_gflops: float, model: str) -> float:
    flops = ed.model_dims(model).flops_per_token(decode["mean_context"])
    return decode["tokens_per_s"] * flops / 1e9 / peak_gflops


def compare(ours: dict[str, Any], base: dict[str, Any], target: float) -> dict[str, Any]:
    if "tokens_per_s" not in ours or "tokens_per_s" not in base:
        return {"skipped": base.get("skipped") or ours.get("skipped"), "target": target}
    return common.goal(common.ratio(ours["tokens_per_s"], base["tokens_per_s"]), target)


def compare_best(ours: dict[str, Any], bases: dict[str, Any], target: float) -> dict[str, Any]:
    """Against the fastest of several runs of one baseline (vLLM's dtypes); each ratio kept."""
    measured = {k: b for k, b in bases.items() if "tokens_per_s" in b}
    if not measured or "tokens_per_s" not in ours:
        reasons = [str(b.get("skipped")) for b in bases.values()] + [str(ours.get("skipped"))]
        return {"skipped": "; ".join(reasons), "target": target}
    best = max(measured, key=lambda k: measured[k]["tokens_per_s"])
    result = {**compare(ours, measured[best], target), "baseline": best}
    each = {k: common.ratio(ours["tokens_per_s"], b["tokens_per_s"]) for k, b in measured.items()}
    return {**result, "each": each}


def compare_single(ours: dict[str, Any], base: dict[str, Any], target: float) -> dict[str, Any]:
    key = "decode_tokens_per_s"
    if key not in ours or key not in base:
        return {"skipped": base.get("skipped") or ours.get("skipped"), "target": target}
    return common.goal(common.ratio(ours[key], base[key]), target)


def with_load(result: dict[str, Any], before: float) -> dict[str, Any]:
    """Note the 1-minute load average around a measurement: others share these 2 cores."""
    result["loadavg_before_after"] = [round(before, 2), round(os.getloadavg()[0], 2)]
    return result


def measured(label: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one measurement, note the load around it, print it."""
    load = os.getloadavg()[0]
    result = with_load(fn(*args, **kwargs), load)
    print(f"{label}: {result}", flush=True)
    return result


def skipped(reason: str | None) -> Any:
    return lambda *args, **kwargs: {"skipped": reason}


def single_stream_llamacpp(llamacpp: dict[str, Any], count: int) -> dict[str, Any]:
    """llama-cpp-python serves every request alone anyway: its first `count` requests."""
    if "per_request" not in llamacpp:
        return {"skipped": llamacpp.get("skipped")}
    return single_stream.summary(llamacpp.pop("per_request")[:count])


def decode64(args: argparse.Namespace, items: list, weights: str, skip: str | None) -> dict:
    if args.skip_decode64:
        return {"skipped": "skipped by flag"}
    import torch

    torch.set_num_threads(args.threads)  # transformers and the matmul peak run in this process
    timed_steps = 12 if args.quick else 24
    peaks_before = common.matmul_peaks()
    d_ours = (skipped(skip) if skip else decode64_ours)(
        items, timed_steps, args.threads, weights, args.model
    )
    d_hf = decode64_transformers(items, timed_steps, args.model)
    peaks_after = common.matmul_peaks()  # best of two: the machine is shared
    peaks = {k: max(v, peaks_after[k]) for k, v in peaks_before.items()}
    peak = max(peaks.values())
    share_ours = None if skip else round(peak_share(d_ours, peak, args.model), 3)
    share_hf = round(peak_share(d_hf, peak, args.model), 3)
    print(f"decode@64 peak share: ours {share_ours}, transformers {share_hf}, peak {peak:.0f}")
    return {
        "matmul_peak_gflops": round(peak, 1),
        "matmul_peaks_gflops": peaks,
        "ours": d_ours,
        "transformers": d_hf,
        "ours_peak_share": share_ours,
        "transformers_peak_share": share_hf,
        "goal": common.goal(share_ours, GOALS["decode64_peak_share"]),
    }


def main() -> None:
    args = parse_args()
    formats = args.weights.split(",")
    dtypes = args.vllm_dtypes.split(",") if args.vllm_dtypes else []
    items = workload(args.quick, args.requests, args.model)
    stream_items = items[: args.single_stream]
    # Installs first (they can take long): the timed runs then have the CPU to themselves.
    venvs = {
        "llamacpp": venv_or_skip("llamacpp", args.skip_llamacpp, args.no_install),
        "vllm": venv_or_skip("vllm", args.skip_vllm or not dtypes, args.no_install),
    }
    reason = ed.engine_available()
    ours_fn = skipped(reason) if reason else run_ours
    single_fn = skipped(reason) if reason else single_stream.run_ours
    ours = {
        w: measured(f"ours {w}", ours_fn, items, args.threads, args.repeats, w, args.model)
        for w in formats
    }
    hf_fn = skipped("skipped by flag") if args.skip_transformers else run_transformers
    hf = measured("transformers static batch 32", hf_fn, items, args.model)
    lcpp_args = (items, venvs["llamacpp"], args.threads, args.model)
    llamacpp = measured("llama-cpp-python sequential", run_llamacpp, *lcpp_args)
    vllm = {
        dtype: measured(
            f"vLLM CPU {dtype}",
            run_vllm,
            items,
            venvs["vllm"],
            args.threads,
            args.repeats,
            model=args.model,
            dtype=dtype,
        )
        for dtype in dtypes
    }
    single = {"llamacpp": single_stream_llamacpp(llamacpp, len(stream_items))}
    if stream_items:
        for w in formats:
            label = f"single stream ours {w}"
            single[w] = measured(label, single_fn, stream_items, args.model, args.threads, w)
    goals = {
        w: {
            "vs_transformers": compare(ours[w], hf, GOALS["vs_transformers"]),
            "vs_llamacpp": compare(ours[w], llamacpp, GOALS["vs_llamacpp"]),
            "vs_vllm_best_dtype": compare_best(ours[w], vllm, GOALS["vs_vllm"]),
            "single_stream_vs_llamacpp": compare_single(
                single.get(w, {"skipped": "--single-stream 0"}),
                single["llamacpp"],
                GOALS["single_stream_vs_llamacpp"],
            ),
        }
        for w in formats
    }
    result = {
        "workload": {
            "model": args.model,
            "requests": len(items),
            "prompt_tokens": [len(i.prompt_ids) for i in items],
            "output_tokens": [i.output_tokens for i in items],
            "quick": args.quick,
            "threads": args.threads,
            "repeats_ours_and_vllm": args.repeats,
            "our_weights": formats,
            "vllm_dtypes": dtypes,
            "single_stream_requests": len(stream_items),
        },
        "ours": ours[formats[0]],  # what capacity.py reads
        "ours_by_weights": ours,
        "baselines": {"transformers_static32": hf, "llamacpp_sequential": llamacpp, "vllm": vllm},
        "single_stream": single,
        "goals_by_weights": goals,
        "decode64": decode64(args, items, formats[0], reason),
        "venvs": venvs,
        "command": " ".join(["python -m bench.throughput", *sys.argv[1:]]),
    }
    # flat, for run.py's goal table: the first format's
    result["goals"] = {**goals[formats[0]], "decode64_peak_share": result["decode64"].get("goal")}
    for w, g in goals.items():
        for key, value in g.items():
            print(f"{w} {key}: {value}")
    name = "throughput" if formats == ["fp32"] else f"throughput_{'_'.join(formats)}"
    name += "" if args.model == common.MODEL else f"_{args.model}"
    common.write_result(name, result)


if __name__ == "__main__":
    sys.exit(main())
