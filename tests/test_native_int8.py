"""int8 weights: the C kernel on every path this CPU runs against the fp32 reference (the
dequantized weight through torch), the requantization itself, and CPU feature detection."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.cpu_features import cpu_features, cpu_flags, features_from_flags
from engine.ops import NativeOps, TorchOps, select_ops
from engine.quantization.int8 import int8_path
from engine.quantization.packing import is_panels
from engine.quantization.quant import Int8Weight, quantize_int8

_NEEDS = {"generic": (), "avx2": ("avx2", "fma"), "avx512": ("avx512f",)}


def _ops(path: str) -> NativeOps:
    missing = [f for f in _NEEDS[path] if not cpu_features()[f]]
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {path} path cannot run here")
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, "int8", path)


def test_quantize_int8_per_row_symmetric() -> None:
    w = torch.randn(64, 40, generator=torch.Generator().manual_seed(0))
    w[3] *= 100  # a loud row keeps its own scale and does not crush the others
    w[5] = 0  # an all-zero row stays zero
    plain, panels = quantize_int8(w), quantize_int8(w, 16)
    assert plain.q.dtype == torch.int8 and plain.q.shape == (64, 40)
    assert panels.q.shape == (4, 40, 16) and panels.is_panels and not plain.is_panels
    assert plain.q.abs().amax(dim=1)[torch.arange(64) != 5].eq(127).all()
    torch.testing.assert_close(panels.dequantize(), plain.dequantize(), rtol=0, atol=0)
    err = (plain.dequantize() - w).abs()
    assert (err <= plain.scale[:, None] / 2 + 1e-6).all()  # round to nearest
    assert plain.dequantize()[5].eq(0).all()


@pytest.mark.parametrize("path", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 13, 16, 17, 40])  # > 16: the widening buffer
@pytest.mark.parametrize("bias", [False, True])
def test_int8_gemm_matches_fp32_reference(path: str, rows: int, bias: bool) -> None:
    ops = _ops(path)
    gen = torch.Generator().manual_seed(rows)
    n, k = 96, 200
    weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    packed = ops.pack_weight(weight, rows)
    assert isinstance(packed, Int8Weight) and is_panels(packed)
    got = ops.linear(x, packed, b)
    want = F.linear(x, packed.dequantize(), b)  # fp32 on the same int8 values
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(TorchOps("int8").linear(x, packed, b), want)
    # and int8 stays near the fp32 weight it stands for (about 1% per output)
    rel = (got - F.linear(x, weight, b)).norm() / F.linear(x, weight, b).norm()
    assert rel < 0.02


def test_odd_widths_take_the_torch_reference() -> None:
    ops = _ops("generic")
    weight = torch.randn(40, 64)  # 40 is not a whole number of panel pairs
    packed = ops.pack_weight(weight, 4)
    assert isinstance(packed, Int8Weight) and not is_panels(packed)
    x = torch.randn(3, 64)
    torch.testing.assert_close(ops.linear(x, packed), F.linear(x, packed.dequantize()))


def test_unknown_weight_format_refused() -> None:
    with pytest.raises(ValueError, match="weights must be one of"):
        select_ops("int4")


def test_int8_path_follows_the_features() -> None:
    none = dict.fromkeys(("avx2", "fma", "avx512f"), False)
    assert int8_path({**none, "avx512f": True}) == "avx512"
    assert int8_path({**none, "avx2": True, "fma": True}) == "avx2"
    assert int8_path({**none, "avx2": True}) == "torch"
    assert int8_path(none) == "torch"


def test_features_from_cpuinfo_text() -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512bw amx_tile amx_int8\n"
    flags = cpu_flags(text)
    found = features_from_flags(flags, amx_granted=True)
    assert found["avx2"] and found["avx512f"] and found["amx"]
    assert not found["avx512_bf16"] and not found["avx_vnni"]
    # listed by the CPU but not granted by the OS: AMX is not usable
    assert not features_from_flags(flags, amx_granted=False)["amx"]
    assert not found["amx_bf16"]  # not listed: int8 tiles only
    assert features_from_flags(flags | {"amx_bf16"}, amx_granted=True)["amx_bf16"]
    assert cpu_flags("model name\t: none\n") == set()


def test_this_cpu_features_match_proc_cpuinfo() -> None:
    found = cpu_features()
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    assert found["avx2"] == ("avx2" in flags)
    assert found["avx512f"] == ("avx512f" in flags)
    assert set(found) == {
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx",
        "amx_bf16",
    }
