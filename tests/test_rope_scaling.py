"""Rope scaling (llama3, linear): frequencies against transformers' own computation, and
whole tiny models from a config.json and from a GGUF against transformers' forward."""

import json
from pathlib import Path

import gguf
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.layers.rope_scaling import UnsupportedRopeScaling, hf_rope_scaling, inv_frequencies
from engine.model_registry import resolve_model
from engine.models.config import hf_config
from engine.weights import load_model
from tests.test_model_reference import one_pass_logits
from tests.tiny_gguf import llama3_rope_factors, write_llama_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LLAMA31 = {  # Llama 3.1 8B's
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip
LLAMA32 = {**LLAMA31, "factor": 32.0}  # Llama 3.2 1B / 3B
ODD = {**LLAMA31, "factor": 3.0, "low_freq_factor": 2.0, "high_freq_factor": 7.5,
       "original_max_position_embeddings": 1024}  # fmt: skip
TINY_ROPE = {**LLAMA31, "original_max_position_embeddings": 16}  # scaled inside 48 tokens


def _hf_inv_freq(rope: dict, theta: float, head_dim: int) -> torch.Tensor:
    cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
        max_position_embeddings=131072, rope_parameters={**rope, "rope_theta": theta},
    )  # fmt: skip
    return ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")[0]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("theta", [500000.0, 10000.0])
@pytest.mark.parametrize(
    "rope",
    [LLAMA31, LLAMA32, ODD, {"rope_type": "linear", "factor": 4.0}],
    ids=["llama3.1", "llama3.2", "llama3-odd", "linear"],
)
def test_frequencies_equal_transformers(rope: dict, theta: float, head_dim: int) -> None:
    ours = inv_frequencies(head_dim, theta, hf_rope_scaling({"rope_scaling": dict(rope)}))
    want = _hf_inv_freq(rope, theta, head_dim).double()
    torch.testing.assert_close(ours, want, rtol=2e-6, atol=0)
    plain = inv_frequencies(head_dim, theta, None)
    assert not torch.allclose(ours, plain)  # the scaling changed something


@pytest.mark.parametrize("rope", [LLAMA31, LLAMA32, ODD], ids=["3.1", "3.2", "odd"])
def test_llama_cpp_rope_freqs_tensor_equals_llama3(rope: dict) -> None:
    factors = llama3_rope_factors(128, 500000.0, rope).tolist()
    scaling = {"rope_type": "freq_factors", "factors": factors}
    want = _hf_inv_freq(rope, 500000.0, 128).double()
    torch.testing.assert_close(inv_frequencies(128, 500000.0, scaling), want, rtol=2e-6, atol=0)


def test_old_style_and_new_style_configs_agree() -> None:
    old = {"rope_scaling": {"type": "linear", "factor": 2}}
    new = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    assert hf_rope_scaling(old) == hf_rope_scaling(new) == {"rope_type": "linear", "factor": 2.0}
    assert hf_rope_scaling({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}) is None
    assert hf_rope_scaling({}) is None


@pytest.mark.parametrize(
    "rope, words",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
        ({"rope_type": "yarn", "factor": 4.0}, "'yarn' is not supported"),
        ({"rope_type": "linear"}, "positive factor"),
        ({**LLAMA31, "high_freq_factor": 0.5}, "high_freq_factor > low_freq_factor"),
        ({**LLAMA31, "original_max_position_embeddings": None}, "original_max_position"),
    ],
)
def test_unsupported_or_broken_scaling_is_refused_at_load(
    tmp_path: Path, rope: dict, words: str
) -> None:
    cfg = {
        "model_type": "llama", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 8, "rope_scaling": rope,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedRopeScaling, match=words):
        hf_config(tmp_path)


# ---- whole tiny models: transformers' forward vs ours, past the original context ------


def _tiny_llama3(folder: Path) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, rope_parameters={**TINY_ROPE, "rope_theta": 500.0},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    return model


def _want_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


IDS = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(1)).tolist()


def test_hf_folder_with_llama3_rope_matches_transformers(tmp_path: Path) -> None:
    ref = _tiny_llama3(tmp_path)
    config, model = load_model(resolve_model(str(tmp_path)))
    assert config.rope_scaling == hf_rope_scaling({"rope_scaling": TINY_ROPE})
    got = one_pass_logits(model, IDS, 4)
    torch.testing.assert_close(got, _want_logits(ref, IDS), atol=1e-4, rtol=1e-4)


def test_gguf_with_rope_freqs_tensor_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    ref = _tiny_llama3(tmp_path / "hf")
    factors = llama3_rope_factors(16, 500.0, TINY_ROPE)

    def rope_freqs(writer: gguf.GGUFWriter) -> None:
        writer.add_tensor("rope_freqs.weight", factors)

    path = write_llama_gguf(tmp_path / "tiny.gguf", ref, rope_freqs)
    for _ in ("cold", "warm"):  # converted, then from the weights cache
        config, model = load_model(resolve_model(str(path)))
        assert config.rope_scaling == {"rope_type": "freq_factors", "factors": factors.tolist()}
        got = one_pass_logits(model, IDS, 4)
        torch.testing.assert_close(got, _want_logits(ref, IDS), atol=1e-4, rtol=1e-4)


def test_gguf_linear_scaling_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    ref = _tiny_llama3(tmp_path / "hf")

    def linear(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)

    config, _ = load_model(resolve_model(str(write_llama_gguf(tmp_path / "lin.gguf", ref, linear))))
    assert config.rope_scaling == {"rope_type": "linear", "factor": 4.0}

    def yarn(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)

    with pytest.raises(UnsupportedRopeScaling, match="'yarn' is not supported"):
        load_model(resolve_model(str(write_llama_gguf(tmp_path / "yarn.gguf", ref, yarn))))
