"""Our GEMM kernels against torch's oneDNN candidates (engine/quantization/onednn.py), all
in one run, on the bundled models' projection shapes (q|k|v, o, gate|up, down; random
values: the shapes decide the time, tests/test_onednn_gemm.py checks the values) at 1, 8,
32, 128 and 512 rows, one thread: bf16 panels vs oneDNN bf16 (F.linear, prepacked
mkldnn linear), w8a8 panels vs torch._int_mm. Then a short engine throughput check, same
run: the engine with the oneDNN candidates offered (TIERGATE_ONEDNN=1) vs left out (0);
and SmolLM2's perplexity with each candidate forced to win (what an AMX CPU may pick).

oneDNN runs these on AMX tiles where the CPU has them; the AMX figures are to be taken on
an AMX CPU (the machine's flags are in the JSON). speedup = our panels' time / oneDNN's.
"""

import argparse
import functools
import os
import random
from typing import Any

from bench import common
from bench import engine_driver as ed

ROWS = (1, 8, 32, 128, 512)
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """Each projection's [N, K] (the LM head is left out: prefill multiplies few rows by it)."""
    d = ed.model_dims(model)
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    return {
        "qkv": (q + 2 * kv, d.hidden),
        "o": (d.hidden, q),
        "gate_up": (2 * d.intermediate, d.hidden),
        "down": (d.hidden, d.intermediate),
    }


def time_shape(n: int, k: int, rows: tuple[int, ...]) -> dict[str, Any]:
    """Microseconds per call of each path, per format and row count."""
    import torch

    from engine import native
    from engine.ops import NativeOps
    from engine.quantization import kernel_choice, onednn
    from engine.quantization.matmuls import _gemm

    weight = torch.randn(n, k) / k**0.5
    out: dict[str, Any] = {}
    for fmt in ("bf16", "w8a8"):
        method = NativeOps(native.kernels(), fmt).methods[fmt]
        panels = method.panels(weight, None)
        paths = {f"panels_{method.path}": functools.partial(_gemm, method, w=panels)}
        paths |= {name: gemm for name, gemm in onednn.candidates(fmt, weight, 32).items()}
        per_rows = {}
        for m in rows:
            x = torch.randn(m, k)
            us = {
                name: round(kernel_choice.seconds_per_call(functools.partial(fn, x)) * 1e6, 1)
                for name, fn in paths.items()
            }
            ours = min(v for name, v in us.items() if name.startswith("panels"))
            best = min((v for name, v in us.items() if not name.startswith("panels")), default=0)
            speedup = common.ratio(ours, best)
            per_rows[m] = {"us": us, "onednn_best_speedup": speedup}
        out[fmt] = per_rows
    return out


def gemm_table(models: tuple[str, ...], rows: tuple[int, ...]) -> dict[str, Any]:
    table = {}
    for model in models:
        for name, (n, k) in shapes(model).items():
            key = f"{model}:{name}:{n}x{k}"
            table[key] = time_shape(n, k, rows)
            for fmt, per in table[key].items():
                line = " ".join(f"{m}:{v['onednn_best_speedup']}x" for m, v in per.items())
                print(f"{key} {fmt} oneDNN/ours speedup per rows: {line}", flush=True)
    return table


def _engine(weights: str, setting: str) -> Any:
    os.environ["TIERGATE_ONEDNN"] = setting  # read as the weights are packed
    engine = ed.make_engine(
        model=ed.MODEL, weights=weights, num_threads=1, kv_cache_bytes=256 << 20
    )
    info = engine.runner.kernel_info()
    return engine, info["measured"]


def throughput(weights: str, requests: int, prompt: int, out: int, rounds: int) -> dict:
    """Output tokens/s (prefill included) of one workload, candidates on vs off, alternating
    (on: TIERGATE_ONEDNN=int8 for w8a8, whose int_mm is opt-in; 1 for bf16)."""
    rng = random.Random(0)
    on_setting = "int8" if weights == "w8a8" else "1"
    engines = {on: _engine(weights, on_setting if on else "0") for on in (True, False)}
    vocab = ed.model_dims(ed.MODEL).vocab
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for on, (engine, _) in engines.items():
            ids = [[rng.randrange(vocab) for _ in range(prompt)] for _ in range(requests)]
            ed.warm_up(engine, ids[0][:8])
            stats = ed.run_requests(engine, ids, [out] * requests, prefix=f"{on}{r}-")
            rates[on].append(round(stats.output_tokens_per_s, 2))
    on, off = (common.median(rates[x]) for x in (True, False))
    print(f"engine {weights}: candidates on {on:.1f} tok/s, off {off:.1f} tok/s", flush=True)
    return {
        "weights": weights,
        "setting_on": on_setting,
        "workload": {"requests": requests, "prompt_tokens": prompt, "output_tokens": out},
        "tokens_per_s": {"onednn_on": rates[True], "onednn_off": rates[False]},
        "ratio_on_vs_off": common.ratio(on, off),
        "measured_on": engines[True][1],
        "measured_off": engines[False][1],
    }


def forced_quality(chars: int) -> dict[str, Any]:
    """SmolLM2 perplexity (bench/precision.py's text and windows: 512-row prefills) with
    each candidate made to win every row class it competes in, as an AMX CPU's measurement
    may decide, against the panels (candidates left out) and fp32, same run. The forced
    decisions go to a scratch choice file, never this CPU's."""
    import tempfile
    from pathlib import Path

    from bench import precision
    from engine.quantization import kernel_choice

    cases = {"fp32": ("fp32", "0", None), "bf16": ("bf16", "0", None)}
    cases |= {"bf16_mkldnn_bf16": ("bf16", "1", "mkldnn_bf16")}
    cases |= {"bf16_onednn_bf16": ("bf16", "1", "onednn_bf16")}
    cases |= {"w8a8": ("w8a8", "0", None), "w8a8_int_mm": ("w8a8", "int8", "int_mm")}
    saved = kernel_choice.choice_file, kernel_choice.seconds_per_call
    out: dict[str, Any] = {}
    ids: list[int] = []
    try:
        for name, (weights, setting, winner) in cases.items():
            scratch = Path(tempfile.mkdtemp()) / "choices.json"
            kernel_choice.choice_file = lambda scratch=scratch: scratch
            kernel_choice.seconds_per_call = functools.partial(_forced, winner, saved[1])
            engine, measured = _engine(weights, setting)
            ids = ids or engine.tokenizer.encode(precision.ppl_text(chars))
            ppl, _ = precision.perplexity(engine.runner, ids)
            out[name] = {"perplexity": round(ppl, 4), "measured": measured}
            print(f"forced {name}: perplexity {ppl:.4f} ({measured})", flush=True)
    finally:
        kernel_choice.choice_file, kernel_choice.seconds_per_call = saved
    for q in out.values():
        q["vs_fp32"] = round(q["perplexity"] / out["fp32"]["perplexity"] - 1, 5)
    return {"text_chars": chars, "tokens": len(ids), "perplexity": out}


def _forced(winner: str | None, real: Any, fn: Any) -> float:
    """A row-class candidate's cost: 0 for the forced winner, 1 for the rest (other
    measurements, the format choice and bandwidth, stay real)."""
    name = getattr(fn.func, "name", None) if isinstance(fn, functools.partial) else None
    return real(fn) if name is None else (0.0 if name == winner else 1.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="SmolLM2's shapes only, shorter run")
    args = p.parse_args()
    import torch

    from engine.cpu_features import cpu_features

    torch.set_num_threads(1)
    os.environ["TIERGATE_ONEDNN"] = "int8"  # every candidate in the table, int_mm included
    models = MODELS[:1] if args.quick else MODELS
    table = gemm_table(models, ROWS)
    rounds, requests = (2, 8) if args.quick else (3, 16)
    engine = [throughput(w, requests, 192, 32, rounds) for w in ("w8a8", "bf16")]
    quality = forced_quality(4000 if args.quick else 8000)
    common.write_result(
        "amx_gemm",
        {
            "cpu_features": cpu_features(),
            "amx": cpu_features()["amx"],
            "threads": 1,
            "quick": args.quick,
            "gemm": table,
            "engine_throughput": engine,
            "forced_quality": quality,
            "note": "AMX figures are to be taken on an AMX CPU; without AMX oneDNN has no tiles",
        },
    )


if __name__ == "__main__":
    main()
