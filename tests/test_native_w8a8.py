"""w8a8 (int8 weights and int8 activations, groups of 32 on both sides): the C kernel on
every path this CPU runs against the reference (the same quantized values through torch),
the reference against fp32, and an engine that runs it (fused decode, /metrics)."""

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.config import EngineConfig
from engine.cpu_features import cpu_features
from engine.layers.linear import Linear
from engine.ops import NativeOps, TorchOps
from engine.quantization.packing import is_panels
from engine.quantization.quant import (
    W8A8_GROUP,
    Int8Weight,
    quantize_rows,
    quantize_w8a8,
    w8a8_reference,
)
from engine.quantization.w8a8 import w8a8_path
from engine.runner import ModelRunner
from tests.engine_steps import decode_logits

_NEEDS = {"generic": (), "avx2": ("avx2",), "vnni": ("avx512f", "avx512bw", "avx512_vnni")}


def _ops(path: str) -> NativeOps:
    missing = [f for f in _NEEDS[path] if not cpu_features()[f]]
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {path} path cannot run here")
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, "w8a8", w8a8_path=path)


def test_quantize_w8a8_groups_and_layouts() -> None:
    w = torch.randn(32, 96, generator=torch.Generator().manual_seed(0))
    w[3, 40:50] *= 100  # a loud group keeps its own scale and does not crush its row
    w[5] = 0
    plain, panels = quantize_w8a8(w, panels=False), quantize_w8a8(w, panels=True)
    assert plain.q.shape == (32, 96) and plain.scale.shape == (32, 96 // W8A8_GROUP)
    assert panels.q.shape == (2, 24, 16, 4) and panels.scale.shape == (2, 3, 16)
    assert panels.shape == plain.shape == (32, 96) and plain.group == W8A8_GROUP
    torch.testing.assert_close(panels.dequantize(), plain.dequantize(), rtol=0, atol=0)
    step = plain.scale.repeat_interleave(W8A8_GROUP, dim=1)
    assert ((plain.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    assert (plain.dequantize()[3, :32] - w[3, :32]).abs().max() < 0.05  # not the loud group's
    assert plain.dequantize()[5].eq(0).all()


def test_activation_rounding_per_group() -> None:
    x = torch.tensor([[1.0] * 31 + [127.0] + [0.5] * 32])
    got = quantize_rows(x, W8A8_GROUP)
    assert got[0, :31].eq(1.0).all() and got[0, 31] == 127.0  # 1 * 127 / 127 is exact
    torch.testing.assert_close(got[0, 32:], x[0, 32:])  # the second group has its own scale
    assert quantize_rows(torch.zeros(2, 64), W8A8_GROUP).eq(0).all()


@pytest.mark.parametrize("path", ["generic", "avx2", "vnni"])
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 9, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_w8a8_gemm_matches_reference(path: str, rows: int, bias: bool) -> None:
    ops = _ops(path)
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 224
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    x[:, 7] *= 50  # an outlier channel: only its own group's scale grows
    b = torch.randn(n, generator=gen) if bias else None
    packed = ops.pack_weight(weight, rows)
    assert isinstance(packed, Int8Weight) and is_panels(packed) and packed.group
    got = ops.linear(x, packed, b)
    want = w8a8_reference(x, packed, b)  # the same int8 values, fp32 sums through torch
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-4)
    assert torch.equal(TorchOps("w8a8").linear(x, packed, b), want)
    exact = F.linear(x, weight, b)
    assert (got - exact).norm() / exact.norm() < 0.02  # and near the fp32 maths


@pytest.mark.parametrize("path", ["generic", "avx2", "vnni"])
def test_w8a8_activations_round_as_the_reference(path: str) -> None:
    """Through an identity weight the kernel returns its quantized activations: the same
    as quant.quantize_rows, ties (x * 127 / max = n + 0.5, frequent in real activations)
    included, so the C path has the reference's quality, not its own."""
    ops = _ops(path)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 0.01
    # max |x| 0.92148 and x = 0.025395115...: x * (127 / max) is 3.5 in torch's float32
    # maths (rounded half to even: 4), 3.4999995 when 127 / max is divided directly (3)
    x[:, 0], x[:, 1] = 0.92148, 0.025395115837454796
    assert quantize_rows(x, W8A8_GROUP)[0, 1] == torch.tensor(4 * 0.92148) / 127
    got = ops.linear(x, ops.pack_weight(torch.eye(64), 8))
    # a tie rounded the other way is off by a whole step (~0.002 here), float order ~1e-8
    torch.testing.assert_close(got, quantize_rows(x, W8A8_GROUP), rtol=1e-6, atol=1e-6)


def test_w8a8_odd_widths_take_the_torch_reference() -> None:
    ops = _ops("generic")
    for shape in ((40, 64), (64, 48)):  # N not whole panel pairs; K not whole groups of 32
        weight = torch.randn(*shape)
        packed = ops.pack_weight(weight, 4)
        assert isinstance(packed, Int8Weight) and not is_panels(packed)
        x = torch.randn(3, shape[1])
        # K with no whole groups of 32: one group per row
        assert packed.group == (W8A8_GROUP if shape[1] % W8A8_GROUP == 0 else shape[1])
        torch.testing.assert_close(ops.linear(x, packed), w8a8_reference(x, packed, None))
        exact = F.linear(x, weight)
        assert (ops.linear(x, packed) - exact).norm() / exact.norm() < 0.03


def test_w8a8_path_follows_the_features() -> None:
    none = dict.fromkeys(("avx2", "avx512f", "avx512bw", "avx512_vnni"), False)
    vnni = {**none, "avx512f": True, "avx512bw": True, "avx512_vnni": True}
    assert w8a8_path(vnni) == "vnni"
    assert w8a8_path({**vnni, "avx512_vnni": False, "avx2": True}) == "avx2"
    assert w8a8_path(none) == "generic"


@pytest.mark.usefixtures("one_torch_thread")
def test_w8a8_engine_fused_decode_and_kernel_info() -> None:
    config = EngineConfig("smollm2-135m", kv_cache_bytes=16 * 737280, weights="w8a8")
    r = ModelRunner(config)
    linears = [m for m in r.model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m.packed, Int8Weight) and m.packed.group for m in linears)
    assert r.fused is not None, "w8a8 decode steps run fused too"
    info = r.kernel_info()
    assert info["w8a8_path"] == r.ops.w8a8_path and info["int8_path"] == "none"
    assert info["weight_formats"].startswith("w8a8:")
    fused = decode_logits(r, "The capital of France is", fused=True)
    layer_by_layer = decode_logits(r, "The capital of France is", fused=False)
    assert torch.equal(fused, layer_by_layer)
