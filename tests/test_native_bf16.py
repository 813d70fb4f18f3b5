"""bf16 weights: the C kernel on every path this CPU runs against its reference (the same
bf16 values through torch; on the AVX512-BF16 path x is rounded to bf16 too), the torch
fallback for odd widths, and an engine that runs them (fused decode, /metrics)."""

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.config import EngineConfig
from engine.cpu_features import cpu_features
from engine.layers.linear import Linear
from engine.ops import NativeOps, TorchOps
from engine.quantization.bf16 import bf16_path
from engine.quantization.packing import is_panels, unpack_panels
from engine.runner import ModelRunner
from tests.engine_steps import decode_logits

_NEEDS = {"widen": (), "avx512_bf16": ("avx512f", "avx512_bf16")}


@pytest.fixture(autouse=True)
def panels_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These check our C kernel: oneDNN's bf16 (a kernel-choice candidate that may win a
    row class on an AMX CPU) is checked in tests/test_onednn_gemm.py."""
    monkeypatch.setenv("TIERGATE_ONEDNN", "0")


def _ops(path: str) -> NativeOps:
    missing = [f for f in _NEEDS[path] if not cpu_features()[f]]
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {path} path cannot run here")
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, "bf16", bf16_path=path)


@pytest.mark.parametrize("path", ["widen", "avx512_bf16"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_gemm_matches_reference(path: str, rows: int, bias: bool) -> None:
    ops = _ops(path)
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 202
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    packed = ops.pack_weight(weight, rows)
    assert packed.dtype == torch.bfloat16 and is_panels(packed)
    assert torch.equal(unpack_panels(packed), weight.bfloat16().float())  # only rounded
    x_in = x.bfloat16().float() if path == "avx512_bf16" else x
    want = F.linear(x_in, weight.bfloat16().float(), b)
    torch.testing.assert_close(ops.linear(x, packed, b), want, rtol=1e-5, atol=1e-4)
    exact = F.linear(x, weight, b)
    assert (ops.linear(x, packed, b) - exact).norm() / exact.norm() < 0.005


def test_bf16_odd_widths_take_the_torch_reference() -> None:
    ops = _ops("widen")
    for shape in ((40, 64), (64, 33)):  # N not whole panel pairs; K not whole pairs
        weight, x = torch.randn(*shape), torch.randn(3, shape[1])
        packed = ops.pack_weight(weight, 4)
        assert packed.dtype == torch.bfloat16 and not is_panels(packed)
        want = F.linear(x, weight.bfloat16().float())
        torch.testing.assert_close(ops.linear(x, packed), want)
        assert torch.equal(TorchOps("bf16").linear(x, packed), want)


def test_bf16_path_follows_the_features() -> None:
    none = dict.fromkeys(("avx512f", "avx512_bf16"), False)
    assert bf16_path({**none, "avx512f": True, "avx512_bf16": True}) == "avx512_bf16"
    assert bf16_path({**none, "avx512f": True}) == "widen"
    assert bf16_path(none) == "widen"


@pytest.mark.usefixtures("one_torch_thread")
def test_bf16_engine_fused_decode_and_kernel_info() -> None:
    config = EngineConfig("smollm2-135m", kv_cache_bytes=16 * 737280, weights="bf16")
    r = ModelRunner(config)
    linears = [m for m in r.model.modules() if isinstance(m, Linear)]
    assert all(m.packed.dtype == torch.bfloat16 and m.weight is None for m in linears)
    assert r.fused is not None, "bf16 decode steps run fused too"
    info = r.kernel_info()
    assert info["bf16_path"] == r.ops.bf16_path and info["w8a8_path"] == "none"
    assert info["weight_formats"] == "bf16:121"
    fused = decode_logits(r, "def fibonacci(n):\n    ", fused=True)
    layer_by_layer = decode_logits(r, "def fibonacci(n):\n    ", fused=False)
    assert torch.equal(fused, layer_by_layer)
