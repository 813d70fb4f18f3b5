"""One Q6_K weight of a bundled GGUF (Qwen2.5-Coder's first Q6_K ffn_down) as `blocks`
Q6_K records against what blocks used before them (w8a8 requantized from its fp32
values; Q8_0 records where it is part of a fused weight), all in one run: bytes, GEMM
time at 1 and 32 rows on each kernel path this CPU runs, one thread, and the records'
values against gguf's own Q6_K dequantization (equal: the file's).
"""

import argparse
import json
from typing import Any

from bench import common, precision

PATHS = {"vnni": ("avx512f", "avx512bw", "avx512_vnni"), "avx2": ("avx2", "fma"), "generic": ()}


def first_q6_k(model: str) -> tuple[str, Any]:
    from gguf import GGMLQuantizationType, GGUFReader

    from engine.model_registry import resolve_model

    for t in GGUFReader(resolve_model(model).path).tensors:
        if t.tensor_type == GGMLQuantizationType.Q6_K:
            return t.name, t
    raise SystemExit(f"{model} has no Q6_K tensor")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--seconds", type=float, default=1.0, help="per timing (best of)")
    args = p.parse_args()
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize

    from engine import native
    from engine.cpu_features import cpu_features
    from engine.ops import NativeOps
    from engine.quantization.block_weights import from_parts

    torch.set_num_threads(1)
    name, t = first_q6_k(args.model)
    raw = np.ascontiguousarray(np.asarray(t.data))  # [N, bytes per row]: gguf's orientation
    exact = dequantize(raw, QT.Q6_K)
    weight = torch.from_numpy(exact)
    n, k = weight.shape
    formats = {
        "q6_k_records": from_parts([(QT.Q6_K, raw)], [n], weight),
        "q8_0_records": from_parts([None], [n], weight),
    }
    assert np.array_equal(formats["q6_k_records"].dequantize().numpy(), exact)
    kernels = native.kernels()
    out: dict[str, Any] = {"tensor": name, "shape": [n, k], "ms": {}}
    for path, needs in PATHS.items():
        if not all(cpu_features()[f] for f in needs):
            continue
        packed = dict(formats)
        packed["w8a8"] = NativeOps(kernels, "w8a8", w8a8_path=path).pack_weight(weight, 1, None)
        ops = NativeOps(kernels, "blocks", w8a8_path=path)
        for rows in (1, 32):
            out["ms"][f"{path}_rows_{rows}"] = {
                f: round(precision.gemm_seconds(ops, w, rows, k, args.seconds) * 1e3, 3)
                for f, w in packed.items()
            }
    out["bits_per_weight"] = {
        "file": raw.size * 8 / (n * k),
        **{f: w.data.numel() * 8 / (n * k) for f, w in formats.items()},
        "w8a8": 9.0,  # int8 values and an fp32 scale per 32
    }
    payload = {"model": args.model, "cpu": common.cpu_model(), "threads": 1, **out}
    print(json.dumps(payload, indent=2))
    common.write_result("q6k_gemm", payload)


if __name__ == "__main__":
    main()
