"""Load model weights (GGUF or a Hugging Face safetensors folder) as fp32 tensors.

GGUF tensors are dequantised once; the built model's state dict (fused projections, fp32)
and its config are cached as safetensors under cache_dir()/weights, keyed by the source
file's path, size and mtime, so a repeat load only memory-maps one file. w8a8 weights
take the file's own Q8_0 / Q5_0 / Q4_0 blocks as they are (engine/gguf_blocks.py), "blocks"
weights those, Q4_1 and Q4_K compact (engine/block_weights.py).
"""

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.block_weights import FILE_TYPES, RECORDS_VERSION, BlockWeight, FileBlocks
from engine.cache_files import atomic_path, cache_path
from engine.gguf_blocks import attach_blocks, attach_records, int8_blocks, model_records
from engine.model_registry import ResolvedModel
from engine.models import build_model
from engine.models.config import ROPE_FREQS, ModelConfig, gguf_config, hf_config
from engine.ops import TorchOps
from engine.quant import W8A8_GROUP, Int8Weight

BLOCK_FORMATS = ("w8a8", "auto")  # weight formats that take a GGUF's own int8 blocks


def load_model(
    resolved: ResolvedModel, ops: TorchOps | None = None
) -> tuple[ModelConfig, torch.nn.Module]:
    """Read config and weights, build the model (eval mode, fp32) to run through ops (the
    runner's choice; torch ops when only the weights are wanted)."""
    path = Path(resolved.path)
    cached = cache_path(path, "weights", ".safetensors") if resolved.format == "gguf" else None
    hit = _load_cached(cached) if cached else None
    if hit is not None:
        config, state = hit
        model = build_model(config, ops or TorchOps())
        # The cache holds the model's own (fused) state dict: no copies, just mmap.
        model.load_state_dict(state, strict=True, assign=True)
    else:
        config, state = _load_gguf(path) if cached else _load_hf(path)
        model = build_model(config, ops or TorchOps())
        model.load_weights(state)
        if cached:
            _save_cached(model, config, cached)
    if cached and ops is not None and ops.weights in BLOCK_FORMATS:
        attach_blocks(model, _kept_blocks(path, config))
    if cached and ops is not None and ops.weights == "blocks":
        attach_records(model, _records(path, config, model))
    return config, model.eval().requires_grad_(False)


def _load_cached(cached: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]] | None:
    if not cached.is_file():
        return None
    try:
        with safe_open(cached, "pt") as f:
            config = ModelConfig(**json.loads(f.metadata()["config"]))
        return config, load_file(cached)
    except Exception:  # a corrupt or foreign cache file is rebuilt, never fatal
        cached.unlink(missing_ok=True)
        return None


def _save_cached(model: torch.nn.Module, config: ModelConfig, cached: Path) -> None:
    state, seen = {}, set()
    for name, t in model.state_dict().items():
        # safetensors refuses tensors sharing storage: copy only those (an untied head
        # filled from the embedding); copying everything would double peak memory
        shared = t.untyped_storage().data_ptr() in seen
        seen.add(t.untyped_storage().data_ptr())
        state[name] = t.detach().clone() if shared else t.detach().contiguous()
    # a read-only or full cache dir is no error: still serve, just slower next time
    with contextlib.suppress(OSError), atomic_path(cached) as tmp:
        save_file(state, tmp, metadata={"config": json.dumps(asdict(config))})


# ---- GGUF ----------------------------------------------------------------------------


_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
    return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (made for its interleaved rope) so the
    weights work with the half-split (NEOX / Hugging Face) rope our model uses."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize_gguf(reader, config: ModelConfig) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        if t.name == ROPE_FREQS:  # read into the config (rope scaling), not a weight
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # ggml lists dims inner-first
        w = _oriented(w, t.name, config)
        state[_hf_name(t.name)] = torch.from_numpy(np.array(w, dtype=np.float32))  # own copy
    return state


def _oriented(rows: np.ndarray, gguf_name: str, config: ModelConfig) -> np.ndarray:
    """A weight's rows (or per-row block scales) in our order: only llama's converter
    permutes Q/K; qwen2 is stored un-permuted (NEOX rope)."""
    if config.arch == "llama" and ".attn_q." in gguf_name:
        return _unpermute(rows, config.num_heads)
    if config.arch == "llama" and ".attn_k." in gguf_name:
        return _unpermute(rows, config.num_kv_heads)
    return rows


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
            q, scale = (torch.from_numpy(np.array(_oriented(b, t.name, config))) for b in blocks)
            kept[_hf_name(t.name)] = Int8Weight(q, scale, W8A8_GROUP)
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
            rows = _oriented(np.asarray(t.data), t.name, config)
            found[_hf_name(t.name)] = (t.tensor_type, np.ascontiguousarray(rows))
    return found


def _load_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    config = gguf_config(reader)
    return config, _dequantize_gguf(reader, config)


# ---- Hugging Face folder -------------------------------------------------------------


def _load_hf(folder: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config = hf_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    state = {}
    for f in files:
        for name, t in load_file(f).items():
            state[name.removeprefix("model.")] = t.float()
    return config, state
