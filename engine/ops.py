"""The model's per-layer steps: the matmuls and the fused steps around them, through the
C kernels (engine/csrc) when they are built, torch ops otherwise. Both paths are tested
equal.

Matmuls: the weights are packed once (pack_weight). With the C kernels they become
panels [N / 16, K, 16] for gemm.c, which streams them ~20% faster than oneDNN at decode
batch sizes (8-64 rows) and keeps up with it on 2,000-row prefills. Without them,
oneDNN's blocked layout: on this AMD (AVX-512) CPU, MKL's sgemm behind F.linear reaches
~65 GFLOP/s per core at batch 64 where oneDNN reaches ~120-160, and a plain weight makes
oneDNN reorder it on every call. Panels are a lossless re-layout, so the model then
drops its plain weights (LlamaForCausalLM.drop_plain_weights); oneDNN's layout is opaque,
so on that path both copies stay (~520 MB more for SmolLM2-135M with its LM head).
"""

import torch
import torch.nn.functional as F

from engine import native
from engine.attention import AttentionContext, write_kv

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [T, 1, D/2] for the step's positions

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_PANEL = 16  # output columns per panel; gemm.c takes them in pairs


def pack_weight(weight: torch.Tensor, batch_hint: int) -> torch.Tensor:
    """weight [N, K] in the layout `linear` runs fastest on: C GEMM panels [N / 16, K,
    16] (3-D), else oneDNN's blocked layout, else the weight itself."""
    n, k = weight.shape
    if native.kernels() is not None and n % (2 * _PANEL) == 0:
        return weight.view(n // _PANEL, _PANEL, k).transpose(1, 2).contiguous()
    if _ONEDNN:
        return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
    return weight


def unpack_panels(panels: torch.Tensor) -> torch.Tensor:
    """The plain [N, K] weight back from pack_weight's panels (exact: a re-layout)."""
    return panels.transpose(1, 2).reshape(panels.shape[0] * _PANEL, panels.shape[1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T (+ bias); weight as pack_weight returned it (or plain)."""
    if weight.dim() == 2:
        if _ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return F.linear(x, weight, bias)
    panels, k = weight.shape[0], weight.shape[1]
    lib = native.kernels()
    if lib is None:  # packed while the kernels were loaded, run after they were disabled
        return F.linear(x, unpack_panels(weight), bias)
    x = x.contiguous()
    out = x.new_empty(x.shape[0], panels * _PANEL)
    bias_ptr = None if bias is None else bias.data_ptr()
    lib.gemm_panels(
        out.data_ptr(), x.data_ptr(), weight.data_ptr(), bias_ptr, x.shape[0], out.shape[1], k
    )
    return out


def add_rms_norm(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x in place (unless x is None), then RMSNorm(residual) * weight."""
    lib = native.kernels()
    if lib is None:
        if x is not None:
            residual.add_(x)
        return F.rms_norm(residual, weight.shape, weight, eps)
    assert residual.is_contiguous() and (x is None or x.is_contiguous())
    out = torch.empty_like(residual)
    rows, dim = residual.shape
    x_ptr = None if x is None else x.data_ptr()
    lib.add_rms_norm(
        out.data_ptr(), residual.data_ptr(), x_ptr, weight.data_ptr(), rows, dim, float(eps)
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
    rows, width = gate_up.shape
    lib = native.kernels()
    if lib is None:
        gate, up = gate_up.split(width // 2, dim=-1)
        return F.silu(gate) * up
    assert gate_up.is_contiguous()
    out = gate_up.new_empty(rows, width // 2)
    lib.silu_mul(out.data_ptr(), gate_up.data_ptr(), rows, width // 2)
    return out


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [T, heads, D] rotated by position (half-split / NEOX layout)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_store_kv(
    qkv: torch.Tensor,
    rope: Rope,
    kv: tuple[torch.Tensor, torch.Tensor],
    ctx: AttentionContext,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (heads + 2 kv_heads) * D] -> rotated q [T, heads, D], k and v [T, kv_heads,
    D], with k and v stored in their KV pages. The C path rotates qkv in place."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (heads + 2 * kv_heads)
    k_pool, v_pool = kv
    lib = native.kernels()
    if lib is None:
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = apply_rope(qk.view(t, heads + kv_heads, d), rope)
        q, k, v = qk[:, :heads], qk[:, heads:], v.view(t, kv_heads, d)
        write_kv(k_pool, v_pool, k, v, ctx)
        return q, k, v
    cos, sin = rope
    assert qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    assert k_pool.stride(0) == v_pool.stride(0)
    lib.rope_store_kv(
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
