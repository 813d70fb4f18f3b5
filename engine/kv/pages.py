"""KV pages: each layer's pool is one tensor of pages; a page holds K [kv_heads, head_dim,
page_size] then V [kv_heads, page_size, head_dim] (fp32, bf16 or int8), and with int8 then
fp32 [3, kv_heads, page_size]: K's scales and offsets and V's scales, per token and KV head
(quantize_kv_int8_offset, quantize_kv_int8), so a page shared by prefix caching carries
them. The K and V pools handed around are strided views into it (new_kv_pools;
int8_scales finds an int8 pool's scales). Why this layout: engine/csrc/paged_attention.c
(a page read whole streams twice as fast as scattered per-head pieces, and
dimension-major keys let the kernel score 16 keys per vector instruction).

Here: the pools, a page's bytes, and storing / reading K/V with torch (the C kernels'
reference and the path without them; engine/csrc/layer_ops.c stores the same bytes).
"""

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.attention import AttentionContext

# the C kernels' code for a pool's element type (rope_store_kv's and decode_step's kv_kind)
KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
_SCALE_BYTES = 4  # an int8 page's scales are fp32
_SCALE_ROWS = 3  # K's scale, K's offset, V's scale: each [kv_heads, page_size]


def page_bytes(page_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """One layer's page: K and V of page_size tokens, and int8's scales."""
    values = 2 * kv_heads * head_dim * page_size * dtype.itemsize
    scales = _SCALE_ROWS * kv_heads * page_size * _SCALE_BYTES
    return values + (scales if dtype == torch.int8 else 0)


def new_kv_pools(
    num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V pools: views [num_pages, kv_heads, head_dim, page_size] and
    [num_pages, kv_heads, page_size, head_dim] into one tensor of whole pages. Zeros
    (lazily mapped by the OS), not empty: padding is skipped, but NaN garbage * 0 is NaN."""
    n = kv_heads * head_dim * page_size
    size = page_bytes(page_size, kv_heads, head_dim, dtype) // dtype.itemsize
    pages = torch.zeros(num_pages, size, dtype=dtype)
    k_pool = pages[:, :n].view(num_pages, kv_heads, head_dim, page_size)
    v_pool = pages[:, n : 2 * n].view(num_pages, kv_heads, page_size, head_dim)
    return k_pool, v_pool


def int8_scales(k_pool: torch.Tensor) -> torch.Tensor:
    """An int8 K pool's scales, fp32 [num_pages, 3, kv_heads, page_size] after each page's
    V (new_kv_pools): [:, 0] K's scales, [:, 1] K's offsets, [:, 2] V's scales, per token and
    KV head: k = int8 * scale + offset, v = int8 * scale."""
    num_pages, kv_heads, head_dim, page_size = k_pool.shape
    offset = k_pool.storage_offset() + 2 * kv_heads * head_dim * page_size
    assert k_pool.dtype == torch.int8 and offset % _SCALE_BYTES == 0
    s = k_pool.stride(0) // _SCALE_BYTES
    shape = (num_pages, _SCALE_ROWS, kv_heads, page_size)
    strides = (s, kv_heads * page_size, page_size, 1)
    out = torch.empty(0, dtype=torch.float32)
    return out.set_(k_pool.untyped_storage(), offset // _SCALE_BYTES, shape, strides)


def quantize_kv_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> int8 values and fp32 scales [...]: symmetric, absmax / 127 per row,
    rounded to nearest even (as rope_store_kv in engine/csrc/layer_ops.c does)."""
    scale = x.abs().amax(dim=-1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays 0
    return (x / safe[..., None]).round().clamp(-127, 127).to(torch.int8), scale


def quantize_kv_int8_offset(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., D] -> int8 values, fp32 scales and offsets [...]: x = int8 * scale + offset
    over each row's min..max (all 256 steps: keys sit off zero, and symmetric int8 left
    SmolLM2's greedy answers further from fp32's); as layer_ops.c's, bit for bit."""
    lo, hi = x.amin(dim=-1), x.amax(dim=-1)
    scale = (hi - lo) / 255
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # all equal: int8 -128, offset
    q = ((x - lo[..., None]) / safe[..., None]).round() - 128
    return q.clamp(-128, 127).to(torch.int8), scale, lo + 128 * scale


def write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: "AttentionContext",
) -> None:
    """Store new K/V [T, KVH, D] at their slots (page, offset within the page), in the
    pools' dtype (bf16 pools: rounded to nearest even; int8: K quantize_kv_int8_offset, V
    quantize_kv_int8)."""
    pages, offsets = ctx.slot_pages, ctx.slot_offsets
    if k_pool.dtype == torch.int8:
        scales = int8_scales(k_pool)
        (k, k_scale, k_offset), (v, v_scale) = quantize_kv_int8_offset(k), quantize_kv_int8(v)
        scales[pages, 0, :, offsets], scales[pages, 1, :, offsets] = k_scale, k_offset
        scales[pages, 2, :, offsets] = v_scale
    v_pool[pages, :, offsets] = v.to(v_pool.dtype)
    k_pool.transpose(2, 3)[pages, :, offsets] = k.to(k_pool.dtype)


def read_pages(
    k_pool: torch.Tensor, v_pool: torch.Tensor, page_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pages' K [n, KVH, D, P] and V [n, KVH, P, D] in fp32 (bf16 widened, int8 scaled)."""
    k, v = k_pool[page_ids].float(), v_pool[page_ids].float()
    if k_pool.dtype == torch.int8:
        scales = int8_scales(k_pool)[page_ids]  # [n, 3, KVH, P]
        k = k * scales[:, 0, :, None, :] + scales[:, 1, :, None, :]
        v = v * scales[:, 2, :, :, None]
    return k, v
