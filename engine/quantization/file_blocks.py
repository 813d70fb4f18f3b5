"""A GGUF's own blocks for the formats that keep them, read once and cached beside the fp32
weights (engine/weights.py): for w8a8 (and auto), the Q8_0 / Q5_0 / Q4_0 blocks as plain
w8a8 weights; for "blocks" (and auto on the C kernels), every kept type re-laid into
records. Reading them means parsing the whole GGUF; a later start maps one file instead."""

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine.cache_files import atomic_path, cache_path
from engine.gguf_names import hf_name, oriented
from engine.models.config import ModelConfig
from engine.quantization.block_weights import FILE_TYPES, RECORDS_VERSION, BlockWeight, FileBlocks
from engine.quantization.gguf_blocks import (
    attach_blocks,
    attach_kept,
    attach_records,
    int8_blocks,
    model_records,
)
from engine.quantization.quant import W8A8_GROUP, Int8Weight

BLOCK_FORMATS = ("w8a8", "auto")  # weight formats that take a GGUF's own int8 blocks


def attach_file_blocks(
    model: torch.nn.Module, path: Path, config: ModelConfig, weights: str, native: bool
) -> None:
    """Give the model's projections the GGUF's own blocks the weight format takes, if any,
    for pack_weights to use. native: the C kernels run here; auto on torch is fp32, so it
    reads no records."""
    if weights in BLOCK_FORMATS:
        attach_blocks(model, _kept_blocks(path, config))
    if weights == "blocks":
        attach_records(model, _records(path, config, model))
    if weights == "auto" and native:  # both forms compete (memory_roofline.KeptBlocks)
        attach_kept(model, _records(path, config, model))


def _kept_blocks(path: Path, config: ModelConfig) -> dict[str, Int8Weight]:
    """The file's kept blocks, cached beside the fp32 weights: reading them means parsing
    the whole GGUF (its vocabulary: ~9 s for Qwen2.5-0.5B), the cache only maps a file."""
    cached = cache_path(path, "weights", ".blocks.safetensors")
    flat = _cached_tensors(cached, lambda: _flat(_gguf_blocks(path, config), ("q", "scale")))
    names = [n.removesuffix(".q") for n in flat if n.endswith(".q")]
    return {n: Int8Weight(flat[f"{n}.q"], flat[f"{n}.scale"], W8A8_GROUP) for n in names}


def _flat(weights: dict, parts: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {
        f"{n}.{part}": torch.as_tensor(getattr(w, part))
        for n, w in weights.items()
        for part in parts
    }


def _cached_tensors(
    cached: Path, build: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The tensors saved at `cached`, or build() saved there first (a corrupt or foreign
    cache file is rebuilt, never fatal; an unwritable cache folder only costs the saving)."""
    if cached.is_file():
        try:
            return load_file(cached)
        except Exception:
            cached.unlink(missing_ok=True)
    flat = build()
    with contextlib.suppress(OSError), atomic_path(cached) as tmp:
        save_file(flat, tmp)
    return flat


def _gguf_blocks(path: Path, config: ModelConfig) -> dict[str, Int8Weight]:
    """The file's tensors stored in blocks w8a8 takes as they are (Hugging Face names)."""
    from gguf import GGUFReader

    kept = {}
    for t in GGUFReader(path).tensors:
        if t.name == "token_embd.weight" and not config.tie_embeddings:
            continue  # only a tied LM head multiplies by the embedding
        blocks = int8_blocks(t.data, t.tensor_type)
        if blocks is not None:
            q, scale = (torch.from_numpy(np.array(oriented(b, t.name, config))) for b in blocks)
            kept[hf_name(t.name)] = Int8Weight(q, scale, W8A8_GROUP)
    return kept


def _records(path: Path, config: ModelConfig, model: torch.nn.Module) -> dict[str, BlockWeight]:
    """model_records of the file, cached as _kept_blocks' are: a later start maps one file
    instead of parsing the GGUF and re-laying every block (~11 s for Qwen2.5-0.5B)."""
    cached = cache_path(path, "weights", f".records{RECORDS_VERSION}.safetensors")

    def build() -> dict[str, torch.Tensor]:
        return _flat(model_records(model, _file_blocks(path, config)), ("data", "panels", "k"))

    flat = _cached_tensors(cached, build)
    names = [n.removesuffix(".data") for n in flat if n.endswith(".data")]
    return {
        n: BlockWeight(flat[f"{n}.data"], flat[f"{n}.panels"], int(flat[f"{n}.k"])) for n in names
    }


def _file_blocks(path: Path, config: ModelConfig) -> dict[str, FileBlocks]:
    """The file's tensors in block types "blocks" weights keep (Hugging Face names)."""
    from gguf import GGUFReader

    found = {}
    for t in GGUFReader(path).tensors:
        if t.tensor_type in FILE_TYPES and (t.name != "token_embd.weight" or config.tie_embeddings):
            rows = oriented(np.asarray(t.data), t.name, config)
            found[hf_name(t.name)] = (t.tensor_type, np.ascontiguousarray(rows))
    return found
