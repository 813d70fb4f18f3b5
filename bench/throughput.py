"""Output tokens/s of our engine on 32 concurrent ShareGPT-like chat requests, vs baselines.

Baselines, measured in the same run on the same weights and the same token ids:
  (a) transformers generate, static padded batches of 32 (goal: ours >= 2x);
  (b) llama-cpp-python on the same GGUF, one request after another (goal: >= 3x);
  (c) vLLM's CPU build on an HF folder converted from the GGUF, float32 (goal: >= 1.2x).
Plus decode at batch 64 as a share of this machine's fp32 matmul peak (goal: >= 50%), with
transformers' own batch-64 decode step as its same-run reference.

Every engine generates exactly each request's token count (EOS barred), so tokens/s compare
the same work. Start-up and weight loading are excluded from every timing (and recorded).
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import engine_driver as ed
from hf_folder import ensure_hf_folder

GOALS = {"vs_transformers": 2.0, "vs_llamacpp": 3.0, "vs_vllm": 1.2, "decode64_peak_share": 0.5}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="outputs <= 64 tokens, shorter prompts")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--skip-llamacpp", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--no-install", action="store_true", help="skip baselines not installed yet")
    p.add_argument(
        "--weights",
        default="fp32",
        help="our engine's weight format (fp32, bf16, int8, w8a8, auto); not fp32: the result"
        " is written as throughput_<weights>.json",
    )
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


def workload(quick: bool, count: int) -> list[common.ChatItem]:
    tokenizer = common.load_tokenizer()
    max_out, max_prompt = (64, 256) if quick else (256, 512)
    return common.sharegpt_workload(
        tokenizer, count, max_prompt_tokens=max_prompt, max_output=max_out, seed=1
    )


def useful_tokens(items: list[common.ChatItem]) -> int:
    return sum(i.output_tokens for i in items)


# ---------------------------------------------------------------- ours


def run_ours(
    items: list[common.ChatItem], threads: int, repeats: int, weights: str = "fp32"
) -> dict[str, Any]:
    """The workload `repeats` times, each on a fresh engine (no prefix-cache carry-over);
    tokens_per_s is the median run."""
    dims = ed.model_dims()
    # Room for every request at its full length: this measures batching, not preemption.
    slots = sum(len(i.prompt_ids) + i.output_tokens for i in items) * 5 // 4
    runs = []
    for _ in range(repeats):
        engine = ed.make_engine(
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
    return median_run(stats.output_tokens, runs)


def median_run(output_tokens: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A result whose seconds and tokens_per_s are the median run's (every run kept)."""
    seconds = statistics.median(r["seconds"] for r in runs)
    out = {
        "output_tokens": output_tokens,
        "seconds": seconds,
        "tokens_per_s": round(output_tokens / seconds, 1),
        "runs_tokens_per_s": [round(output_tokens / r["seconds"], 1) for r in runs],
    }
    if all("cpu_s" in r for r in runs):
        # Output tokens per CPU-second: per core, and steadier than tokens/s on a shared
        # machine, where other processes' load stretches the wall clock.
        cpu = statistics.median(r["cpu_s"] for r in runs)
        out["tokens_per_cpu_s"] = round(output_tokens / cpu, 1)
    return out


def decode64_ours(
    items: list[common.ChatItem], timed_steps: int, threads: int, weights: str = "fp32"
) -> dict[str, Any]:
    prompts = batch64_prompts(items)
    dims = ed.model_dims()
    kv_bytes = 64 * 256 * dims.kv_bytes_per_token
    engine = ed.make_engine(
        kv_cache_bytes=kv_bytes, max_num_seqs=64, num_threads=threads, weights=weights
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


def load_transformers() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ensure_hf_folder(), dtype="float32").eval()


def run_transformers(items: list[common.ChatItem], batch: int = 32) -> dict[str, Any]:
    """Static batches: left-padded, each runs until its longest request is done."""
    model = load_transformers()
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


def decode64_transformers(items: list[common.ChatItem], timed_steps: int) -> dict[str, Any]:
    """transformers' batched decode step at batch 64 (KV cache on): the same-run reference."""
    import torch

    model = load_transformers()
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


# ---------------------------------------------------------------- venv baselines


def run_in_venv(venv: common.Venv, script: str, job: dict[str, Any], timeout: int) -> dict:
    """Run a baseline worker in its own venv; it prints 'RESULT {json}' as its last word."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    cmd = [str(venv.python), str(Path(__file__).parent / script), f.name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"{script} ran past {timeout} s"}
    finally:
        Path(f.name).unlink(missing_ok=True)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            if "runs_seconds" in result:  # repeated: report the median run, keep them all
                runs = [{"seconds": x} for x in result.pop("runs_seconds")]
                return {**result, **median_run(result["output_tokens"], runs)}
            result["tokens_per_s"] = result["output_tokens"] / result["seconds"]
            return result
    tail = (done.stderr or done.stdout)[-1500:]
    return {"skipped": f"{script} failed (rc {done.returncode}): {tail}"}


def venv_or_skip(name: str, skip: bool, no_install: bool) -> common.Venv:
    if skip:
        return common.skipped_venv(name, "skipped by flag")
    marker = common.VENVS_DIR / name / ".tiergate-installed.json"
    if no_install and not marker.is_file():
        return common.skipped_venv(name, "not installed and --no-install given")
    return common.ensure_venv(name)


def job_items(items: list[common.ChatItem]) -> list[dict[str, Any]]:
    return [{"prompt_ids": i.prompt_ids, "output_tokens": i.output_tokens} for i in items]


def run_llamacpp(items: list[common.ChatItem], venv: common.Venv, threads: int) -> dict[str, Any]:
    if venv.python is None:
        return {"skipped": venv.skipped}
    from engine.model_registry import resolve_model

    gguf = str(resolve_model(common.MODEL).path)
    job = {"gguf": gguf, "items": job_items(items), "threads": threads}  # probes 1..threads
    return run_in_venv(venv, "baseline_llamacpp.py", job, timeout=1800)


def run_vllm(
    items: list[common.ChatItem], venv: common.Venv, threads: int, repeats: int
) -> dict[str, Any]:
    if venv.python is None:
        return {"skipped": venv.skipped}
    job = {"hf_folder": str(ensure_hf_folder()), "items": job_items(items), "kv_gib": 2}
    job["threads"], job["repeats"] = threads, repeats
    return run_in_venv(venv, "baseline_vllm.py", job, timeout=1800)


# ---------------------------------------------------------------- report


def peak_share(decode: dict[str, Any], peak_gflops: float) -> float:
    flops = ed.model_dims().flops_per_token(decode["mean_context"])
    return decode["tokens_per_s"] * flops / 1e9 / peak_gflops


def compare(ours: dict[str, Any], base: dict[str, Any], target: float) -> dict[str, Any]:
    if "tokens_per_s" not in ours or "tokens_per_s" not in base:
        return {"skipped": base.get("skipped") or ours.get("skipped"), "target": target}
    return common.goal(common.ratio(ours["tokens_per_s"], base["tokens_per_s"]), target)


def with_load(result: dict[str, Any], before: float) -> dict[str, Any]:
    """Note the 1-minute load average around a measurement: others share these 2 cores."""
    result["loadavg_before_after"] = [round(before, 2), round(os.getloadavg()[0], 2)]
    return result


def main() -> None:
    args = parse_args()
    items = workload(args.quick, args.requests)
    timed_steps = 12 if args.quick else 24
    # Installs first (they can take long): the timed runs then have the CPU to themselves.
    venvs = {
        "llamacpp": venv_or_skip("llamacpp", args.skip_llamacpp, args.no_install),
        "vllm": venv_or_skip("vllm", args.skip_vllm, args.no_install),
    }
    import torch

    torch.set_num_threads(args.threads)  # transformers and the matmul peak run in this process
    peaks_before = common.matmul_peaks()
    reason = ed.engine_available()
    load = os.getloadavg()[0]
    ours_run = (
        {"skipped": reason} if reason else run_ours(items, args.threads, args.repeats, args.weights)
    )
    ours = with_load(ours_run, load)
    print(f"ours: {ours}", flush=True)
    load = os.getloadavg()[0]
    skip_hf = {"skipped": "skipped by flag"}
    hf = with_load(skip_hf if args.skip_transformers else run_transformers(items), load)
    print(f"transformers static batch 32: {hf}", flush=True)
    load = os.getloadavg()[0]
    llamacpp = with_load(run_llamacpp(items, venvs["llamacpp"], args.threads), load)
    print(f"llama-cpp-python sequential: {llamacpp}", flush=True)
    load = os.getloadavg()[0]
    vllm = with_load(run_vllm(items, venvs["vllm"], args.threads, args.repeats), load)
    print(f"vLLM CPU: {vllm}", flush=True)
    d_ours = (
        {"skipped": reason}
        if reason
        else decode64_ours(items, timed_steps, args.threads, args.weights)
    )
    d_hf = decode64_transformers(items, timed_steps)
    peaks_after = common.matmul_peaks()  # best of two: the machine is shared
    peaks = {k: max(v, peaks_after[k]) for k, v in peaks_before.items()}
    peak = max(peaks.values())
    share_ours = None if reason else round(peak_share(d_ours, peak), 3)
    share_hf = round(peak_share(d_hf, peak), 3)
    result = {
        "workload": {
            "requests": len(items),
            "prompt_tokens": [len(i.prompt_ids) for i in items],
            "output_tokens": [i.output_tokens for i in items],
            "quick": args.quick,
            "threads": args.threads,
            "repeats_ours_and_vllm": args.repeats,
            "our_weights": args.weights,
        },
        "ours": ours,
        "baselines": {"transformers_static32": hf, "llamacpp_sequential": llamacpp, "vllm": vllm},
        "goals": {
            "vs_transformers": compare(ours, hf, GOALS["vs_transformers"]),
            "vs_llamacpp": compare(ours, llamacpp, GOALS["vs_llamacpp"]),
            "vs_vllm": compare(ours, vllm, GOALS["vs_vllm"]),
            "decode64_peak_share": common.goal(share_ours, GOALS["decode64_peak_share"]),
        },
        "decode64": {
            "matmul_peak_gflops": round(peak, 1),
            "matmul_peaks_gflops": peaks,
            "ours": d_ours,
            "transformers": d_hf,
            "ours_peak_share": share_ours,
            "transformers_peak_share": share_hf,
        },
        "venvs": venvs,
    }
    for key, g in result["goals"].items():
        print(f"{key}: {g}")
    print(f"decode@64 peak share: ours {share_ours}, transformers {share_hf}, peak {peak:.0f}")
    print(f"matmul peaks (GFLOP/s): {peaks}")
    name = "throughput" if args.weights == "fp32" else f"throughput_{args.weights}"
    common.write_result(name, result)


if __name__ == "__main__":
    sys.exit(main())
