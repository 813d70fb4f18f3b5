"""Paged attention on CPU: the per-step context and attention over the KV pages.

The KV pages (their layout, element types, store and read) are engine/kv/pages.py's.

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
from engine.kv.pages import KV_KINDS, read_pages


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
