"""Paged attention on CPU: the per-step context object and the attention kernel.

Each layer's KV pool is one tensor of pages; a page holds K [kv_heads, head_dim,
page_size] then V [kv_heads, page_size, head_dim] for page_size tokens. The K pool and V
pool handed around are strided views into it: [num_pages, kv_heads, head_dim, page_size]
and [num_pages, kv_heads, page_size, head_dim]. (DESIGN.md draws [num_pages, page_size,
kv_heads, head_dim]: same bytes per page.) Why: see engine/csrc/paged_attention.c: a page
read whole streams twice as fast as scattered per-head 4 KB pieces, and dimension-major
keys let the C kernel score 16 keys per vector instruction.
A step packs all chunks' tokens into one sequence of T tokens, prefill chunks first, then
single-token chunks (decodes). With the C kernel (reading pages in place), the decodes go
to it in one call, and so does every token of a prefill chunk that continues a cached
prefix (each token is a row attending to its own causal context); a chunk starting at
position 0 attends to its own K/V with flash SDPA. Without the kernel (no compiler),
prefill chunks use SDPA over gathered pages, and decodes are sorted by context length and
attended with torch in batched groups of similar length.
"""

import ctypes
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.batch import SeqChunk


class Workspace:
    """Gather buffers reused across layers and steps. A fresh multi-MB tensor per layer
    costs more in page faults than the copy into it (measured: 9 ms vs 3 ms per gather
    at batch 64, 512 tokens of context)."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self._bufs[name] = torch.empty(n, dtype=dtype)
        return buf[:n].view(shape)


@dataclass
class PrefillSeq:
    q_start: int  # offset of this chunk's tokens in the packed batch
    q_len: int
    start_pos: int  # tokens already cached before this chunk
    page_ids: torch.Tensor  # [pages] long, covering start_pos + q_len tokens
    mask: torch.Tensor | None  # [q_len, start_pos + q_len] bool; None: plain causal


@dataclass
class DecodeGroup:
    """Decodes of similar context length, attended in one batched call."""

    start: int  # offset of the group's first token in the packed batch
    size: int
    page_table: torch.Tensor  # [size, max_pages] long, padded with page 0
    mask: torch.Tensor  # [size, max_pages * page_size] additive: 0 live, -inf padding
    _per_kv_head: dict[int, torch.Tensor] = field(default_factory=dict)

    def kv_head_mask(self, kv_heads: int) -> torch.Tensor:
        """The mask repeated per KV head, [kv_heads * size, 1, S]: baddbmm's addend, built
        once per step and shared by all layers."""
        mask = self._per_kv_head.get(kv_heads)
        if mask is None:
            mask = self.mask.repeat(kv_heads, 1)[:, None, :]
            self._per_kv_head[kv_heads] = mask
        return mask


@dataclass
class KernelRows:
    """Rows for the C kernel, each one query token attending to its own context: a step's
    decodes, or one prefix-continuing prefill chunk (the kernel handles unequal lengths)."""

    start: int  # offset of the first row's token in the packed batch
    size: int
    page_table: torch.Tensor  # [size, max_pages] int32, rows padded with page 0
    context_lens: torch.Tensor  # [size] int32: keys each row attends to, itself included


@dataclass
class AttentionContext:
    page_size: int
    slot_pages: torch.Tensor  # [T] long: the page each new token's K/V goes to
    slot_offsets: torch.Tensor  # [T] long: its offset within that page
    prefills: list[PrefillSeq]  # SDPA: chunks from position 0 (and, without kernels, all)
    decode_groups: list[DecodeGroup]  # the torch path's decodes
    decode_rows: KernelRows | None = None  # the C kernel's decodes
    # the C kernel's prefill chunks that continue a cached prefix: one row per token
    prefix_rows: list[KernelRows] = field(default_factory=list)
    workspace: Workspace = field(default_factory=Workspace)
    kernels: ctypes.CDLL | None = None  # the C library when the rows above go to it


def build_context(
    chunks: list[SeqChunk],
    page_size: int,
    workspace: Workspace | None = None,
    kernels: ctypes.CDLL | None = None,
) -> AttentionContext:
    """Chunks must come prefills (len > 1) first, then decodes (len == 1), the decodes
    best sorted by context length (the torch path groups neighbours). With kernels (the
    loaded C library), decodes and prefix-continuing chunks go to its paged kernel.
    Everything here is computed once per step and shared by all layers."""
    slots: list[int] = []
    prefills: list[PrefillSeq] = []
    prefix_rows: list[KernelRows] = []
    decodes: list[SeqChunk] = []
    offset = 0
    for c in chunks:
        n = len(c.token_ids)
        slots.extend(
            c.page_table[pos // page_size] * page_size + pos % page_size
            for pos in range(c.start_pos, c.start_pos + n)
        )
        if n > 1 and kernels is not None and c.start_pos > 0:
            prefix_rows.append(_prefix_rows(c, offset, page_size))
        elif n > 1:
            prefills.append(_prefill_seq(c, offset))
        else:
            decodes.append(c)
        offset += n
    start = offset - len(decodes)
    groups, rows = [], None
    if kernels is not None and decodes:
        rows = _decode_rows(decodes, start, page_size)
    elif decodes:
        for lo, hi in _group_by_length([-(-(c.start_pos + 1) // page_size) for c in decodes]):
            groups.append(_decode_group(decodes[lo:hi], start + lo, page_size))
    slot_mapping = torch.tensor(slots, dtype=torch.long)  # page * page_size + offset
    return AttentionContext(
        page_size=page_size,
        slot_pages=slot_mapping // page_size,
        slot_offsets=slot_mapping % page_size,
        prefills=prefills,
        decode_groups=groups,
        decode_rows=rows,
        prefix_rows=prefix_rows,
        workspace=workspace or Workspace(),
        kernels=kernels,
    )


def _prefix_rows(c: SeqChunk, start: int, page_size: int) -> KernelRows:
    """A chunk continuing a cached prefix as kernel rows: token i (position start_pos +
    i) attends to keys 0 .. start_pos + i, all through the sequence's page table."""
    n = len(c.token_ids)
    pages = c.page_table[: -(-(c.start_pos + n) // page_size)]
    table = torch.tensor(pages, dtype=torch.int32).expand(n, len(pages)).contiguous()
    lens = torch.arange(c.start_pos + 1, c.start_pos + n + 1, dtype=torch.int32)
    return KernelRows(start, n, table, lens)


def _padded_pages(
    decodes: list[SeqChunk], page_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, list[int]]:
    """Each decode's pages as a row padded with page 0 to the longest (the kernel skips
    the padding, torch masks it), and each decode's context length, itself included."""
    lens = [c.start_pos + 1 for c in decodes]
    width = max(-(-n // page_size) for n in lens)
    rows = [c.page_table[: -(-n // page_size)] for n, c in zip(lens, decodes, strict=True)]
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=dtype), lens


def _decode_rows(decodes: list[SeqChunk], start: int, page_size: int) -> KernelRows:
    table, lens = _padded_pages(decodes, page_size, torch.int32)
    return KernelRows(start, len(decodes), table, torch.tensor(lens, dtype=torch.int32))


# Fixed per-layer cost of one more decode group (a handful of small ops), in units of
# one sequence's page gathered and attended to: ~60 us vs ~2 us, measured here.
_GROUP_COST_PAGES = 32


def _group_by_length(pages: list[int]) -> list[tuple[int, int]]:
    """Split neighbours (best sorted by length) into ranges, each padded to its own
    longest, minimising pages gathered + _GROUP_COST_PAGES per range: an exact dynamic
    programme over the boundaries between runs of equal page counts. (Ranges first cut
    within 2x and then merged gathered ~38% padding on the throughput workload; this ~10%.)"""
    if not pages:
        return []
    cuts = [0, *(i for i in range(1, len(pages)) if pages[i] != pages[i - 1]), len(pages)]
    best = [0] + [math.inf] * (len(cuts) - 1)  # cost of ranges covering pages[: cuts[b]]
    prev = [0] * len(cuts)
    for b in range(1, len(cuts)):
        top = 0  # longest in pages[cuts[a] : cuts[b]]; each run holds equal counts
        for a in range(b - 1, -1, -1):
            top = max(top, pages[cuts[a]])
            cost = best[a] + _GROUP_COST_PAGES + (cuts[b] - cuts[a]) * top
            if cost < best[b]:
                best[b], prev[b] = cost, a
    ranges, b = [], len(cuts) - 1
    while b > 0:
        ranges.append((cuts[prev[b]], cuts[b]))
        b = prev[b]
    return ranges[::-1]


def _prefill_seq(c: SeqChunk, offset: int) -> PrefillSeq:
    n = len(c.token_ids)
    mask = None
    if c.start_pos > 0:  # query i sits at position start_pos + i: keys 0..start_pos + i
        rows = torch.arange(n)[:, None] + c.start_pos
        mask = torch.arange(c.start_pos + n)[None, :] <= rows
    ids = torch.tensor(c.page_table, dtype=torch.long)
    return PrefillSeq(offset, n, c.start_pos, ids, mask)


def _decode_group(decodes: list[SeqChunk], start: int, page_size: int) -> DecodeGroup:
    table, lens = _padded_pages(decodes, page_size, torch.long)
    live = torch.arange(table.shape[1] * page_size)[None, :] < torch.tensor(lens)[:, None]
    mask = torch.zeros(live.shape).masked_fill_(~live, float("-inf"))
    return DecodeGroup(start, len(decodes), table, mask)


def new_kv_pools(
    num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V pools: views [num_pages, kv_heads, head_dim, page_size] and
    [num_pages, kv_heads, page_size, head_dim] into one tensor of whole pages. Zeros
    (lazily mapped by the OS), not empty: padding slots are masked or skipped, but NaN
    garbage * 0 is NaN."""
    pages = torch.zeros(num_pages, 2, kv_heads, head_dim * page_size, dtype=dtype)
    k_pool = pages[:, 0].view(num_pages, kv_heads, head_dim, page_size)
    v_pool = pages[:, 1].view(num_pages, kv_heads, page_size, head_dim)
    return k_pool, v_pool


def write_kv(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: AttentionContext,
) -> None:
    """Store new K/V [T, KVH, D] at their slots (page, offset within the page), in the
    pools' dtype (bf16 pools: rounded to nearest even)."""
    v_pool[ctx.slot_pages, :, ctx.slot_offsets] = v.to(v_pool.dtype)
    k_pool.transpose(2, 3)[ctx.slot_pages, :, ctx.slot_offsets] = k.to(k_pool.dtype)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    ctx: AttentionContext,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D] for the new tokens -> out [T, H, D].

    The new K/V must already be in the pools (write_kv, or ops.rope_store_kv): every
    query reads its full context (cached prefix + this step's tokens) from them.
    """
    out = torch.empty_like(q)
    for p in ctx.prefills:
        qs = slice(p.q_start, p.q_start + p.q_len)
        out[qs] = _prefill(q[qs], k[qs], v[qs], k_pool, v_pool, p, ctx.workspace)
    for g in ctx.decode_groups:
        qs = slice(g.start, g.start + g.size)
        mask = g.kv_head_mask(v_pool.shape[1])
        out[qs] = _decode(q[qs], k_pool, v_pool, g.page_table, mask, ctx.workspace)
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
    """q [B, H, D] -> out [B, H, D] (contiguous) through the C kernel, reading K/V pages
    in place."""
    assert out.is_contiguous() and k_pool.stride(0) == v_pool.stride(0)
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()  # each row's heads must be one block; rows may be apart
    b, h, d = q.shape
    _, kvh, page_size, _ = v_pool.shape
    bf16 = v_pool.dtype == torch.bfloat16  # kv_dtype bf16: the kernel built for its pages
    attend = kernels.paged_decode_attention_bf16 if bf16 else kernels.paged_decode_attention
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


def gather_values(pool: torch.Tensor, pages: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """v_pool[pages] into a reused buffer, head-major: [KVH, len(pages) * page_size, D]."""
    _, kvh, page_size, d = pool.shape
    picked = ws.take("v_pages", (pages.numel(), kvh, page_size, d), pool.dtype)
    torch.index_select(pool, 0, pages, out=picked)
    out = ws.take("v", (kvh, pages.numel(), page_size, d), torch.float32)  # bf16 pools widen
    return out.copy_(picked.transpose(0, 1)).view(kvh, -1, d)


def gather_keys(pool: torch.Tensor, pages: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """k_pool[pages] like gather_values: [KVH, len(pages) * page_size, D] (token-major)."""
    _, kvh, d, page_size = pool.shape
    picked = ws.take("k_pages", (pages.numel(), kvh, d, page_size), pool.dtype)
    torch.index_select(pool, 0, pages, out=picked)
    out = ws.take("k", (kvh, pages.numel(), page_size, d), torch.float32)
    return out.copy_(picked.permute(1, 0, 3, 2)).view(kvh, -1, d)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    p: PrefillSeq,
    ws: Workspace,
) -> torch.Tensor:
    """One sequence's chunk: q [L, H, D] -> [L, H, D]."""
    if p.mask is None:  # no cached prefix: attend to this chunk's own K/V
        kh, vh = k.transpose(0, 1), v.transpose(0, 1)
    else:
        ctx_len = p.start_pos + p.q_len
        kh = gather_keys(k_pool, p.page_ids, ws)[:, :ctx_len]
        vh = gather_values(v_pool, p.page_ids, ws)[:, :ctx_len]
    # 4-D [1, heads, L, D]: with 3-D inputs SDPA falls back to its math kernel, which
    # materialises L x L scores (4x slower at 2k tokens) instead of flash attention
    qh, kh, vh = q.transpose(0, 1)[None], kh[None], vh[None]
    if p.mask is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=p.mask, enable_gqa=True)
    return out[0].transpose(0, 1)


def _decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    mask: torch.Tensor,
    ws: Workspace,
) -> torch.Tensor:
    """q [B, H, D] -> [B, H, D] for one new token per sequence; mask [KVH * B, 1, S]."""
    b, h, d = q.shape
    kvh = v_pool.shape[1]
    g = h // kvh
    # One gather per pool for the whole batch: [KVH, B * S, D], viewed as KVH * B
    # contiguous [S, D] blocks (one per KV head and sequence) for bmm
    flat = page_table.flatten()
    k = gather_keys(k_pool, flat, ws).view(kvh * b, -1, d)
    v = gather_values(v_pool, flat, ws).view(kvh * b, -1, d)
    # GQA without repeating K/V: a KV head's G query heads are its G query rows
    qg = q.view(b, kvh, g, d).transpose(0, 1).reshape(kvh * b, g, d)
    # scaled scores plus the padding mask in one call: [KVH * B, G, S]
    scores = torch.baddbmm(mask, qg, k.transpose(1, 2), alpha=d**-0.5)
    out = torch.bmm(torch.softmax(scores, dim=-1), v)  # [KVH * B, G, D]
    return out.view(kvh, b, g, d).transpose(0, 1).reshape(b, h, d)
