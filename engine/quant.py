"""Weights requantized at load to int8, one fp32 scale per output row (symmetric).

W [N, K] ~ Q * scale[:, None] with scale[n] = max |W[n]| / 127, so every row uses the
whole int8 range whatever its magnitude. The C kernel (engine/csrc/gemm_int8.c) reads Q
in the fp32 GEMM's panel layout, [N / 16, K, 16]; the torch reference keeps it [N, K].
"""

from dataclasses import dataclass

import torch


@dataclass
class Int8Weight:
    q: torch.Tensor  # int8: panels [N / 16, K, 16] for the C kernel, or plain [N, K]
    scale: torch.Tensor  # fp32 [N]

    @property
    def is_panels(self) -> bool:
        return self.q.dim() == 3

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def dequantize(self) -> torch.Tensor:
        """The fp32 [N, K] weight these int8 values stand for."""
        q = self.q
        if self.is_panels:
            q = q.transpose(1, 2).reshape(q.shape[0] * q.shape[2], q.shape[1])
        return q.float() * self.scale[:, None]


def quantize_int8(weight: torch.Tensor, panel: int | None = None) -> Int8Weight:
    """weight [N, K] fp32 -> Int8Weight, in panels of `panel` rows when given. In-place
    steps and no |W| copy: a 0.5B model's weights are 2 GB, each full pass costs seconds."""
    w = weight.detach().float()
    scale = torch.maximum(w.amax(dim=1), w.amin(dim=1).neg()) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays 0
    q = torch.div(w, scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    if panel is not None:
        n, k = q.shape
        q = q.view(n // panel, panel, k).transpose(1, 2).contiguous()
    return Int8Weight(q, scale.contiguous())
