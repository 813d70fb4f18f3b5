"""Weights requantized at load to int8, one fp32 scale per output row (symmetric).

W [N, K] ~ Q * scale[:, None] with scale[n] = max |W[n]| / 127, so every row uses the
whole int8 range whatever its magnitude. The C kernel (engine/csrc/gemm_int8.c) reads Q
in the fp32 GEMM's panel layout, [N / 16, K, 16]; the torch reference keeps it [N, K].

"w8a8" weights (int8 activations too, engine/csrc/gemm_w8a8.c) have one scale per group
of W8A8_GROUP k values per output row instead (as llama.cpp's Q8_0; the activations are
grouped alike), and, for the C kernel, groups of 4 k values per column, [N / 16, K / 4,
16, 4]: what one 4-byte dot product instruction (VNNI vpdpbusd) takes.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

W8A8_GROUP = 32  # k values per scale in w8a8 weights and activations (gemm_w8a8.c's G)


@dataclass
class Int8Weight:
    q: torch.Tensor  # int8: panels [N / 16, K, 16] or [N / 16, K / 4, 16, 4], or plain [N, K]
    # fp32 [N]; w8a8: per group, panels [N / 16, K / group, 16] or plain [N, K / group]
    scale: torch.Tensor
    group: int = 0  # w8a8: k values per scale (activations too); 0: one scale per row

    @property
    def is_panels(self) -> bool:
        return self.q.dim() >= 3

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the weight this stands for."""
        q = self.q
        if q.dim() == 4:
            return q.shape[0] * 16, q.shape[1] * 4
        return (q.shape[0] * q.shape[2], q.shape[1]) if q.dim() == 3 else tuple(q.shape)

    def plain_q(self) -> torch.Tensor:
        """The int8 values as [N, K]."""
        q = self.q
        if q.dim() == 4:  # [P, K / 4, 16, 4] -> [P, 16, K / 4, 4]
            return q.permute(0, 2, 1, 3).reshape(q.shape[0] * 16, q.shape[1] * 4)
        if q.dim() == 3:
            return q.transpose(1, 2).reshape(q.shape[0] * q.shape[2], q.shape[1])
        return q

    def plain_scale(self) -> torch.Tensor:
        """The scales as [N] (one per row) or, w8a8, [N, K / group]."""
        scale = self.scale
        if scale.dim() == 3:  # [N / 16, K / group, 16] -> [N, K / group]
            scale = scale.transpose(1, 2).reshape(-1, scale.shape[1])
        return scale

    def dequantize(self) -> torch.Tensor:
        """The fp32 [N, K] weight these int8 values stand for."""
        if not self.group:
            return self.plain_q().float() * self.scale[:, None]
        return self.plain_q().float() * self.plain_scale().repeat_interleave(self.group, dim=1)


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


def quantize_w8a8(weight: torch.Tensor, panels: bool) -> Int8Weight:
    """weight [N, K] fp32 -> int8 with one scale per W8A8_GROUP k values of a row (a K
    that is no multiple: one group per row, for the torch path); panels: in gemm_w8a8.c's
    layouts (N a multiple of 16, K of the group), else plain."""
    n, k = weight.shape
    group = W8A8_GROUP if k % W8A8_GROUP == 0 else k
    g = weight.detach().float().view(n, k // group, group)
    scale = g.abs().amax(dim=2) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.div(g, scale[..., None]).round_().clamp_(-127, 127).to(torch.int8).view(n, k)
    plain = Int8Weight(q, scale.contiguous(), group)
    return w8a8_panels(plain) if panels else plain


def w8a8_panels(plain: Int8Weight) -> Int8Weight:
    """Plain w8a8 weights (q [N, K], scale [N, K / group]) in gemm_w8a8.c's layouts: the
    same values re-laid (a GGUF's own blocks come this way too: quantization/gguf_blocks.py)."""
    (n, k), q = plain.q.shape, plain.q
    q = q.view(n // 16, 16, k // 4, 4).permute(0, 2, 1, 3).contiguous()
    scale = plain.scale.view(n // 16, 16, -1).transpose(1, 2).contiguous()
    return Int8Weight(q, scale, plain.group)


def quantize_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [M, K] as the int8 values gemm_w8a8.c makes of it, back in fp32: per group of
    `group` k values, round(x * 127 / max|x|) (half to even) times max|x| / 127."""
    g = x.float().contiguous().view(x.shape[0], -1, group)
    amax = g.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return ((g * inv).round() * (amax / 127.0)).view(x.shape)


def w8a8_reference(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T with x quantized as the C kernel does (the torch path and its reference)."""
    return F.linear(quantize_rows(x, w.group), w.dequantize(), bias)
