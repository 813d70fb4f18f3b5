"""Write small GGUF files the way llama.cpp's converter does, for tests that need a GGUF
with a feature no bundled model has (rope scaling, a sentencepiece vocabulary)."""

import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

GGUFWriterStep = Callable[[gguf.GGUFWriter], None]

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to llama Q/K weights."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(head_dim: int, theta: float, rope: dict) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for llama3 rope scaling
    (its own code, transcribed: a second implementation to check ours against)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tiny_llama(tied: bool, intermediate_size: int = 96) -> transformers.LlamaForCausalLM:
    """A seeded two-layer llama small enough for block-layout tests (k = 64 and 96: whole
    groups of 32; an intermediate_size of 256 gives ffn_down a K-quant super-block)."""
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=intermediate_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def write_llama_gguf(
    path: Path,
    model: torch.nn.Module,
    extra: GGUFWriterStep,
    types: dict[str, gguf.GGMLQuantizationType] | None = None,
) -> Path:
    """A transformers LlamaForCausalLM (or Qwen3ForCausalLM: its architecture, Q/K not
    permuted) as a GGUF, f32 but for the tensors `types` names (GGUF names) in those
    quantized blocks; `extra` adds metadata and tensors."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    writer = gguf.GGUFWriter(path, c.model_type)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_key_length(head_dim)
    extra(writer)
    for name, t in model.state_dict().items():
        w = t.detach().float().numpy()
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w = _permuted(name, w, c) if c.model_type == "llama" else w
        name = _gguf_name(name)
        qtype = (types or {}).get(name)
        if qtype is None:
            writer.add_tensor(name, w)
        else:
            quantize = quantize_q6_k if qtype == gguf.GGMLQuantizationType.Q6_K else None
            raw = quantize(w) if quantize else gguf.quants.quantize(w, qtype)
            writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """Rows (k a multiple of 256) as Q6_K blocks, which gguf's Python cannot write: llama.cpp's
    reference rule without its error search (per 16 values the scale maps the largest
    magnitude to -32; the int8 scales share one fp16 d, the largest giving -128)."""
    x = w.reshape(-1, 16, 16).astype(np.float32)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=2)[..., None], axis=2)[..., 0]
    s = big / -32
    top = np.take_along_axis(s, np.abs(s).argmax(axis=1)[:, None], axis=1)
    inv = np.divide(-128, top, out=np.zeros_like(top), where=top != 0)
    d = np.divide(1, inv, out=np.zeros_like(inv), where=inv != 0).astype(np.float16)
    sc = np.clip(np.round(inv * s), -128, 127).astype(np.int8)
    step = (d.astype(np.float32) * sc)[..., None]
    q = np.round(np.divide(x, step, out=np.zeros_like(x), where=step != 0))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # [block, half, i]
    low = q[..., :64] & 15 | (q[..., 64:] & 15) << 4  # i and i + 64 share a byte
    high = (q.reshape(-1, 2, 4, 32) >> 4) << np.array([0, 2, 4, 6], np.uint8)[:, None]
    parts = [low, high.sum(axis=2, dtype=np.uint8), sc.view(np.uint8), d.view(np.uint8)]
    return np.concatenate([p.reshape(len(x), -1) for p in parts], axis=1).reshape(w.shape[0], -1)


def _permuted(name: str, w: np.ndarray, c: object) -> np.ndarray:
    if name.endswith("q_proj.weight"):
        return llama_cpp_permute(w, c.num_attention_heads)
    if name.endswith("k_proj.weight"):
        return llama_cpp_permute(w, c.num_key_value_heads)
    return w


def _gguf_name(hf_name: str) -> str:
    name = hf_name.removeprefix("model.")
    top = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    if name in top or name == "lm_head.weight":
        return top.get(name, "output.weight")
    _, layer, rest = name.split(".", 2)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_NAMES[module]}.{kind}"
