"""w8a8 weights: int8 values with one scale per 32 k values of a row, and activations
quantized alike (engine/quantization/quant.py): gemm_w8a8.c's int8 dot products. A GGUF's
own Q8_0 / Q5_0 / Q4_0 blocks are taken as they are (engine/quantization/gguf_blocks.py)."""

from typing import ClassVar

import torch

from engine.cpu_features import cpu_features
from engine.quantization.amx import tiles_usable
from engine.quantization.int8 import Int8
from engine.quantization.packing import Weight
from engine.quantization.quant import W8A8_GROUP, quantize_w8a8, w8a8_panels, w8a8_reference


def w8a8_path(features: dict[str, bool]) -> str:
    """The int8-activation GEMM path (engine/csrc/gemm_w8a8.c) of these vector units:
    "vnni" (AVX512-VNNI vpdpbusd), "avx2" (vpmaddubsw) or "generic" (portable C). W8A8
    takes "amx" (engine/csrc/gemm_amx.c) over vnni where engine/quantization/amx.py allows."""
    if features["avx512f"] and features["avx512bw"] and features["avx512_vnni"]:
        return "vnni"
    return "avx2" if features["avx2"] else "generic"


class W8A8(Int8):  # the int8 values and their scales, per group; their own kernel
    name = "w8a8"
    k_multiple = W8A8_GROUP
    kernel = "gemm_w8a8_panels"  # its path argument:
    paths: ClassVar[dict[str, int]] = {"generic": 0, "avx2": 1, "vnni": 2, "amx": 3}

    def best_path(self) -> str:
        path = w8a8_path(cpu_features())
        return "amx" if path == "vnni" and tiles_usable(self.kernels) else path

    def reference_pack(self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int):
        return blocks if blocks is not None else quantize_w8a8(weight, panels=False)

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        return w8a8_reference(x, w, bias)

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        return w8a8_panels(blocks) if blocks is not None else quantize_w8a8(weight, panels=True)
