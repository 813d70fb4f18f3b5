"""fp32 weights: gemm.c's panels [N / 16, K, 16], or oneDNN's blocked layout on torch.

On this AMD (AVX-512) CPU the panels stream ~20% faster than oneDNN at decode batch sizes
(8-64 rows) and keep up with it on 2,000-row prefills. Without the C kernels, oneDNN: MKL's
sgemm behind F.linear reaches ~65 GFLOP/s per core at batch 64 where oneDNN reaches
~120-160, and a plain weight makes oneDNN reorder it on every call. Panels are a lossless
re-layout, so the model then drops its plain weights; oneDNN's layout is opaque, so on
that path both copies stay (~520 MB more for SmolLM2-135M with its LM head).
"""

import torch
import torch.nn.functional as F

from engine.quantization.method import LinearMethod
from engine.quantization.packing import PANEL, Weight, unpack_panels

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Fp32(LinearMethod):
    name = "fp32"

    def reference_pack(self, weight: torch.Tensor, blocks: Weight | None, batch_hint: int):
        if _ONEDNN:
            return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        return weight

    def reference(self, x: torch.Tensor, w: Weight, bias: torch.Tensor | None) -> torch.Tensor:
        if _ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
        return F.linear(x, w, bias)

    def panels(self, weight: torch.Tensor, blocks: Weight | None) -> Weight:
        n, k = weight.shape
        return weight.view(n // PANEL, PANEL, k).transpose(1, 2).contiguous()

    def gemm(self, out: torch.Tensor, x: torch.Tensor, w: Weight, bias_ptr: int | None) -> int:
        (m, n), k = out.shape, x.shape[1]
        self.kernels.gemm_panels(out.data_ptr(), x.data_ptr(), w.data_ptr(), bias_ptr, m, n, k)
        return 0

    def plain(self, w: Weight) -> torch.Tensor:
        return unpack_panels(w)

    def decode_view(self, w: Weight) -> tuple[int, int, int]:
        return w.data_ptr(), 0, 0
