"""A GGUF's own quantized blocks as w8a8 weights, with no fp32 round trip.

Q8_0, Q5_0 and Q4_0 blocks are 32 signed integers (8, 5 or 4 bits) times one fp16 scale:
exactly w8a8's layout (engine/quantization/quant.py: int8 values, one scale per 32 k
values of a row), so `weights: w8a8` can multiply by the file's own weights instead of
requantizing their fp32 dequantization. Other types (Q4_1's offsets, the K-quants'
16-value sub-scales) have no exact w8a8 form and are requantized as before. Groups run
along the input dim, so the fused projections (q|k|v, gate|up: rows concatenated) keep
every block whole.

`weights: blocks` keeps Q4_1, Q4_K and Q6_K too, and the 4- to 6-bit codes compact
(engine/quantization/block_weights.py): model_records / attach_records below.
"""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.layers.linear import DeclaresProjections
from engine.quantization.block_weights import PANEL, BlockWeight, FileBlocks, from_parts
from engine.quantization.memory_roofline import KeptBlocks
from engine.quantization.quant import W8A8_GROUP, Int8Weight

KEPT_TYPES = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q4_0)


def int8_blocks(
    data: np.ndarray, qtype: GGMLQuantizationType
) -> tuple[np.ndarray, np.ndarray] | None:
    """A tensor's raw blocks ([rows, bytes per row], as GGUFReader gives them) -> its int8
    values [rows, K] and fp32 scales [rows, K / 32]; None for a type kept otherwise."""
    if qtype not in KEPT_TYPES:
        return None
    block, size = GGML_QUANT_SIZES[qtype]
    assert block == W8A8_GROUP
    rows, raw = data.shape[0], np.ascontiguousarray(data).reshape(-1, size)
    scale = raw[:, :2].copy().view(np.float16).astype(np.float32)  # every kept type starts so
    q = raw[:, 2:].copy().view(np.int8) if qtype == GGMLQuantizationType.Q8_0 else _nibbles(raw)
    return q.reshape(rows, -1), scale.reshape(rows, -1)


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """Q4_0 / Q5_0 blocks' signed values: 16 bytes of nibbles (values 0-15 low, 16-31
    high), Q5_0 with a fifth bit per value in 4 bytes before them; offset 8 (16)."""
    qs = raw[:, -16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    if raw.shape[1] == 16 + 2:  # Q4_0
        return (q.astype(np.int16) - 8).astype(np.int8)
    high = raw[:, 2:6].copy().view("<u4") >> np.arange(32, dtype=np.uint32) & 1
    return ((q | (high.astype(np.uint8) << 4)).astype(np.int16) - 16).astype(np.int8)


def attach_blocks(model: DeclaresProjections, blocks: dict[str, Int8Weight]) -> int:
    """Give each projection (and the LM head) whose every part the file holds as kept
    blocks those blocks (Hugging Face names -> plain w8a8), for pack_weights to use;
    returns how many got them."""
    attached = 0
    for name, lin in model.projections().items():
        parts = [blocks.get(f"{source}.weight") for source, _ in lin.sources(name)]
        if all(p is not None for p in parts):
            lin.blocks = _rows_joined(parts)
            attached += 1
    if model.lm_head is not None:
        model.lm_head.blocks = blocks.get("lm_head.weight")
        attached += model.lm_head.blocks is not None
    else:
        model.head_blocks = blocks.get("embed_tokens.weight")
        attached += model.head_blocks is not None
    return attached


def _rows_joined(parts: list[Int8Weight]) -> Int8Weight:
    if len(parts) == 1:
        return parts[0]
    q = torch.cat([p.q for p in parts])
    return Int8Weight(q, torch.cat([p.scale for p in parts]), W8A8_GROUP)


def model_records(
    model: DeclaresProjections, files: dict[str, FileBlocks]
) -> dict[str, BlockWeight]:
    """ "blocks" weights for each projection (fused parts stacked) and the LM head ("head")
    the file holds, in part at least, in a type with records (block_weights.FILE_TYPES; files:
    Hugging Face names -> type and raw rows); a projection with none stays out (w8a8)."""
    found = {}
    for name, lin in model.projections().items():
        sources = lin.sources(name)
        parts = [files.get(f"{source}.weight") for source, _ in sources]
        rows = [n for _, n in sources]
        if any(p is not None for p in parts) and all(n % PANEL == 0 for n in rows):
            found[name] = from_parts(parts, rows, lin.weight)
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    blocks = files.get("embed_tokens.weight" if model.lm_head is None else "lm_head.weight")
    if blocks is not None and head.weight.shape[0] % PANEL == 0:
        found["head"] = from_parts([blocks], [head.weight.shape[0]], head.weight)
    return found


def attach_records(model: DeclaresProjections, records: dict[str, BlockWeight]) -> None:
    """model_records' weights onto their projections, for pack_weights to use."""
    for name, lin in model.projections().items():
        lin.blocks = records.get(name)
    if model.lm_head is not None:
        model.lm_head.blocks = records.get("head")
    else:
        model.head_blocks = records.get("head")


def attach_kept(model: DeclaresProjections, records: dict[str, BlockWeight]) -> None:
    """For weights "auto": model_records' weights beside the int8 blocks attach_blocks gave
    (KeptBlocks), so auto may pick either; a projection without records keeps its own."""
    for name, lin in model.projections().items():
        if name in records:
            lin.blocks = KeptBlocks(lin.blocks, records[name])
    if "head" in records and model.lm_head is not None:
        model.lm_head.blocks = KeptBlocks(model.lm_head.blocks, records["head"])
    elif "head" in records:
        model.head_blocks = KeptBlocks(model.head_blocks, records["head"])
