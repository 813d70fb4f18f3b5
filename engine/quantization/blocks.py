"""`blocks` weights: a GGUF's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks as the file has
them, re-laid into gemm_blocks.c's records (engine/quantization/block_weights.py) when the
model loads; int8 activations, on w8a8's instruction sets. A tensor the file holds in no
kept type is packed as w8a8 (engine/quantization/matmuls.py)."""

import torch

from engine.cpu_features import cpu_features
from engine.quantization.block_weights import blocks_reference
from engine.quantization.method import LinearMethod
from engine.quantization.packing import Weight
from engine.quantization.w8a8 import W8A8, w8a8_path


class Blocks(LinearMethod):
    name = "blocks"
    paths = W8A8.paths  # gemm_blocks.c: the same instruction sets (amx: its VNNI path)

    def best_path(self) -> str:
        return w8a8_path(cpu_features())  # no tile kernel for the blocks

    def reference_pack(self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int):
        return blocks  # the records, already in the C kernel's own layout

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        return blocks_reference(x, w, bias)

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        return blocks

    def gemm(self, out: torch.Tensor, x: torch.Tensor, w: Weight, bias_ptr: int | None) -> int:
        (m, n), k = out.shape, x.shape[1]
        args = (out.data_ptr(), x.data_ptr(), w.data.data_ptr(), w.panels.data_ptr(), bias_ptr)
        return self.kernels.gemm_blocks(*args, m, n, k, self.code)

    def plain(self, w: Weight) -> torch.Tensor:
        return w.dequantize()

    def decode_view(self, w: Weight) -> tuple[int, int, int]:
        return w.data.data_ptr(), w.panels.data_ptr(), -2
