"""Load model weights (GGUF or a Hugging Face safetensors folder) as fp32 tensors.

GGUF tensors are dequantised once; the built model's state dict (fused projections, fp32)
and its config are cached as safetensors under cache_dir()/weights, keyed by the source
file's path, size and mtime, so a repeat load only memory-maps one file. A GGUF's own
blocks (w8a8, blocks, auto) come from engine/quantization/file_blocks.py.
"""

import contextlib
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.cache_files import atomic_path, cache_path
from engine.gguf_names import hf_name, oriented
from engine.model_registry import ResolvedModel
from engine.models import build_model
from engine.models.config import ROPE_FREQS, ModelConfig, gguf_config, hf_config
from engine.ops import TorchOps
from engine.quantization.file_blocks import attach_file_blocks


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
    if cached and ops is not None:
        attach_file_blocks(model, path, config, ops.weights, native=ops.kernels is not None)
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


def _dequantize_gguf(reader, config: ModelConfig) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        if t.name == ROPE_FREQS:  # read into the config (rope scaling), not a weight
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # ggml lists dims inner-first
        w = oriented(w, t.name, config)
        state[hf_name(t.name)] = torch.from_numpy(np.array(w, dtype=np.float32))  # own copy
    return state


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
