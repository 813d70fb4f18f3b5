"""The model's per-layer steps: the matmuls and the fused steps around them. Two
implementations, chosen once when the runner is built (select_ops): NativeOps through the
C kernels (engine/csrc), TorchOps through torch ops when they cannot be built (no
compiler, or TIERGATE_NATIVE=0). Both are tested equal.

Matmuls: the weights are packed once (pack_weight). With the C kernels they become
panels [N / 16, K, 16] for gemm.c, which streams them ~20% faster than oneDNN at decode
batch sizes (8-64 rows) and keeps up with it on 2,000-row prefills. Without them,
oneDNN's blocked layout: on this AMD (AVX-512) CPU, MKL's sgemm behind F.linear reaches
~65 GFLOP/s per core at batch 64 where oneDNN reaches ~120-160, and a plain weight makes
oneDNN reorder it on every call. Panels are a lossless re-layout, so the model then
drops its plain weights (LlamaForCausalLM.drop_plain_weights); oneDNN's layout is opaque,
so on that path both copies stay (~520 MB more for SmolLM2-135M with its LM head).

With `weights="int8"` the projections and the LM head are requantized at load
(engine/quant.py): int8 panels for the C kernel (gemm_int8.c, on the path
engine/cpu_features.py picked), or plain int8 with its scales for the torch reference.
"""

import ctypes

import torch
import torch.nn.functional as F

from engine import native
from engine.attention import AttentionContext, write_kv
from engine.config import WEIGHT_FORMATS
from engine.cpu_features import cpu_features, int8_path
from engine.quant import Int8Weight, quantize_int8

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [T, 1, D/2] for the step's positions

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_PANEL = 16  # output columns per panel; gemm.c takes them in pairs
_INT8_PATHS = {"generic": 0, "avx2": 1, "avx512": 2}  # gemm_int8_panels' path argument
Weight = torch.Tensor | Int8Weight  # what pack_weight returns


def is_panels(weight: Weight | None) -> bool:
    """True for weights in the C GEMM's panels (fp32 [N / 16, K, 16], or int8 panels)."""
    if isinstance(weight, Int8Weight):
        return weight.is_panels
    return weight is not None and weight.dim() == 3


def unpack_panels(panels: torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight back from NativeOps.pack_weight's panels (exact: a re-layout)."""
    return panels.transpose(1, 2).reshape(panels.shape[0] * _PANEL, panels.shape[1])


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [T, heads, D] rotated by position (half-split / NEOX layout)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TorchOps:
    """torch ops only: the fallback and the reference the C kernels are tested against."""

    kernels: ctypes.CDLL | None = None  # the C library, for attention and fused decode
    int8_path: str = "torch"  # where int8 weights are multiplied

    def __init__(self, weights: str = "fp32") -> None:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, not {weights!r}")
        self.weights = weights

    def pack_weight(self, weight: torch.Tensor, batch_hint: int) -> Weight:
        """weight [N, K] in the layout `linear` runs fastest on: oneDNN's blocked layout
        where torch has it, else the weight itself; int8 weights: plain int8 + scales."""
        if self.weights == "int8":
            return quantize_int8(weight)
        if _ONEDNN:
            return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        return weight

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [M, K] @ weight.T (+ bias); weight as pack_weight returned it (or plain)."""
        if isinstance(weight, Int8Weight):  # the reference: fp32 on the dequantized weight
            return F.linear(x, weight.dequantize(), bias)
        if _ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)

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
        self, kernels: ctypes.CDLL, weights: str = "fp32", int8_path: str | None = None
    ) -> None:
        """int8_path: "avx512", "avx2", "generic" (portable C) or "torch" (the reference);
        None: the best this CPU has (engine/cpu_features.py)."""
        super().__init__(weights)
        self.kernels = kernels
        self.int8_path = int8_path or _best_int8_path()

    def pack_weight(self, weight: torch.Tensor, batch_hint: int) -> Weight:
        """C GEMM panels [N / 16, K, 16] (3-D) when N is a whole number of panel pairs."""
        n, k = weight.shape
        if n % (2 * _PANEL) != 0 or (self.weights == "int8" and self.int8_path == "torch"):
            return super().pack_weight(weight, batch_hint)
        if self.weights == "int8":
            return quantize_int8(weight, _PANEL)
        return weight.view(n // _PANEL, _PANEL, k).transpose(1, 2).contiguous()

    def linear(
        self, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not is_panels(weight):
            return super().linear(x, weight, bias)
        q = weight.q if isinstance(weight, Int8Weight) else weight
        panels, k = q.shape[0], q.shape[1]
        x = x.contiguous()
        out = x.new_empty(x.shape[0], panels * _PANEL)
        bias_ptr = None if bias is None else bias.data_ptr()
        args = (out.data_ptr(), x.data_ptr(), q.data_ptr())
        if not isinstance(weight, Int8Weight):
            self.kernels.gemm_panels(*args, bias_ptr, x.shape[0], out.shape[1], k)
        elif self.kernels.gemm_int8_panels(
            *args, weight.scale.data_ptr(), bias_ptr, x.shape[0], out.shape[1], k, self.int8_code
        ):
            raise MemoryError("gemm_int8_panels: no memory for its widening buffer")
        return out

    @property
    def int8_code(self) -> int:
        return _INT8_PATHS[self.int8_path]

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
        )
        qkv = qkv.view(t, heads + 2 * kv_heads, d)
        return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]


def _best_int8_path() -> str:
    path = int8_path(cpu_features())
    return "generic" if path == "torch" else path  # the C kernels' portable path beats torch


def select_ops(weights: str = "fp32") -> TorchOps:
    """The C kernels when they build and load here, else torch: decided once per runner."""
    kernels = native.kernels()
    return TorchOps(weights) if kernels is None else NativeOps(kernels, weights)
