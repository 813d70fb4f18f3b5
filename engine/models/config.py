"""A model's shape (ModelConfig), read from GGUF metadata or a Hugging Face config.json."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.layers.rope_scaling import gguf_rope_scaling, hf_rope_scaling


@dataclass
class ModelConfig:
    arch: str  # one of SUPPORTED_ARCHS
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
    rope_scaling: dict[str, Any] | None = None  # see layers/rope_scaling.py; None: plain rope


SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")  # the classes: models/__init__.py
# llama.cpp's converter stores llama3 rope scaling as this tensor of per-frequency factors.
ROPE_FREQS = "rope_freqs.weight"


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
    freqs = next((t.data.tolist() for t in reader.tensors if t.name == ROPE_FREQS), None)
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
        rope_scaling=gguf_rope_scaling(meta, arch, freqs),
    )


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
        rope_scaling=hf_rope_scaling(cfg),
    )
