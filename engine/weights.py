"""Load model weights (GGUF or a Hugging Face safetensors folder) as fp32 tensors.

GGUF tensors are dequantised once; the built model's state dict (fused projections, fp32)
and its config are cached as safetensors under cache_dir()/weights, keyed by the source
file's path, size and mtime, so a repeat load only memory-maps one file.
"""

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.model_registry import ResolvedModel, cache_dir

_CACHE_VERSION = "2"  # bump when the cached tensor layout changes


@dataclass
class ModelConfig:
    arch: str  # "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    max_position: int  # the model's context length
    tie_embeddings: bool
    attention_bias: bool


SUPPORTED_ARCHS = ("llama", "qwen2")


def load_model(resolved: ResolvedModel) -> tuple[ModelConfig, torch.nn.Module]:
    """Read config and weights, build the model (eval mode, fp32)."""
    from engine.models import build_model  # late import: models import this module

    path = Path(resolved.path)
    if resolved.format != "gguf":
        config, state = _load_hf(path)
        model = build_model(config)
        model.load_weights(state)
        return config, model.eval().requires_grad_(False)
    cached = cache_path(path, "weights", ".safetensors")
    hit = _load_cached(cached)
    if hit is not None:
        config, state = hit
        model = build_model(config)
        # The cache holds the model's own (fused) state dict: no copies, just mmap.
        model.load_state_dict(state, strict=True, assign=True)
        return config, model.eval().requires_grad_(False)
    config, state = _load_gguf(path)
    model = build_model(config)
    model.load_weights(state)
    _save_cached(model, config, cached)
    return config, model.eval().requires_grad_(False)


def cache_path(source: Path, kind: str, suffix: str) -> Path:
    """A cache file for data converted from `source`; changes when the source does."""
    st = source.stat()
    key = f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}:{_CACHE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / kind / f"{source.stem}-{digest}{suffix}"


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
    with contextlib.suppress(OSError):
        _save_atomic(state, cached, {"config": json.dumps(asdict(config))})


# ---- GGUF ----------------------------------------------------------------------------


def _gguf_fields(reader) -> dict:
    """Scalar and string metadata (not the big tokenizer arrays)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.pre":
            continue
        out[key] = field.contents()
    return out


def gguf_config(reader) -> ModelConfig:
    meta = _gguf_fields(reader)
    arch = meta["general.architecture"]
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHS}")
    names = {t.name for t in reader.tensors}
    hidden = int(meta[f"{arch}.embedding_length"])
    heads = int(meta[f"{arch}.attention.head_count"])
    vocab = meta.get(f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(meta[f"{arch}.block_count"]),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        max_position=int(meta[f"{arch}.context_length"]),
        tie_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
    )


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
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # ggml lists dims inner-first
        # Only llama's converter permutes Q/K; qwen2 is stored un-permuted (NEOX rope).
        if config.arch == "llama" and ".attn_q." in t.name:
            w = _unpermute(w, config.num_heads)
        elif config.arch == "llama" and ".attn_k." in t.name:
            w = _unpermute(w, config.num_kv_heads)
        state[_hf_name(t.name)] = torch.from_numpy(np.array(w, dtype=np.float32))  # own copy
    return state


def _save_atomic(state: dict[str, torch.Tensor], target: Path, meta: dict[str, str]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(state, tmp, metadata=meta)
        os.replace(tmp, target)  # readers never see a half-written cache file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    config = gguf_config(reader)
    return config, _dequantize_gguf(reader, config)


# ---- Hugging Face folder -------------------------------------------------------------


def hf_config(folder: Path) -> ModelConfig:
    cfg = json.loads((folder / "config.json").read_text())
    arch = cfg.get("model_type", "llama")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHS}")
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    return ModelConfig(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta", 10000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=cfg.get("max_position_embeddings", 4096),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
    )


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
