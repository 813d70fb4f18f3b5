"""Qwen3, the architecture family docs/adding-a-model.md adds: a tiny random Qwen3 (q / k
head norms, head_dim apart from hidden / heads, tied head) from transformers' own class,
as a Hugging Face folder and as a GGUF, through our engine against transformers."""

import json
from pathlib import Path

import gguf
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models

from engine.config import EngineConfig
from engine.fused_decode import ARCHS
from engine.model_registry import resolve_model
from engine.models import MODELS
from engine.models.config import SUPPORTED_ARCHS
from engine.ops import select_ops
from engine.runner import ModelRunner
from engine.weights import load_model
from tests.test_model_reference import NEW_TOKENS, _engine_greedy, _until_eos, one_pass_logits
from tests.tiny_gguf import write_llama_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 256


def _tiny_qwen3() -> transformers.Qwen3ForCausalLM:
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=128, tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a norm skipped or misplaced shows
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 2.0)
    return model


def _folder(tmp_path: Path, model: transformers.Qwen3ForCausalLM) -> Path:
    """The model as a Hugging Face folder with a word-level tokenizer (the tests feed ids)."""
    model.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(models.WordLevel(vocab, unk_token="t1")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t255"}))
    return tmp_path


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(2, VOCAB - 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_every_architecture_config_reads_has_a_model_class() -> None:
    assert set(MODELS) == set(SUPPORTED_ARCHS)
    assert all(arch in cls.architectures for arch, cls in MODELS.items())
    assert MODELS["qwen3"].__name__ == "Qwen3ForCausalLM" and "qwen3" not in ARCHS


def test_hf_folder_logits_match_transformers(tmp_path: Path) -> None:
    ref = _tiny_qwen3()
    config, model = load_model(resolve_model(str(_folder(tmp_path, ref))))
    assert (config.arch, config.head_dim, config.tie_embeddings) == ("qwen3", 32, True)
    assert not config.attention_bias
    ids = _ids(40, 0)
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
    got = one_pass_logits(model, ids, page_size=4)  # paged, in two chunks
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_engine_greedy_equals_transformers(tmp_path: Path) -> None:
    """Prefill and batched decode steps through ModelRunner, on the C kernels where they
    build: decode_step.c has no q / k norms, so qwen3 must decode through the forward."""
    ref = _tiny_qwen3()
    runner = ModelRunner(EngineConfig(model=str(_folder(tmp_path, ref)), kv_cache_bytes=8 << 20))
    assert runner.fused is None and runner.kernel_info()["fused_decode"] == "false"
    prompts = [_ids(n, seed) for seed, n in enumerate((5, 19, 33))]
    ours = _engine_greedy(runner, prompts)
    eos = runner.tokenizer.eos_token_ids
    with torch.inference_mode():
        for p, o in zip(prompts, ours, strict=True):
            out = ref.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            assert _until_eos(o, eos) == _until_eos(out[0, len(p) :].tolist(), eos)


def test_gguf_logits_match_transformers(tmp_path: Path) -> None:
    """The qwen3.* metadata keys and the attn_q_norm / attn_k_norm tensors."""
    ref = _tiny_qwen3()
    path = write_llama_gguf(tmp_path / "tiny.gguf", ref, lambda _: None)
    config, model = load_model(resolve_model(str(path)))
    assert (config.arch, config.head_dim, config.tie_embeddings) == ("qwen3", 32, True)
    ids = _ids(24, 1)
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(one_pass_logits(model, ids, 4), want, atol=1e-4, rtol=1e-4)


def test_gguf_q8_0_blocks_reach_the_fused_projections(tmp_path: Path) -> None:
    """w8a8 takes the file's Q8_0 q, k, v blocks as they are, stacked by the parts the
    model declares: exactly the rows of the fp32 (dequantized) fused weight."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    names = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
    types = {f"blk.{i}.{n}.weight": q8 for i in range(2) for n in names}
    path = write_llama_gguf(tmp_path / "tiny.gguf", _tiny_qwen3(), lambda _: None, types)
    _, plain = load_model(resolve_model(str(path)))
    _, model = load_model(resolve_model(str(path)), select_ops("w8a8"))
    for name, lin in model.projections().items():
        fp32 = plain.get_submodule(name).weight
        if name.endswith(("qkv_proj", "gate_up_proj")):
            torch.testing.assert_close(lin.blocks.dequantize(), fp32, atol=0, rtol=0)
        else:
            assert lin.blocks is None  # f32 in the file: w8a8 requantizes it when packing
