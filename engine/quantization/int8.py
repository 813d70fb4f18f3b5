"""int8 weights, one scale per output row (engine/quantization/quant.py): gemm_int8.c's
panels, on the path the CPU's features allow; the torch reference multiplies the
dequantized weight in fp32."""

from typing import ClassVar

import torch
import torch.nn.functional as F

from engine.cpu_features import cpu_features
from engine.quantization.method import LinearMethod
from engine.quantization.packing import PANEL, Weight
from engine.quantization.quant import quantize_int8


def int8_path(features: dict[str, bool]) -> str:
    """The int8 GEMM path for these features: "avx512", "avx2" or "torch" (the reference)."""
    if features["avx512f"]:
        return "avx512"
    if features["avx2"] and features["fma"]:
        return "avx2"
    return "torch"


class Int8(LinearMethod):
    name = "int8"
    kernel = "gemm_int8_panels"  # its path argument:
    paths: ClassVar[dict[str, int]] = {"generic": 0, "avx2": 1, "avx512": 2}

    def best_path(self) -> str:
        path = int8_path(cpu_features())
        return "generic" if path == "torch" else path  # the portable C path beats torch

    def reference_pack(self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int):
        return quantize_int8(weight)

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, w.dequantize(), bias)

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        return quantize_int8(weight, PANEL)

    def gemm(self, out: torch.Tensor, x: torch.Tensor, w: Weight, bias_ptr: int | None) -> int:
        (m, n), k = out.shape, x.shape[1]
        args = (out.data_ptr(), x.data_ptr(), w.q.data_ptr(), w.scale.data_ptr(), bias_ptr)
        return getattr(self.kernels, self.kernel)(*args, m, n, k, self.code)

    def plain(self, w: Weight) -> torch.Tensor:
        return w.dequantize()

    def decode_view(self, w: Weight) -> tuple[int, int, int]:
        return w.q.data_ptr(), w.scale.data_ptr(), w.group
