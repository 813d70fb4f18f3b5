"""bf16 weights (rounded at load, half the bytes): gemm_bf16.c's panels [N / 16, K / 2,
16, 2]; the torch reference widens a plain bf16 [N, K] weight to fp32."""

from typing import ClassVar

import torch
import torch.nn.functional as F

from engine.cpu_features import cpu_features
from engine.quantization.amx import bf16_tiles_usable
from engine.quantization.method import LinearMethod
from engine.quantization.packing import Weight, bf16_panels, unpack_panels


def bf16_path(features: dict[str, bool]) -> str:
    """The bf16-weight GEMM path (engine/csrc/gemm_bf16.c): "avx512_bf16" (vdpbf16ps, x
    rounded to bf16 too) or "widen" (weights widened to fp32 in registers, x in fp32). Bf16
    takes "amx" (engine/csrc/gemm_amx.c) over avx512_bf16 where engine/quantization/amx.py
    allows."""
    return "avx512_bf16" if features["avx512f"] and features["avx512_bf16"] else "widen"


class Bf16(LinearMethod):
    name = "bf16"
    k_multiple = 2
    # gemm_bf16_panels' path argument
    paths: ClassVar[dict[str, int]] = {"widen": 0, "avx512_bf16": 1, "amx": 2}

    def best_path(self) -> str:
        path = bf16_path(cpu_features())
        return "amx" if path == "avx512_bf16" and bf16_tiles_usable(self.kernels) else path

    def reference_pack(self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int):
        return weight.detach().to(torch.bfloat16)

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, w.float(), bias)

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        return bf16_panels(weight)

    def gemm(self, out: torch.Tensor, x: torch.Tensor, w: Weight, bias_ptr: int | None) -> int:
        (m, n), k = out.shape, x.shape[1]
        args = (out.data_ptr(), x.data_ptr(), w.data_ptr(), bias_ptr)
        return self.kernels.gemm_bf16_panels(*args, m, n, k, self.code)

    def plain(self, w: Weight) -> torch.Tensor:
        return unpack_panels(w)

    def decode_view(self, w: Weight) -> tuple[int, int, int]:
        return w.data_ptr(), 0, -1
