"""Weight loading: GGUF config, Q/K un-permutation, the fp32 cache (cold, warm, corrupt)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from engine import cache_files, weights
from engine.cache_files import cache_path
from engine.gguf_names import unpermute
from engine.model_registry import resolve_model
from engine.models.config import ModelConfig
from engine.weights import _load_cached, load_model


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to llama Q/K weights."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.random.default_rng(0).standard_normal((3 * 64, 40)).astype(np.float32)
    np.testing.assert_array_equal(unpermute(_llama_cpp_permute(w, 3), 3), w)


def test_cold_then_warm_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    resolved = resolve_model("smollm2-135m")
    config, cold = load_model(resolved)
    assert config == ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100000.0,
        rms_eps=config.rms_eps, max_position=8192, tie_embeddings=True, attention_bias=False,
    )  # fmt: skip
    cached = cache_path(Path(resolved.path), "weights", ".safetensors")
    assert cached.is_file() and cached.parent == tmp_path / "weights"
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(".")]  # no tmp left
    written = cached.stat().st_mtime_ns

    def no_gguf(path: Path) -> None:
        raise AssertionError(f"the warm load read {path} again instead of the cache")

    # Warm: the weights come from the cache file alone (the GGUF is never dequantized again)
    # and the cache is read, not rewritten.
    monkeypatch.setattr(weights, "_load_gguf", no_gguf)
    config2, warm = load_model(resolved)
    assert config2 == config
    assert cached.stat().st_mtime_ns == written
    for (name, a), (_, b) in zip(cold.state_dict().items(), warm.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_corrupt_cache_is_dropped(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert _load_cached(bad) is None
    assert not bad.exists()


def test_cache_key_follows_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_files, "cache_dir", lambda: tmp_path)
    src = tmp_path / "m.gguf"
    src.write_bytes(b"x")
    first = cache_path(src, "weights", ".safetensors")
    src.write_bytes(b"xy")  # size (and mtime) change -> a different cache file
    assert cache_path(src, "weights", ".safetensors") != first


def _tiny_state(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    d, kv, f = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    shapes = {"embed_tokens.weight": (cfg.vocab_size, d), "norm.weight": (d,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    return {k: torch.randn(s) for k, s in shapes.items()}


def test_cache_roundtrip_with_head_filled_from_embedding(tmp_path: Path) -> None:
    """An untied config whose file lacks lm_head: the head shares the embedding's
    storage, which safetensors refuses unless the cache writer copies it."""
    from engine.models import build_model
    from engine.ops import TorchOps

    cfg = ModelConfig("llama", 32, 16, 1, 2, 1, 8, 24, 1e4, 1e-6, 64, False, False)
    model = build_model(cfg, TorchOps())
    model.load_weights(_tiny_state(cfg))
    cached = tmp_path / "m.safetensors"
    weights._save_cached(model, cfg, cached)
    config2, state = _load_cached(cached)
    assert config2 == cfg
    for name, t in model.state_dict().items():
        assert torch.equal(state[name], t), name
