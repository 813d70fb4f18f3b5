"""Weight formats of our engine (fp32, bf16, int8, w8a8, auto; blocks with --formats) on
SmolLM2-135M, all in one run.

Quality: perplexity on a fixed slice of Python's own `pydoc_data.topics` text (offline,
the same bytes on every machine with the same Python), teacher-forced top-1 agreement
with fp32 over that text, and greedy agreement with fp32 over a fixed prompt set (32
tokens each). Bound: bf16, int8 and w8a8 (int8 activations too) <= +0.5% perplexity.
Speed: decode tokens/s at one stream and at batch 32 (decode-only steps, median step),
the formats alternating round by round so a neighbour's burst hits both alike; and the
GEMM alone on the LM head's shape. Memory and start-up: each format in a fresh process,
engine build time (the fp32 weight cache warm) and RSS, and the bytes the model holds.
`--formats ...,blocks_no_q6_k,blocks` measures `blocks` as it was before Q6_K records (a
Q6_K tensor w8a8, a Q6_K part of a fused weight Q8_0) beside today's, in the same run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench import engine_driver as ed

FORMATS = ("fp32", "bf16", "int8", "w8a8", "auto")
NO_Q6_K = "blocks_no_q6_k"  # blocks without the Q6_K record type (the baseline it replaced)
PPL_WINDOW = 512
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Photosynthesis is the process by which",
    "import numpy as np\n\n# compute the mean of a list\n",
    "The three laws of motion state that",
    "SELECT name, COUNT(*) FROM users",
    "Once upon a time, in a small village,",
    "To install a Python package, run",
]


def ppl_text(chars: int) -> str:
    """The first `chars` characters of pydoc's topics, in sorted key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:chars]


def model_bytes(model: Any) -> int:
    """Bytes the model's tensors hold (each storage once): parameters, packed weights."""
    import torch

    from engine.quantization.block_weights import BlockWeight
    from engine.quantization.quant import Int8Weight

    def parts(w: Any) -> list[Any]:
        if isinstance(w, Int8Weight):
            return [w.q, w.scale]
        return [w.data, w.panels] if isinstance(w, BlockWeight) else [w]

    tensors = [p for p in model.parameters()]
    for m in model.modules():
        tensors += parts(getattr(m, "packed", None))
    tensors += parts(model.packed_head)
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def make_engine(model: str, weights: str, threads: int, kv_bytes: int) -> Any:
    """ed.make_engine; NO_Q6_K builds blocks as if the file's Q6_K tensors were of a type
    with no record (their own records cache file), as blocks did before Q6_K records."""
    if weights != NO_Q6_K:
        return ed.make_engine(
            model=model, kv_cache_bytes=kv_bytes, weights=weights, num_threads=threads
        )
    from gguf import GGMLQuantizationType

    from engine import weights as loader

    saved = loader.FILE_TYPES, loader.RECORDS_VERSION
    loader.FILE_TYPES = {t: k for t, k in saved[0].items() if t != GGMLQuantizationType.Q6_K}
    loader.RECORDS_VERSION = f"{saved[1]}-no-q6k"
    try:
        return make_engine(model, "blocks", threads, kv_bytes)
    finally:
        loader.FILE_TYPES, loader.RECORDS_VERSION = saved


def prefill_logits(runner: Any, x: list[int]) -> Any:
    """Logits after each of x's tokens (at most PPL_WINDOW), x prefilled at once from
    position 0 into the runner's first pages (an engine with no requests running)."""
    import torch

    from engine.attention import build_context
    from engine.batch import SeqChunk

    pages = list(range(PPL_WINDOW // runner.page_size))
    chunk = SeqChunk(0, x, 0, pages, True, ed.greedy(1))
    with torch.inference_mode():
        ctx = build_context([chunk], runner.page_size, kernels=runner.ops.kernels)
        hidden = runner.model(torch.tensor(x), torch.arange(len(x)), ctx, runner.kv_caches)
        return runner.model.compute_logits(hidden)


def perplexity(runner: Any, ids: list[int]) -> tuple[float, list[int]]:
    """exp(mean NLL) over windows of PPL_WINDOW tokens, and each position's top-1 token."""
    import torch

    nll, count, top1 = 0.0, 0, []
    for start in range(0, len(ids) - 1, PPL_WINDOW):
        window = ids[start : start + PPL_WINDOW + 1]
        logits, y = prefill_logits(runner, window[:-1]), torch.tensor(window[1:])
        nll += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
        count += len(y)
        top1 += logits.argmax(-1).tolist()
    return float(torch.tensor(nll / count).exp()), top1


def greedy_tokens(engine: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    for i, ids in enumerate(prompts):
        engine.add_request(f"g{i}", ids, ed.greedy(n))
    out: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.token_ids)
    return [out[f"g{i}"] for i in range(len(prompts))]


def gemm_seconds(ops: Any, packed: Any, rows: int, k: int, seconds: float = 1.0) -> float:
    """Best time of one matmul x [rows, k] @ packed."""
    import torch

    x = torch.randn(rows, k)
    best, deadline = float("inf"), time.perf_counter() + seconds
    ops.linear(x, packed)
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        ops.linear(x, packed)
        best = min(best, time.perf_counter() - start)
    return best


def child(model: str, weights: str, threads: int) -> dict[str, Any]:
    """In a fresh process: build time and resident memory of one format."""
    import torch

    torch.set_num_threads(threads)
    before = common_rss()
    start = time.perf_counter()
    engine = make_engine(model, weights, threads, 16 << 20)
    build_s = time.perf_counter() - start
    return {
        "build_s": round(build_s, 2),
        "rss_growth_mib": round(common_rss() - before, 1),
        "model_mib": round(model_bytes(engine.runner.model) / 2**20, 1),
        "kernels": engine.runner.kernel_info(),
    }


def common_rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_child(model: str, weights: str, threads: int, cold: bool = False) -> dict[str, Any]:
    """One format's build in a fresh process; cold: with an empty cache folder (weights
    converted, kernels compiled and kernel choices measured again, as a first start)."""
    call = f"precision.child({model!r}, {weights!r}, {threads})"
    code = f"import json; from bench import precision; print('RESULT ' + json.dumps({call}))"
    with tempfile.TemporaryDirectory() as empty:
        env = os.environ | ({"TIERGATE_CACHE_DIR": empty} if cold else {})
        run = [sys.executable, "-c", code]  # from the root: `-c` puts it first, `bench` imports
        done = subprocess.run(run, capture_output=True, text=True, env=env, cwd=common.ROOT)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"child failed (rc {done.returncode}): {done.stderr[-2000:]}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ppl-chars", type=int, default=8000, help="pydoc topics slice (chars)")
    p.add_argument("--rounds", type=int, default=3, help="alternating speed rounds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-batch32", action="store_true")
    p.add_argument("--model", default=common.MODEL, help="bundled name, .gguf or HF folder")
    p.add_argument("--quality-only", action="store_true", help="no speed, GEMM or memory runs")
    p.add_argument("--quick", action="store_true", help="(bench/run.py) fewer speed rounds")
    p.add_argument("--memory-only", action="store_true", help="build time and memory only")
    p.add_argument("--skip-memory", action="store_true", help="no build-time / memory runs")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated; fp32 first")
    p.add_argument("--result", help="bench/results/RESULT.json (default: precision[_MODEL])")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    args.formats = args.formats.split(",")
    import torch

    torch.set_num_threads(args.threads)
    if args.quick:
        args.rounds = min(args.rounds, 2)
    skip = args.quality_only
    memory = {} if skip or args.skip_memory else measure_memory(args)
    if args.memory_only:
        return print(json.dumps(memory, indent=2))
    engines = {w: make_engine(args.model, w, args.threads, 160 << 20) for w in args.formats}
    tok = engines["fp32"].tokenizer
    ids = tok.encode(ppl_text(args.ppl_chars))
    quality: dict[str, Any] = {}
    for w, e in engines.items():
        ppl, top1 = perplexity(e.runner, ids)
        quality[w] = {"perplexity": round(ppl, 4), "top1": top1}
    prompts = [tok.encode(p) for p in PROMPTS]
    greedy = {w: greedy_tokens(e, prompts, 32) for w, e in engines.items()}
    ref_top1 = quality["fp32"]["top1"]
    for w in args.formats:
        top1 = quality[w].pop("top1")
        same = [a == b for a, b in zip(greedy[w], greedy["fp32"], strict=True)]
        prefix = [common_prefix(a, b) for a, b in zip(greedy[w], greedy["fp32"], strict=True)]
        quality[w] |= {
            "ppl_vs_fp32": round(quality[w]["perplexity"] / quality["fp32"]["perplexity"] - 1, 5),
            "teacher_forced_top1_agreement": round(
                sum(a == b for a, b in zip(top1, ref_top1, strict=True)) / len(ref_top1), 4
            ),
            "greedy_identical_prompts": f"{sum(same)}/{len(same)}",
            "greedy_mean_common_prefix_tokens": round(sum(prefix) / len(prefix), 2),
        }
    speed = {} if skip else measure_speed(engines, prompts, args)
    gemm = {} if skip else measure_gemm(engines)
    fp32 = quality["fp32"]["perplexity"]
    goals = {
        f"{w}_ppl_increase_le_0.5pct": common.goal(
            quality[w]["perplexity"] / fp32 - 1, 0.005, False
        )
        for w in args.formats[1:]
    }
    payload = {
        "model": args.model,
        "cpu": common.cpu_model(),
        "threads": args.threads,
        "model_tensor_mib": {
            w: round(model_bytes(e.runner.model) / 2**20, 1) for w, e in engines.items()
        },
        "ppl_text": {"source": "pydoc_data.topics", "chars": args.ppl_chars, "tokens": len(ids)},
        "quality": quality,
        "speed": speed,
        "gemm_lm_head": gemm,
        "memory": memory,
        "goals": goals,
    }
    print(json.dumps(payload, indent=2))
    model = Path(args.model).name.removesuffix(".gguf")
    name = "precision" if args.model == common.MODEL else f"precision_{model}"
    name = args.result or name
    common.write_result(name, payload)


def measure_memory(args: Any) -> dict[str, Any]:
    """Per format: bytes held, RSS growth, and build time from a warm cache folder and
    from an empty one (the model's own cache files are not the format's; SmolLM2 is one
    GGUF, read where it lies)."""
    out = {}
    for w in args.formats:
        cached = run_child(args.model, w, args.threads)
        cold = run_child(args.model, w, args.threads, cold=True)
        out[w] = cached | {"build_s_cold": cold["build_s"]}
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure_speed(engines: dict[str, Any], prompts: list[list[int]], args: Any) -> dict[str, Any]:
    """Decode tokens/s per format and batch: the best of `rounds` alternating runs."""
    batches = {"single_stream": prompts[:1], "batch_32": (prompts * 4)[:32]}
    if args.skip_batch32:
        batches.pop("batch_32")
    rates: dict[str, dict[str, list[float]]] = {b: {w: [] for w in engines} for b in batches}
    for e in engines.values():
        ed.warm_up(e, prompts[0])
    for _ in range(args.rounds):
        for name, batch in batches.items():
            for w, e in engines.items():
                steps = 32 if len(batch) == 1 else 12
                rates[name][w].append(ed.decode_rate(e, batch, steps)["tokens_per_s"])
    out: dict[str, Any] = {}
    for name, per in rates.items():
        best = {w: round(max(r), 1) for w, r in per.items()}
        out[name] = {
            "tokens_per_s": best,
            "rounds": per,
        } | {f"{w}_vs_fp32": common.ratio(best[w], best["fp32"]) for w in list(per)[1:]}
    return out


def measure_gemm(engines: dict[str, Any]) -> dict[str, Any]:
    """One LM-head matmul (the largest weight) per format at 1 and 32 rows."""
    out: dict[str, Any] = {}
    for rows in (1, 32):
        times = {}
        for w, e in engines.items():
            head = e.runner.model.packed_head
            k = e.runner.model_config.hidden_size
            times[w] = gemm_seconds(e.runner.ops, head, rows, k)
        out[f"rows_{rows}"] = {
            "ms": {w: round(t * 1e3, 3) for w, t in times.items()},
        } | {f"{w}_speedup": round(times["fp32"] / times[w], 3) for w in list(times)[1:]}
    return out


if __name__ == "__main__":
    main()
