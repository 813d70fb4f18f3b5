"""The model's per-layer steps around the matmuls: add + RMSNorm, SiLU x up, RoPE + KV
store. Two implementations, chosen once when the runner is built (select_ops): NativeOps
through the C kernels (engine/csrc), TorchOps through torch ops when they cannot be built
(no compiler, or TIERGATE_NATIVE=0). Both are tested equal. Each is also the runner's
matmuls (engine/quantization/matmuls.py: packing in the weight format asked for, and the
method that multiplies by it), on the C kernels' panels or on torch alike.
"""

import ctypes

import torch
import torch.nn.functional as F

from engine import native
from engine.attention import AttentionContext
from engine.kv.pages import KV_KINDS, write_kv
from engine.layers.rotary import Rope, apply_rope
from engine.quantization.matmuls import Matmuls


class TorchOps(Matmuls):
    """torch ops only: the fallback and the reference the C kernels are tested against."""

    def __init__(self, weights: str = "fp32") -> None:
        super().__init__(weights, None, {})

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual += x in place (unless x is None), then RMSNorm(residual) * weight."""
        if x is not None:
            residual.add_(x)
        return F.rms_norm(residual, weight.shape, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
        gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
        return F.silu(gate) * up

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        rope: Rope,
        kv: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        heads: int,
        kv_heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, (heads + 2 kv_heads) * D] -> rotated q [T, heads, D], k and v [T,
        kv_heads, D], with k and v stored in their KV pages."""
        t = qkv.shape[0]
        d = qkv.shape[1] // (heads + 2 * kv_heads)
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = apply_rope(qk.view(t, heads + kv_heads, d), rope)
        q, k, v = qk[:, :heads], qk[:, heads:], v.view(t, kv_heads, d)
        write_kv(kv[0], kv[1], k, v, ctx)
        return q, k, v


class NativeOps(TorchOps):
    """The C kernels; torch's oneDNN matmul for weights whose width does not fit panels."""

    def __init__(
        self,
        kernels: ctypes.CDLL,
        weights: str = "fp32",
        int8_path: str | None = None,
        w8a8_path: str | None = None,
        bf16_path: str | None = None,
    ) -> None:
        """int8_path: "avx512", "avx2", "generic" (portable C) or "torch" (the reference);
        w8a8_path: "vnni", "avx2" or "generic"; bf16_path: "avx512_bf16" or "widen";
        None: the best this CPU has (engine/cpu_features.py)."""
        paths = {"int8": int8_path, "w8a8": w8a8_path, "bf16": bf16_path}
        Matmuls.__init__(self, weights, kernels, paths)

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        assert residual.is_contiguous() and (x is None or x.is_contiguous())
        out = torch.empty_like(residual)
        rows, dim = residual.shape
        x_ptr = None if x is None else x.data_ptr()
        self.kernels.add_rms_norm(
            out.data_ptr(), residual.data_ptr(), x_ptr, weight.data_ptr(), rows, dim, float(eps)
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        assert gate_up.is_contiguous()
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self.kernels.silu_mul(out.data_ptr(), gate_up.data_ptr(), rows, width // 2)
        return out

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        rope: Rope,
        kv: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        heads: int,
        kv_heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As TorchOps.rope_store_kv, rotating qkv in place."""
        t = qkv.shape[0]
        d = qkv.shape[1] // (heads + 2 * kv_heads)
        (k_pool, v_pool), (cos, sin) = kv, rope
        assert qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
        assert k_pool.stride(0) == v_pool.stride(0)
        self.kernels.rope_store_kv(
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            t,
            heads,
            kv_heads,
            d,
            k_pool.data_ptr(),
            v_pool.data_ptr(),
            k_pool.stride(0),
            v_pool.shape[2],
            ctx.slot_pages.data_ptr(),
            ctx.slot_offsets.data_ptr(),
            KV_KINDS[k_pool.dtype],
        )
        qkv = qkv.view(t, heads + 2 * kv_heads, d)
        return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]


def select_ops(weights: str = "fp32") -> TorchOps:
    """The C kernels when they build and load here, else torch: decided once per runner."""
    kernels = native.kernels()
    return TorchOps(weights) if kernels is None else NativeOps(kernels, weights)
