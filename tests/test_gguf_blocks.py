"""w8a8 weights built from a GGUF's own Q8_0 / Q5_0 / Q4_0 blocks: the packed int8 values
and scales are the file's bit for bit (through llama's Q/K un-permutation and the fused
q|k|v and gate|up rows), and the model's logits stay within w8a8's tolerance of the
fp32-dequantized model's."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine.layers.linear import Linear
from engine.model_registry import resolve_model
from engine.ops import select_ops
from engine.quantization import file_blocks
from engine.quantization.gguf_blocks import int8_blocks
from engine.quantization.quant import W8A8_GROUP, quantize_w8a8
from engine.weights import load_model
from tests.test_model_reference import one_pass_logits
from tests.tiny_gguf import tiny_llama, write_llama_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(2)).tolist()


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q5_0, QT.Q4_0])
def test_kept_blocks_are_the_files_values(qtype: QT) -> None:
    w = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    raw = quantize(w, qtype)
    q, scale = int8_blocks(raw, qtype)
    assert q.dtype == np.int8 and q.shape == (48, 96) and scale.shape == (48, 96 // 32)
    want_scale = raw.reshape(-1, raw.shape[1] // 3)[:, :2].copy().view(np.float16)
    assert np.array_equal(scale.reshape(-1), want_scale.astype(np.float32).reshape(-1))
    if qtype == QT.Q8_0:  # 2 bytes of fp16 scale, then the 32 int8 values
        assert np.array_equal(q.reshape(-1, 32), raw.reshape(-1, 34)[:, 2:].view(np.int8))
    assert np.array_equal(q * np.repeat(scale, 32, axis=1), dequantize(raw, qtype))


def test_other_block_types_are_not_kept() -> None:
    raw = quantize(np.ones((32, 64), np.float32), QT.Q4_1)  # an offset per block: no w8a8
    assert int8_blocks(raw, QT.Q4_1) is None


def _tiny_gguf(folder: Path, tied: bool) -> Path:
    model = tiny_llama(tied)
    # as a llama.cpp "mostly Q5_0" file: Q8_0 and Q5_0 mixed inside the fused q|k|v rows,
    # a Q4_1 gate (no w8a8 form) beside a Q8_0 up, a Q8_0 head
    types = {"output.weight": QT.Q8_0, "token_embd.weight": QT.Q8_0 if tied else QT.F32}
    for i in range(2):
        names = {"attn_q": QT.Q8_0, "attn_k": QT.Q5_0, "attn_v": QT.Q4_0, "ffn_down": QT.Q5_0}
        names |= {"attn_output": QT.Q8_0, "ffn_gate": QT.Q4_1, "ffn_up": QT.Q8_0}
        types |= {f"blk.{i}.{n}.weight": t for n, t in names.items()}
    return write_llama_gguf(folder / "tiny.gguf", model, lambda _: None, types)


@pytest.mark.parametrize("tied", [False, True])
def test_w8a8_model_multiplies_by_the_files_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    _check_w8a8_model(tmp_path, monkeypatch, tied, "native")


def test_w8a8_torch_reference_takes_the_files_blocks_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_kernels: None
) -> None:
    _check_w8a8_model(tmp_path, monkeypatch, False, "torch")


def _check_w8a8_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool, ops: str):
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    resolved = resolve_model(str(_tiny_gguf(tmp_path, tied)))
    _, fp32 = load_model(resolved)  # the file's weights dequantized to fp32
    _, w8a8 = load_model(resolved, select_ops("w8a8"))  # from the weights cache: warm
    assert (w8a8.ops.kernels is None) == (ops == "torch")
    fp32_weights = {n: m.weight for n, m in fp32.named_modules() if isinstance(m, Linear)}
    w8a8.pack_weights(batch_hint=8)
    kept = {n: m.packed for n, m in w8a8.named_modules() if isinstance(m, Linear)}
    if tied:
        fp32_weights["head"], kept["head"] = fp32.embed_tokens.weight, w8a8.packed_head
    else:
        kept["head"] = w8a8.packed_head
        fp32_weights["head"] = fp32_weights["lm_head"]
    reader = gguf.GGUFReader(resolved.path)
    files = {t.name: t for t in reader.tensors}
    for name, packed in kept.items():
        assert packed.group == W8A8_GROUP and packed.is_panels == (ops == "native"), name
        exact = torch.equal(packed.dequantize(), fp32_weights[name])  # q * d: exact in fp32
        assert exact == ("gate_up" not in name), name  # the Q4_1 half is requantized
    # bit for bit against the file's own bytes (an unfused, unpermuted Q8_0 projection)
    o_proj, raw = kept["layers.1.self_attn.o_proj"], files["blk.1.attn_output.weight"].data
    blocks = np.asarray(raw).reshape(-1, 34)
    assert np.array_equal(o_proj.plain_q().numpy().reshape(-1, 32), blocks[:, 2:].view(np.int8))
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    assert np.array_equal(o_proj.plain_scale().numpy().reshape(-1), scales)
    # the Q5_0 / Q4_0 blocks are kept where a requantization would move them
    down = fp32_weights["layers.0.mlp.down_proj"]
    assert not torch.equal(quantize_w8a8(down, panels=False).dequantize(), down)
    want, got = one_pass_logits(fp32, IDS, 4), one_pass_logits(w8a8, IDS, 4)
    assert not torch.equal(got, want)  # int8 activations really in use
    assert torch.cosine_similarity(got, want, dim=1).min() > 0.995
    assert ((got - want).abs().max() / want.abs().max()) < 0.05
    # a second start maps the cached blocks: no GGUF parse, the same panels
    monkeypatch.setattr(file_blocks, "_gguf_blocks", None)  # called: a TypeError
    _, again = load_model(resolved, select_ops("w8a8"))
    again.pack_weights(batch_hint=8)
    assert torch.equal(one_pass_logits(again, IDS, 4), got)
