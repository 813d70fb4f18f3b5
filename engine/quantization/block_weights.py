"""A GGUF's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks kept compact ("blocks" weights).

Batch-1 decode is bound by the bytes each weight takes, so these weights keep the file's
own bits (4.5 to 8.5 per weight) instead of w8a8's 9: engine/csrc/gemm_blocks.c
multiplies them with int8 activations and unpacks the codes in registers. Each panel of
16 output rows holds one block type, in records of 16 rows x 32 k values (the layout is
described in gemm_blocks.c); fused projections (q|k|v, gate|up) may mix types, as
llama.cpp's files do (Qwen2.5's v rows are Q8_0 beside Q5_0 q and k). A Q4_K sub-block
of 32 is Q4_1's form with fp32 scale and min (6 bits a weight where the file has 4.5: its
6-bit sub-scales times the fp16 super-block scales are exact in fp32, not in fp16). A
Q6_K record keeps the super-block's fp16 d and the two int8 sub-scales (per 16 k) of each
row, the 6-bit codes as 4-bit chunks plus 2 high bits: 7 bits a weight where the file has
6.5625 (Q8_0, its requantization before, took 8.5). A part the file holds in another type
(F16, Q5_K) is requantized to Q8_0 as llama.cpp would.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT
from gguf.quants import Q4_K as GGUF_Q4_K
from gguf.quants import quantize

from engine.quantization.quant import quantize_rows

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = range(6)  # record types (gemm_blocks.c)
RECORD_BYTES = (288, 320, 352, 544, 384, 448)
BLOCK_BYTES = (18, 20, 22, 34, 144, 210)  # the file's, per block of 32 (K-quants: 256) values
OFFSETS = (-8, 0, -16, 0, 0, -32)  # Q4_0 / Q5_0 / Q6_K: w = d * (q + offset)
TYPE_NAMES = ("q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k")
FILE_TYPES = {
    QT.Q4_0: Q4_0, QT.Q4_1: Q4_1, QT.Q5_0: Q5_0, QT.Q8_0: Q8_0, QT.Q4_K: Q4_K, QT.Q6_K: Q6_K
}  # fmt: skip
GROUP, PANEL = 32, 16
RECORDS_VERSION = 3  # in the records cache's name: bump when the layout or the types change
FileBlocks = tuple[QT, np.ndarray]  # a tensor's type and raw rows [N, bytes per row]
# Q6_K records: where a high-bit byte holds chunk c's 2 bits, [c % 2, low / high nibble]
_HIGH_SHIFTS = np.array([[0, 2], [4, 6]], np.uint8).reshape(2, 2, 1)


@dataclass
class BlockWeight:
    data: torch.Tensor  # uint8: every panel's records, panel after panel
    panels: torch.Tensor  # int64 [N / 16]: byte offset of the panel's records << 4 | type
    k: int

    is_panels = True  # the C kernel's own layout (engine/quantization/packing.is_panels)

    @property
    def shape(self) -> tuple[int, int]:
        return self.panels.numel() * PANEL, self.k

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.panels.nbytes

    def type_counts(self) -> dict[str, int]:
        """Output rows per record type."""
        types = (self.panels & 15).tolist()
        return {TYPE_NAMES[t]: PANEL * types.count(t) for t in sorted(set(types))}

    def dequantize(self) -> torch.Tensor:
        """The fp32 [N, K] weight the records stand for (exactly the file's values)."""
        rows, types = [], (self.panels & 15).tolist()
        offsets = (self.panels >> 4).tolist()
        start = 0
        while start < len(types):  # runs of panels of one type
            end = start
            while end < len(types) and types[end] == types[start]:
                end += 1
            size = (end - start) * (self.k // GROUP) * RECORD_BYTES[types[start]]
            raw = self.data[offsets[start] : offsets[start] + size].numpy()
            rows.append(_dequantize_records(raw, types[start], end - start, self.k))
            start = end
        return torch.from_numpy(np.concatenate(rows))


def blocks_reference(x: torch.Tensor, w: BlockWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T with x quantized as the C kernel does (the torch path and its reference)."""
    return F.linear(quantize_rows(x, GROUP), w.dequantize(), bias)


def from_parts(
    parts: list[FileBlocks | None], rows: list[int], weight: torch.Tensor
) -> BlockWeight:
    """One projection's BlockWeight from its parts' file blocks (rows stacked as in the
    fused weight); a part with none (None) is requantized to Q8_0 from weight's rows."""
    records, start = [], 0
    for part, n in zip(parts, rows, strict=True):
        if part is None:
            w = weight[start : start + n].detach().float().numpy()
            part = (QT.Q8_0, quantize(w, QT.Q8_0))
        records.append(_records(*_codes(*part)))
        start += n
    return join(records, weight.shape[1])


def join(parts: list[tuple[int, np.ndarray]], k: int) -> BlockWeight:
    """Records of row ranges ((type, [panels, bytes per panel])) as one weight."""
    index, offset = [], 0
    for kind, rec in parts:
        index += [(offset + p * rec.shape[1]) << 4 | kind for p in range(rec.shape[0])]
        offset += rec.size
    data = np.concatenate([rec.reshape(-1) for _, rec in parts])
    return BlockWeight(torch.from_numpy(data), torch.tensor(index, dtype=torch.int64), k)


def _codes(qtype: QT, raw: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
    """A tensor's raw blocks -> (type, codes [N, K] (Q8_0 int8, else unsigned), d [N, K / 32]
    fp16 (Q4_K fp32), m (Q4_1's / Q4_K's mins, Q6_K's int8 scales [N, K / 16]) or None)."""
    kind, n = FILE_TYPES[qtype], raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[kind])
    if kind == Q4_K:
        return (kind, *_q4_k_codes(blocks, n))
    if kind == Q6_K:
        return (kind, *_q6_k_codes(blocks, n))
    d, m = blocks[:, :2].copy().view(np.float16), None
    if kind == Q8_0:
        q = blocks[:, 2:].copy().view(np.int8)
    else:
        qs = blocks[:, -16:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1)
        if kind == Q4_1:
            m = blocks[:, 2:4].copy().view(np.float16).reshape(n, -1)
        if kind == Q5_0:
            high = blocks[:, 2:6].copy().view("<u4") >> np.arange(32, dtype=np.uint32) & 1
            q |= high.astype(np.uint8) << 4
    return kind, q.reshape(n, -1), d.reshape(n, -1), m


def _q4_k_codes(blocks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K super-blocks (fp16 d and dmin, 8 packed 6-bit scales and mins, 4-bit codes
    by 64: 32 low nibbles then 32 high) -> codes, d * scale and -dmin * min per 32, as
    gguf's dequantization computes them (so d * q + m is its value exactly)."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = GGUF_Q4_K.get_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 15).reshape(n, -1)
    return (
        q,
        (d * sc.astype(np.float32)).reshape(n, -1),
        -(dmin * mn.astype(np.float32)).reshape(n, -1),
    )


def _q6_k_codes(blocks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K super-blocks (128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16
    d), unpacked in gguf's order -> codes 0..63, d per 32 and the int8 scale per 16."""
    ql = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 4, 1
    )
    q = (ql & 15).reshape(n, -1) | (qh & 3).reshape(n, -1) << 4
    d = np.repeat(blocks[:, 208:].copy().view(np.float16), 8, axis=1)
    return q, d.reshape(n, -1), blocks[:, 192:208].copy().view(np.int8).reshape(n, -1)


def _records(
    kind: int, q: np.ndarray, d: np.ndarray, m: np.ndarray | None
) -> tuple[int, np.ndarray]:
    """Codes and scales [N, ...] -> (type, records [N / 16, K / 32 * record bytes])."""
    n, k = q.shape
    p, g = n // PANEL, k // GROUP

    def per_group(s: np.ndarray) -> np.ndarray:  # [N, G] fp16 (fp32) -> [P, G, 32 (64)] bytes
        return s.reshape(p, PANEL, g).transpose(0, 2, 1).copy().view(np.uint8)

    fields = [per_group(d)] + ([per_group(m)] if m is not None and kind != Q6_K else [])
    if kind == Q6_K:  # scales [p j g h] -> [p g h j]; high bits [p j g c2 c h t] -> [p g c2 j t]
        fields.append(m.reshape(p, PANEL, g, 2).transpose(0, 2, 3, 1).copy().view(np.uint8))
        two = (q.reshape(p, PANEL, g, 2, 2, 2, 4) >> 4 & 3) << _HIGH_SHIFTS
        fields.append(two.sum(axis=(4, 5), dtype=np.uint8).transpose(0, 2, 3, 1, 4))
    if kind == Q8_0:  # [p j g c t] -> [p g c j t]
        fields.append(q.view(np.uint8).reshape(p, PANEL, g, 8, 4).transpose(0, 2, 3, 1, 4))
    else:  # k = g * 32 + c * 8 + h * 4 + t
        q6 = q.reshape(p, PANEL, g, 4, 2, 4)
        if kind == Q5_0:  # [p g c h j t] bits -> one u64 per (c, h)
            bits = (q6 >> 4 & 1).transpose(0, 2, 3, 4, 1, 5).reshape(p, g, 4, 2, 64)
            fields.append(np.packbits(bits, axis=-1, bitorder="little"))
        nib = (q6 & 15).transpose(0, 2, 3, 1, 5, 4)  # [p g c j t h]
        fields.append(nib[..., 0] | nib[..., 1] << 4)
    rec = np.concatenate([f.reshape(p, g, -1) for f in fields], axis=2)
    assert rec.shape[2] == RECORD_BYTES[kind]
    return kind, rec.reshape(p, -1)


def _dequantize_records(raw: np.ndarray, kind: int, p: int, k: int) -> np.ndarray:
    """Records of p panels of one type -> fp32 [p * 16, k]."""
    g = k // GROUP
    rec = raw.reshape(p, g, RECORD_BYTES[kind])
    wide = 2 if kind == Q4_K else 1  # fp32 scales, else fp16
    dtype = np.float32 if wide == 2 else np.float16
    scale = lambda at: rec[..., at : at + 32 * wide].copy().view(dtype).astype(np.float32)  # noqa: E731
    if kind == Q8_0:
        q = rec[..., 32:].copy().view(np.int8).reshape(p, g, 8, PANEL, 4).transpose(0, 3, 1, 2, 4)
    else:
        cd = rec[..., -256:].reshape(p, g, 4, PANEL, 4)
        nib = np.stack([cd & 15, cd >> 4], axis=-1)  # [p g c j t h]
        q = nib.transpose(0, 3, 1, 2, 5, 4).astype(np.int16)  # [p j g c h t]
        if kind == Q5_0:
            bits = np.unpackbits(rec[..., 32:96].reshape(p, g, 4, 2, 8), axis=-1, bitorder="little")
            q |= (
                bits.reshape(p, g, 4, 2, PANEL, 4).transpose(0, 4, 1, 2, 3, 5).astype(np.int16) << 4
            )
        if kind == Q6_K:  # [p g c2 j t] bytes -> [p j g (c2 c) h t] 2-bit values
            two = rec[..., 64:192].reshape(p, g, 2, 1, 1, PANEL, 4) >> _HIGH_SHIFTS[..., None]
            q |= (two & 3).transpose(0, 5, 1, 2, 3, 4, 6).reshape(q.shape).astype(np.int16) << 4
    q = q.reshape(p * PANEL, k).astype(np.float32) + OFFSETS[kind]
    if kind == Q6_K:  # d * sc per 16 k, in fp32 as gguf computes it
        d, sc = scale(0).transpose(0, 2, 1), rec[..., 32:64].view(np.int8).reshape(p, g, 2, PANEL)
        ds = d.reshape(p, PANEL, g, 1) * sc.transpose(0, 3, 1, 2).astype(np.float32)
        return np.repeat(ds.reshape(p * PANEL, 2 * g), GROUP // 2, axis=1) * q
    d = scale(0).transpose(0, 2, 1).reshape(p * PANEL, g)
    w = q * np.repeat(d, GROUP, axis=1)
    if kind in (Q4_1, Q4_K):
        mins = scale(32 * wide).transpose(0, 2, 1).reshape(p * PANEL, g)
        w += np.repeat(mins, GROUP, axis=1)
    return w
