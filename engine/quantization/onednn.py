"""torch's oneDNN GEMMs as kernel-choice candidates (engine/quantization/matmuls.py).

On a CPU with AMX, oneDNN runs bf16 and int8 GEMMs on the tiles, which our panel kernels
(no tiles) cannot match at prefill row counts (an AMX Xeon: oneDNN bf16 2-4.8x our best at
128-512 rows, 0.2-0.4x at one row). Elsewhere they mostly lose the measurement; which wins
is measured per shape and row count, never assumed. Candidates, per weight format:

- bf16: `onednn_bf16` (F.linear on a plain bf16 weight: oneDNN's bf16 matmul, reordering
  the weight per call) and `mkldnn_bf16` (the weight reordered once into oneDNN's blocked
  layout, torch.ops.mkldnn._linear_pointwise). x is rounded to bf16 as our avx512_bf16
  path does; unlike it, oneDNN rounds the output to bf16 too (then widened, bias in fp32).
- w8a8, opt-in (TIERGATE_ONEDNN=int8): `int_mm` (torch._int_mm, int8 x int8 -> int32)
  with one scale per output row of the weight and per row of x, since one GEMM over all of
  K cannot apply w8a8's per-32 scales. That is coarser: an activation outlier channel
  (x[:, 7] * 50) costs it 3.6% relative error where w8a8's groups keep 1.4%, and SmolLM2
  +4.0% perplexity where w8a8 has +0.31% (docs/engine.md), so a speed measurement alone
  must not swap it in under `weights: w8a8`.

A candidate's weight is built from the weight's fp32 values at load; only winners keep it.
TIERGATE_ONEDNN: "1" (default) the bf16 ones, "int8" int_mm too, "0" none.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.quantization.quant import quantize_int8

Bias = torch.Tensor | None
_MKLDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass(frozen=True)
class Gemm:
    """One candidate: its weight, prepared once, and x [M, K] @ w.T (+ bias) on it."""

    name: str
    weight: Any
    run: Callable[[torch.Tensor, Any, Bias], torch.Tensor]

    def __call__(self, x: torch.Tensor, bias: Bias = None) -> torch.Tensor:
        return self.run(x, self.weight, bias)


def setting() -> str:
    """TIERGATE_ONEDNN: "0", "1" or "int8" (anything else: "1")."""
    value = os.environ.get("TIERGATE_ONEDNN", "1")
    return value if value in ("0", "int8") else "1"


def bf16_supported() -> bool:
    return _MKLDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def names(fmt: str) -> tuple[str, ...]:
    """The candidates `candidates` offers for format fmt on this CPU and torch."""
    chosen = setting()
    if fmt == "bf16" and chosen != "0" and bf16_supported():
        return ("onednn_bf16", "mkldnn_bf16")
    return ("int_mm",) if fmt == "w8a8" and chosen == "int8" and hasattr(torch, "_int_mm") else ()


def candidates(fmt: str, weight: torch.Tensor, batch_hint: int) -> dict[str, Gemm]:
    """The oneDNN candidates for a weight [N, K] (fp32 values) packed in format fmt."""
    offered = names(fmt)
    if "mkldnn_bf16" in offered:
        w = weight.detach().to(torch.bfloat16).contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint)
        return {
            "onednn_bf16": Gemm("onednn_bf16", w, _bf16_linear),
            "mkldnn_bf16": Gemm("mkldnn_bf16", packed, _mkldnn_bf16),
        }
    if "int_mm" in offered:
        q = quantize_int8(weight)  # one scale per output row
        return {"int_mm": Gemm("int_mm", (q.q.t(), q.scale), _int_mm)}
    return {}


def _add_bias(out: torch.Tensor, bias: Bias) -> torch.Tensor:
    return out if bias is None else out.add_(bias)


def _bf16_linear(x: torch.Tensor, w: torch.Tensor, bias: Bias) -> torch.Tensor:
    return _add_bias(F.linear(x.to(torch.bfloat16), w).float(), bias)


def _mkldnn_bf16(x: torch.Tensor, w: torch.Tensor, bias: Bias) -> torch.Tensor:
    out = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), w, None, "none", [], "")
    return _add_bias(out.float(), bias)


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> int8 values and one fp32 scale per row (max |x| / 127, symmetric)."""
    x = x.float()
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.div(x, scale).round_().clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


def _int_mm(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor], bias: Bias) -> torch.Tensor:
    q_t, w_scale = w  # q_t: [K, N], the transposed view of the row-major [N, K] values
    xq, x_scale = quantize_per_row(x)
    out = torch._int_mm(xq, q_t).float().mul_(x_scale).mul_(w_scale)
    return _add_bias(out, bias)


def int_mm_reference(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor], bias: Bias):
    """What `int_mm` computes, in fp32: per-row quantized x times the per-row int8 weight."""
    q_t, w_scale = w
    xq, x_scale = quantize_per_row(x)
    return F.linear(xq.float() * x_scale, q_t.t().float() * w_scale[:, None], bias)
