"""Greedy equality of the paged engine forward with independent references.

- SmolLM2 (llama, GGUF): transformers loading the same GGUF (its own dequantiser and
  Q/K un-permutation), greedy generate.
- Qwen2.5-Coder-0.5B (qwen2, GGUF): a plain non-paged forward written here (transformers'
  GGUF load of it takes a minute: that comparison runs under -m slow).
- Tiny random llama and qwen2 Hugging Face folders: transformers vs our HF loader.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.kv.pages import new_kv_pools
from engine.model_registry import resolve_model
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.weights import load_model

GREEDY = SamplingParams(temperature=0)
NEW_TOKENS = 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
RAW = ["def fibonacci(n):", "The three primary colors are"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(runner: ModelRunner) -> list[list[int]]:
    chats = [
        runner.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS
    ]
    return [runner.tokenizer.encode(t) for t in chats + RAW]


def _engine_greedy(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    """All prompts in one batch: prefill together, then batched decode steps."""
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(len(prompts))]
    chunks = [SeqChunk(i, p, 0, tables[i], True, GREEDY) for i, p in enumerate(prompts)]
    outs = [[t] for t in runner.execute(chunks)]
    for _ in range(NEW_TOKENS - 1):
        chunks = [
            SeqChunk(i, [o[-1]], len(p) + len(o) - 1, tables[i], True, GREEDY)
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
        ]
        for o, t in zip(outs, runner.execute(chunks), strict=True):
            o.append(t)
    return outs


def _until_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def _hf_greedy(name: str, prompts: list[list[int]]) -> list[list[int]]:
    resolved = resolve_model(name)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(resolved.path.parent), gguf_file=resolved.path.name, dtype=torch.float32
    )
    outs = []
    with torch.inference_mode():
        for p in prompts:
            out = ref.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            outs.append(out[0, len(p) :].tolist())
    return outs


def _runner(name: str) -> ModelRunner:
    return ModelRunner(EngineConfig(model=name, kv_cache_bytes=64 << 20))


def test_smollm2_greedy_equals_transformers() -> None:
    runner = _runner("smollm2-135m")
    prompts = _prompts(runner)
    ours = _engine_greedy(runner, prompts)
    eos = runner.tokenizer.eos_token_ids
    for o, r in zip(ours, _hf_greedy("smollm2-135m", prompts), strict=True):
        assert _until_eos(o, eos) == _until_eos(r, eos)


@pytest.mark.slow
def test_qwen2_greedy_equals_transformers() -> None:
    runner = _runner("qwen2.5-coder-0.5b")
    prompts = _prompts(runner)
    eos = runner.tokenizer.eos_token_ids
    ours = _engine_greedy(runner, prompts)
    for o, r in zip(ours, _hf_greedy("qwen2.5-coder-0.5b", prompts), strict=True):
        assert _until_eos(o, eos) == _until_eos(r, eos)


# ---- a plain, non-paged forward over the same weights --------------------------------


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, D]; rotate (x_i, x_{i+D/2}) pairs by pos * theta^(-2i/D)."""
    t, _, d = x.shape
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (torch.arange(t, dtype=torch.float64)[:, None] * freqs)[:, None, :]
    x1, x2 = x[..., : d // 2].double(), x[..., d // 2 :].double()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).float()


def _plain_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    c = model.config
    x = model.embed_tokens.weight[torch.tensor(ids)]
    for layer in model.layers:
        att = layer.self_attn
        h = F.rms_norm(x, (c.hidden_size,), layer.input_layernorm.weight, c.rms_eps)
        q, k, v = F.linear(h, att.qkv_proj.plain_weight(), att.qkv_proj.bias).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1
        )
        q = _rope(q.view(len(ids), c.num_heads, c.head_dim), c.rope_theta).transpose(0, 1)
        k = _rope(k.view(len(ids), c.num_kv_heads, c.head_dim), c.rope_theta).transpose(0, 1)
        v = v.view(len(ids), c.num_kv_heads, c.head_dim).transpose(0, 1)
        rep = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        scores = q @ k.transpose(1, 2) / c.head_dim**0.5
        causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
        a = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
        x = x + F.linear(a.transpose(0, 1).reshape(len(ids), -1), att.o_proj.plain_weight())
        h = F.rms_norm(x, (c.hidden_size,), layer.post_attention_layernorm.weight, c.rms_eps)
        gate, up = F.linear(h, layer.mlp.gate_up_proj.plain_weight()).chunk(2, -1)
        x = x + F.linear(F.silu(gate) * up, layer.mlp.down_proj.plain_weight())
    x = F.rms_norm(x, (c.hidden_size,), model.norm.weight, c.rms_eps)
    return model.compute_logits(x)


def _plain_greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(_plain_logits(model, ids + out)[-1].argmax()))
    return out


def test_qwen2_greedy_equals_plain_forward() -> None:
    runner = _runner("qwen2.5-coder-0.5b")
    prompts = _prompts(runner)[2:]  # the two short raw prompts keep this quick
    ours = _engine_greedy(runner, prompts)
    for p, o in zip(prompts, ours, strict=True):
        assert o[:6] == _plain_greedy(runner.model, p, 6)


def one_pass_logits(model: torch.nn.Module, ids: list[int], page_size: int) -> torch.Tensor:
    """Logits of every position, computed by the paged forward in two chunks on fresh
    pools with reversed (non-contiguous) pages."""
    c = model.config
    pages = -(-len(ids) // page_size)
    kv = [
        new_kv_pools(pages, page_size, c.num_kv_heads, c.head_dim, torch.float32)
        for _ in range(c.num_layers)
    ]
    table = list(reversed(range(pages)))
    cut = len(ids) // 2 + 1
    out = []
    with torch.inference_mode():
        for start, part in ((0, ids[:cut]), (cut, ids[cut:])):
            chunk = SeqChunk(0, part, start, table, False, GREEDY)
            pos = torch.arange(start, start + len(part))
            ctx = build_context([chunk], page_size)
            out.append(model.compute_logits(model(torch.tensor(part), pos, ctx, kv)))
    return torch.cat(out)


# ---- tiny random Hugging Face folders: transformers vs our HF loader -----------------


def _tiny_hf(tmp_path: Path, arch: str) -> Path:
    common = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=True, rope_theta=500.0)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # random biases, so a dropped bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_hf_folder_matches_transformers(tmp_path: Path, arch: str) -> None:
    folder = _tiny_hf(tmp_path, arch)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config, model = load_model(resolve_model(str(folder)))
    assert config.arch == arch and config.attention_bias == (arch == "qwen2")
    assert config.tie_embeddings == (arch == "llama")
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
    got = one_pass_logits(model, ids, page_size=4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
