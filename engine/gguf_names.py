"""GGUF tensor names as Hugging Face names, and weights' rows in our order (llama.cpp's
Q/K row permutation undone), for the weights and for the formats that keep a file's blocks."""

import numpy as np

from engine.models.config import ModelConfig

_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"
    return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (made for its interleaved rope) so the
    weights work with the half-split (NEOX / Hugging Face) rope our model uses."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def oriented(rows: np.ndarray, gguf_name: str, config: ModelConfig) -> np.ndarray:
    """A weight's rows (or per-row block scales) in our order: only llama's converter
    permutes Q/K; qwen2 is stored un-permuted (NEOX rope)."""
    if config.arch == "llama" and ".attn_q." in gguf_name:
        return unpermute(rows, config.num_heads)
    if config.arch == "llama" and ".attn_k." in gguf_name:
        return unpermute(rows, config.num_kv_heads)
    return rows
