"""Weight layouts the matmul kernels read: panels of 16 output columns per format (fp32
[N / 16, K, 16]; bf16 [N / 16, K / 2, 16, 2]; int8 and w8a8 in engine/quantization/quant.py), how to
build the bf16 ones, and how to tell them apart and read them back."""

import torch

from engine.quantization.block_weights import BlockWeight
from engine.quantization.quant import Int8Weight

PANEL = 16  # output columns per panel; gemm.c takes them in pairs
Weight = torch.Tensor | Int8Weight | BlockWeight  # what Matmuls.pack_weight returns


def is_panels(weight: Weight | None) -> bool:
    """True for weights in the C GEMM's panels (fp32 [N / 16, K, 16], bf16 [N / 16, K / 2,
    16, 2], or int8 panels)."""
    if isinstance(weight, (Int8Weight, BlockWeight)):
        return weight.is_panels
    return weight is not None and weight.dim() == (4 if is_bf16(weight) else 3)


def is_bf16(weight: Weight) -> bool:
    return isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16


def bf16_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] rounded to bf16 (to nearest even), as [N / 16, K / 2, 16, 2]."""
    n, k = weight.shape
    w = weight.detach().to(torch.bfloat16).view(n // PANEL, PANEL, k // 2, 2)
    return w.permute(0, 2, 1, 3).contiguous()


def unpack_panels(panels: torch.Tensor) -> torch.Tensor:
    """The plain fp32 [N, K] weight back from NativeOps.pack_weight's fp32 or bf16 panels
    (exact: a re-layout, and bf16 widened)."""
    if is_bf16(panels):
        p, k2 = panels.shape[:2]
        return panels.permute(0, 2, 1, 3).reshape(p * PANEL, k2 * 2).float()
    return panels.transpose(1, 2).reshape(panels.shape[0] * PANEL, panels.shape[1])


def weight_format(weight: Weight) -> str:
    if isinstance(weight, BlockWeight):
        return "blocks"
    if isinstance(weight, Int8Weight):
        return "w8a8" if weight.group else "int8"
    return "bf16" if is_bf16(weight) else "fp32"


def plain_shape(panels: Weight) -> tuple[int, int]:
    """[N, K] of a weight in panels (fp32, int8 or w8a8)."""
    if isinstance(panels, (Int8Weight, BlockWeight)):
        return panels.shape
    if is_bf16(panels):
        return panels.shape[0] * PANEL, panels.shape[1] * 2
    return panels.shape[0] * PANEL, panels.shape[1]
