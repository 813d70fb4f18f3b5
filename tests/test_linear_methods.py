"""The LinearMethod contract every weight format keeps (engine/quantization/method.py), so
that a new format is one file and one line in METHODS: its C kernel on its panels agrees
with its torch reference, its panels give the weight back, and decode_step.c can read them.
The per-format files (test_native_int8.py, ...) test each kernel path in depth."""

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.config import WEIGHT_FORMATS
from engine.layers.linear import Linear
from engine.ops import NativeOps
from engine.quantization import matmuls
from engine.quantization.block_weights import from_parts
from engine.quantization.matmuls import METHODS
from engine.quantization.method import LinearMethod
from engine.quantization.packing import is_panels, weight_format

N, K = 64, 96  # a whole number of panel pairs; K a multiple of every format's group
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "int8": 1e-5, "w8a8": 1e-5, "blocks": 1e-5}


def test_every_weight_format_but_auto_has_one_method() -> None:
    names = [m.name for m in METHODS]
    assert sorted(names) == sorted(set(WEIGHT_FORMATS) - {"auto"})
    assert set(TOLERANCE) == set(names), "a new format needs its row here"


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_a_methods_kernel_matches_its_torch_reference(
    method: type[LinearMethod], one_torch_thread: None
) -> None:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    m = method(kernels)
    gen = torch.Generator().manual_seed(7)
    weight, x, bias = torch.randn(N, K, generator=gen), torch.randn(5, K), torch.randn(N)
    blocks = from_parts([None], [N], weight) if m.name == "blocks" else None  # Q8_0 records
    panels = m.panels(weight, blocks)
    assert is_panels(panels) and weight_format(panels) == m.name
    out = torch.empty(5, N)
    assert m.gemm(out, x, panels, bias.data_ptr()) == 0
    want = m.reference(x, m.reference_pack(weight, blocks, 8), bias)
    rel = (out - want).norm() / want.norm()
    assert rel < TOLERANCE[m.name], f"{m.name} on path {m.path}: {rel:.2e} from its reference"
    plain = m.plain(panels)
    assert plain.shape == (N, K) and (plain - weight).norm() / weight.norm() < 0.01
    exact = F.linear(x, plain, bias)  # w8a8 and blocks quantize x too: ~1% off
    assert (out - exact).norm() / exact.norm() < 0.03
    values, scales, flag = m.decode_view(panels)
    assert values != 0 and flag == {"bf16": -1, "blocks": -2, "w8a8": 32}.get(m.name, 0)
    assert (scales != 0) == (m.name in ("int8", "w8a8", "blocks"))


def test_a_packed_linear_does_not_look_up_its_format_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kernels chosen once (issue 14): a projection's path, panels or torch reference,
    is bound when it is packed; a call no longer asks what format its weight is."""
    kernels = native.kernels()
    assert kernels is not None
    for weights, n in (("w8a8", N), ("w8a8", N + 8), ("fp32", N), ("int8", N)):  # N + 8: torch
        lin = Linear(NativeOps(kernels, weights), K, n, bias=True)
        lin.pack(batch_hint=8)
        x = torch.randn(3, K)
        want = lin(x)
        with monkeypatch.context() as patch:
            patch.setattr(matmuls, "weight_format", _no_lookup)
            torch.testing.assert_close(lin(x), want, rtol=0, atol=0)


def _no_lookup(weight: object) -> str:
    raise AssertionError("a packed Linear looked its weight's format up on a call")
