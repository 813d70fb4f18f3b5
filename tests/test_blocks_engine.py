""" "blocks" weights in a model: each projection and the LM head carries the file's own
blocks (types mixed inside the fused q|k|v and gate|up rows, a part of another type
requantized to Q8_0, a Q6_K tensor in its own records, a tensor with no kept part in w8a8),
the logits stay near the fp32
model's, a second start maps the cached records, and the fused decode step runs them."""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.cpu_features import cpu_features
from engine.fused_decode import FusedDecode
from engine.kv.pages import new_kv_pools
from engine.layers.linear import Linear
from engine.model_registry import resolve_model
from engine.ops import select_ops
from engine.quantization import file_blocks
from engine.quantization.block_weights import BlockWeight
from engine.quantization.quant import Int8Weight
from engine.quantization.w8a8 import w8a8_path
from engine.runner import ModelRunner
from engine.weights import load_model
from tests.engine_steps import GREEDY, decode_logits
from tests.test_model_reference import one_pass_logits
from tests.tiny_gguf import tiny_llama, write_llama_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(2)).tolist()
LAYER_TYPES = {  # as a llama.cpp mix, and the record types each fused projection gets
    "attn_q": QT.Q4_1, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "attn_output": QT.Q4_0,
    "ffn_gate": QT.Q4_1, "ffn_up": QT.F16, "ffn_down": QT.F16,
}  # fmt: skip
WANT = {
    "self_attn.qkv_proj": {"q4_1": 64, "q5_0": 32, "q8_0": 32},
    "self_attn.o_proj": {"q4_0": 64},
    "mlp.gate_up_proj": {"q4_1": 256, "q8_0": 256},  # the F16 up rows requantized
    "mlp.down_proj": {"q6_k": 64},  # layer 0's (k = 256, one super-block); layer 1's is F16
}


def _tiny_gguf(folder: Path) -> Path:
    model = tiny_llama(True, intermediate_size=256)
    types = {"token_embd.weight": QT.Q8_0}
    for i in range(2):
        types |= {f"blk.{i}.{n}.weight": t for n, t in LAYER_TYPES.items()}
    types["blk.0.ffn_down.weight"] = QT.Q6_K
    return write_llama_gguf(folder / "tiny.gguf", model, lambda _: None, types)


@pytest.mark.parametrize("ops", ["native", "torch"])
def test_blocks_model_keeps_the_files_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, ops: str
) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    if ops == "torch":
        request.getfixturevalue("no_kernels")
    resolved = resolve_model(str(_tiny_gguf(tmp_path)))
    _, fp32 = load_model(resolved)  # the file's weights dequantized to fp32
    _, model = load_model(resolved, select_ops("blocks"))
    assert (model.ops.kernels is None) == (ops == "torch")
    plain = {n: m.weight for n, m in fp32.named_modules() if isinstance(m, Linear)}
    model.pack_weights(batch_hint=8)
    for name, lin in model.named_modules():
        if not isinstance(lin, Linear):
            continue
        short = name.split(".", 2)[2]
        if name == "layers.1.mlp.down_proj":  # no kept part: w8a8, requantized
            assert isinstance(lin.packed, Int8Weight) and lin.packed.group, name
            continue
        assert isinstance(lin.packed, BlockWeight), name
        assert lin.packed.type_counts() == WANT[short], name
        exact = torch.equal(lin.packed.dequantize(), plain[name])
        assert exact == (short != "mlp.gate_up_proj"), name  # the F16 half is requantized
    head = model.packed_head
    assert isinstance(head, BlockWeight) and head.type_counts() == {"q8_0": 256}
    assert torch.equal(head.dequantize(), fp32.embed_tokens.weight)
    want, got = one_pass_logits(fp32, IDS, 4), one_pass_logits(model, IDS, 4)
    assert not torch.equal(got, want)  # int8 activations really in use
    assert torch.cosine_similarity(got, want, dim=1).min() > 0.995
    assert ((got - want).abs().max() / want.abs().max()) < 0.05
    # a corrupt records cache is rebuilt, never fatal; then a start maps the cached
    # records (no GGUF parse) to the same results
    (cached,) = (tmp_path / "cache" / "weights").glob("*.records*.safetensors")
    cached.write_bytes(b"not a safetensors file")
    for parse in (True, False):
        if not parse:
            monkeypatch.setattr(file_blocks, "_file_blocks", None)  # called: a TypeError
        _, again = load_model(resolved, select_ops("blocks"))
        again.pack_weights(batch_hint=8)
        assert torch.equal(one_pass_logits(again, IDS, 4), got)
    assert cached.stat().st_size > 1000


def test_fused_decode_step_runs_q6_k_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused decode step's C code calls the same kernel entry with each weight's panel
    index: the tiny model's Q6_K down_proj gives the layer-by-layer logits exactly."""
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    _, model = load_model(resolve_model(str(_tiny_gguf(tmp_path))), select_ops("blocks"))
    if model.ops.kernels is None:
        pytest.skip("no C kernels here: no fused decode step")
    model.pack_weights(batch_hint=8)
    assert model.layers[0].mlp.down_proj.packed.type_counts() == {"q6_k": 64}
    c = model.config
    caches = [new_kv_pools(4, 16, c.num_kv_heads, c.head_dim, torch.float32) for _ in range(2)]
    fused = FusedDecode.build(model.ops.kernels, model, caches)
    assert fused is not None
    ids, pages = IDS[:20], [0, 1]

    def decode(use_fused: bool) -> torch.Tensor:
        with torch.inference_mode():
            prefill = SeqChunk(0, ids[:-1], 0, pages, True, GREEDY)
            ctx = build_context([prefill], 16, kernels=model.ops.kernels)
            model(torch.tensor(ids[:-1]), torch.arange(len(ids) - 1), ctx, caches)
            ctx = build_context([SeqChunk(0, ids[-1:], len(ids) - 1, pages, True, GREEDY)], 16,
                                kernels=model.ops.kernels)  # fmt: skip
            x, pos = torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1])
            if use_fused:
                return fused.logits(
                    x, model.rotary(pos), ctx, torch.empty(fused.workspace_floats(1))
                )
            return model.compute_logits(model(x, pos, ctx, caches))

    assert torch.equal(decode(True), decode(False))


def test_blocks_engine_fused_decode_and_kernel_info() -> None:
    config = EngineConfig("smollm2-135m", kv_cache_bytes=16 * 737280, weights="blocks")
    r = ModelRunner(config)
    linears = [m for m in r.model.modules() if isinstance(m, Linear)]
    assert all(m.packed.type_counts() == {"q4_1": m.out_features} for m in linears)
    assert r.model.packed_head.type_counts() == {"q8_0": r.model_config.vocab_size}
    assert r.fused is not None, "blocks decode steps run fused too"
    info = r.kernel_info()
    # the blocks have no tile kernel: on an AMX CPU they run w8a8's VNNI path, not its "amx"
    assert info["blocks_path"] == w8a8_path(cpu_features()) and info["w8a8_path"] == "none"
    assert info["weight_formats"] == f"blocks:{len(linears) + 1}"
    fused = decode_logits(r, "The capital of France is", fused=True)
    layer_by_layer = decode_logits(r, "The capital of France is", fused=False)
    assert torch.equal(fused, layer_by_layer)
    top = r.tokenizer.decode([int(fused.argmax())])
    assert top.strip() == "Paris"
