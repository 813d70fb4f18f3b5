"""Paged attention on CPU: the per-step context and attention over the KV pages.

Each layer's KV pool is one tensor of pages; a page holds K [kv_heads, head_dim,
page_size] then V [kv_heads, page_size, head_dim] (fp32, bf16 or int8), and with int8 then
fp32 [3, kv_heads, page_size]: K's scales and offsets and V's scales, per token and KV head
(quantize_int8_offset, quantize_int8), so a page shared by prefix caching carries them.
The K and V pools handed around are strided views into it (new_kv_pools; int8_scales
finds an int8 pool's scales). Why this layout: engine/csrc/paged_attention.c (a page
read whole streams twice as fast as scattered per-head pieces, and dimension-major keys
let the kernel score 16 keys per vector instruction).

A step packs all chunks' tokens into one sequence, prefill chunks first, then decodes. A
chunk starting at position 0 attends to its own K/V with flash SDPA. With the C kernel,
every other token (a decode, or a token of a chunk continuing a cached prefix) is a kernel
row attending to its causal context in place. Without it (no compiler), each such chunk
gathers its pages and runs SDPA: the slow fallback, and the tests' reference.
"""

import ctypes
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.batch import SeqChunk


@dataclass
class SdpaChunk:
    start: int  # offset of this chunk's tokens in the packed batch
    size: int
    start_pos: int  # tokens already cached before this chunk
    page_ids: torch.Tensor  # [pages] long, covering start_pos + size tokens
    mask: torch.Tensor | None  # [size, start_pos + size] bool when both are > 1


@dataclass
class KernelRows:
    """Rows for the C kernel, each one query token attending to its own context: a step's
    decodes, or one prefix-continuing chunk (the kernel handles unequal lengths)."""

    start: int  # offset of the first row's token in the packed batch
    size: int
    page_table: torch.Tensor  # [size, max_pages] int32, rows padded with page 0
    context_lens: torch.Tensor  # [size] int32: keys each row attends to, itself included


@dataclass
class AttentionContext:
    page_size: int
    slot_pages: torch.Tensor  # [T] long: the page each new token's K/V goes to
    slot_offsets: torch.Tensor  # [T] long: its offset within that page
    prefills: list[SdpaChunk]  # chunks from position 0 (without kernels: every chunk)
    decode_rows: KernelRows | None = None  # the C kernel's decodes
    prefix_rows: list[KernelRows] = field(default_factory=list)  # the C kernel's chunks
    kernels: ctypes.CDLL | None = None  # the C library when the rows above go to it


def build_context(
    chunks: list[SeqChunk], page_size: int, kernels: ctypes.CDLL | None = None
) -> AttentionContext:
    """Chunks come prefills (len > 1) first, then decodes (len == 1). With kernels (the
    loaded C library), decodes and prefix-continuing chunks go to its paged kernel.
    Computed once per step and shared by all layers."""
    slots: list[int] = []
    prefills: list[SdpaChunk] = []
    prefix_rows: list[KernelRows] = []
    decodes: list[SeqChunk] = []
    offset = 0
    for c in chunks:
        n = len(c.token_ids)
        slots.extend(
            c.page_table[pos // page_size] * page_size + pos % page_size
            for pos in range(c.start_pos, c.start_pos + n)
        )
        if kernels is not None and n == 1:
            decodes.append(c)
        elif kernels is not None and c.start_pos > 0:
            prefix_rows.append(_prefix_rows(c, offset, page_size))
        else:
            prefills.append(_sdpa_chunk(c, offset))
        offset += n
    slot_mapping = torch.tensor(slots, dtype=torch.long)  # page * page_size + offset
    return AttentionContext(
        page_size=page_size,
        slot_pages=slot_mapping // page_size,
        slot_offsets=slot_mapping % page_size,
        prefills=prefills,
        decode_rows=_decode_rows(decodes, offset - len(decodes), page_size) if decodes else None,
        prefix_rows=prefix_rows,
        kernels=kernels,
    )


def _prefix_rows(c: SeqChunk, start: int, page_size: int) -> KernelRows:
    """Token i (position start_pos + i) attends to keys 0 .. start_pos + i."""
    n = len(c.token_ids)
    pages = c.page_table[: -(-(c.start_pos + n) // page_size)]
    table = torch.tensor(pages, dtype=torch.int32).expand(n, len(pages)).contiguous()
    lens = torch.arange(c.start_pos + 1, c.start_pos + n + 1, dtype=torch.int32)
    return KernelRows(start, n, table, lens)


def _decode_rows(decodes: list[SeqChunk], start: int, page_size: int) -> KernelRows:
    """Each decode's pages as a row padded with page 0 (the kernel skips the padding)."""
    lens = [c.start_pos + 1 for c in decodes]
    rows = [c.page_table[: -(-n // page_size)] for n, c in zip(lens, decodes, strict=True)]
    width = max(len(r) for r in rows)
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    return KernelRows(start, len(decodes), table, torch.tensor(lens, dtype=torch.int32))


def _sdpa_chunk(c: SeqChunk, start: int) -> SdpaChunk:
    n = len(c.token_ids)
    mask = None
    if c.start_pos > 0 and n > 1:  # query i sits at position start_pos + i
        mask = torch.arange(c.start_pos + n)[None, :] <= torch.arange(n)[:, None] + c.start_pos
    ids = torch.tensor(c.page_table, dtype=torch.long)
    return SdpaChunk(start, n, c.start_pos, ids, mask)


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


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> int8 values and fp32 scales [...]: symmetric, absmax / 127 per row,
    rounded to nearest even (as rope_store_kv in engine/csrc/layer_ops.c does)."""
    scale = x.abs().amax(dim=-1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays 0
    return (x / safe[..., None]).round().clamp(-127, 127).to(torch.int8), scale


def quantize_int8_offset(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    ctx: AttentionContext,
) -> None:
    """Store new K/V [T, KVH, D] at their slots (page, offset within the page), in the
    pools' dtype (bf16 pools: rounded to nearest even; int8: K quantize_int8_offset, V
    quantize_int8)."""
    pages, offsets = ctx.slot_pages, ctx.slot_offsets
    if k_pool.dtype == torch.int8:
        scales = int8_scales(k_pool)
        (k, k_scale, k_offset), (v, v_scale) = quantize_int8_offset(k), quantize_int8(v)
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


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    ctx: AttentionContext,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D] for the new tokens -> out [T, H, D]. The new K/V must
    already be in the pools: queries read their cached context from there."""
    out = torch.empty_like(q)
    for c in ctx.prefills:
        qs = slice(c.start, c.start + c.size)
        out[qs] = _sdpa(q[qs], k[qs], v[qs], k_pool, v_pool, c)
    decode_rows = [] if ctx.decode_rows is None else [ctx.decode_rows]
    for rows in [*ctx.prefix_rows, *decode_rows]:
        qs = slice(rows.start, rows.start + rows.size)
        kernel_attention(ctx.kernels, q[qs], k_pool, v_pool, rows, out[qs])
    return out


def kernel_attention(
    kernels: ctypes.CDLL,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    rows: KernelRows,
    out: torch.Tensor,
) -> None:
    """q [B, H, D] -> out [B, H, D] (contiguous), reading K/V pages in place."""
    assert out.is_contiguous() and k_pool.stride(0) == v_pool.stride(0)
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()  # each row's heads must be one block; rows may be apart
    b, h, d = q.shape
    _, kvh, page_size, _ = v_pool.shape
    attend = (  # each kv_dtype: the kernel built for its pages
        kernels.paged_decode_attention,
        kernels.paged_decode_attention_bf16,
        kernels.paged_decode_attention_int8,
    )[KV_KINDS[v_pool.dtype]]
    failed = attend(
        out.data_ptr(),
        q.data_ptr(),
        q.stride(0),
        k_pool.data_ptr(),
        v_pool.data_ptr(),
        k_pool.stride(0),
        rows.page_table.data_ptr(),
        rows.page_table.shape[1],
        rows.context_lens.data_ptr(),
        b,
        h,
        kvh,
        d,
        page_size,
        d**-0.5,
    )
    if failed:
        raise MemoryError("paged_decode_attention could not allocate its scratch")


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    c: SdpaChunk,
) -> torch.Tensor:
    """One chunk: q [L, H, D] -> [L, H, D]."""
    if c.start_pos == 0:  # no cached prefix: attend to this chunk's own K/V
        kh, vh = k.transpose(0, 1), v.transpose(0, 1)
    else:  # gather the pages, head-major [KVH, pages * page_size, D], fp32
        kvh, d = v_pool.shape[1], v_pool.shape[3]
        n = c.start_pos + c.size
        kp, vp = read_pages(k_pool, v_pool, c.page_ids)
        kh = kp.permute(1, 0, 3, 2).reshape(kvh, -1, d)[:, :n]
        vh = vp.transpose(0, 1).reshape(kvh, -1, d)[:, :n]
    # 4-D [1, heads, L, D]: with 3-D inputs SDPA falls back to its math kernel, which
    # materialises L x L scores (4x slower at 2k tokens) instead of flash attention
    qh, kh, vh = q.transpose(0, 1)[None], kh[None], vh[None]
    causal = c.start_pos == 0  # else the mask, or none for a single query
    return F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=c.mask, is_causal=causal, enable_gqa=True
    )[0].transpose(0, 1)
