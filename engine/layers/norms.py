"""RMSNorm over the residual stream (the add folded in), and per head (q / k norms)."""

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.direct import Direct
from engine.ops import TorchOps


class RMSNorm(Direct):
    def __init__(self, ops: TorchOps, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.ops = eps, ops

    def forward(self, residual: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """residual += x in place (the residual stream, when x is given), then the norm."""
        return self.ops.add_rms_norm(residual, x, self.weight, self.eps)


class HeadRMSNorm(Direct):
    """RMSNorm of each head's vector (Qwen3's q_norm / k_norm), weight [head_dim]. In torch:
    the heads are strided views into the fused qkv rows, which the C norm does not take."""

    def __init__(self, head_dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps

    def forward(self, heads: torch.Tensor) -> None:
        """heads [T, H, D], normed in place (a view into qkv stays one)."""
        heads.copy_(F.rms_norm(heads, self.weight.shape, self.weight, self.eps))
