"""torch's oneDNN GEMMs as kernel-choice candidates (engine/quantization/onednn.py): each
matches its reference, the row-class choice takes what the measurement says (timings
injected, then measured for real), and the choice shows where the others do."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.ops import NativeOps
from engine.quantization import kernel_choice, onednn
from engine.quantization.matmuls import PREFILL_ROWS, ROW_CLASSES
from engine.quantization.quant import quantize_w8a8, w8a8_reference

N, K = 64, 96


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TIERGATE_ONEDNN", "int8")  # int_mm is opt-in: offer every candidate
    return tmp_path


def _native(weights: str) -> NativeOps:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, weights)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w, b = torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)
    return w, b, torch.randn(PREFILL_ROWS + 5, K, generator=gen)


@pytest.mark.skipif(not onednn.bf16_supported(), reason="torch has no oneDNN bf16 here")
@pytest.mark.parametrize("name", ["onednn_bf16", "mkldnn_bf16"])
@pytest.mark.parametrize("rows", [1, 7, PREFILL_ROWS + 5])
def test_bf16_candidates_match_the_bf16_reference(name: str, rows: int) -> None:
    w, b, x = _data()
    gemm = onednn.candidates("bf16", w, 8)[name]
    x = x[:rows]
    # the reference: x and w rounded to bf16, exact products summed in fp32
    want = F.linear(x.bfloat16().float(), w.bfloat16().float(), b)
    got = gemm(x, b)
    assert got.dtype == torch.float32 and got.shape == (rows, N)
    # oneDNN rounds its output to bf16 (8 bits of mantissa): a few 1e-3 of the magnitude
    torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("rows", [1, 7, PREFILL_ROWS + 5])
def test_int_mm_matches_its_reference_and_stays_near_w8a8(rows: int) -> None:
    w, b, x = _data(1)
    gemm = onednn.candidates("w8a8", w, 8)["int_mm"]
    x = x[:rows]
    got = gemm(x, b)
    # int32 sums are exact: only fp32 scaling differs from the fp32 reference
    torch.testing.assert_close(got, onednn.int_mm_reference(x, gemm.weight, b))
    # per-row scales are coarser than w8a8's groups of 32, but the same maths
    near = w8a8_reference(x, quantize_w8a8(w, panels=False), b)
    assert (got - near).abs().max() < 0.05 * near.abs().max()
    exact = F.linear(x, w, b)
    assert (got - exact).abs().max() < 0.05 * exact.abs().max()


def test_int_mm_takes_a_strided_x() -> None:
    w, _, x = _data(2)
    gemm = onednn.candidates("w8a8", w, 8)["int_mm"]
    wide = torch.cat([x, x], dim=1)[:, :K]  # a view with a row stride of 2K
    torch.testing.assert_close(gemm(wide), gemm(x.contiguous()))


def test_the_setting_chooses_the_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    w, _, _ = _data()
    monkeypatch.setenv("TIERGATE_ONEDNN", "0")
    assert onednn.names("w8a8") == () and onednn.candidates("bf16", w, 8) == {}
    monkeypatch.setenv("TIERGATE_ONEDNN", "1")  # the default: bf16's, not int_mm's coarser maths
    assert onednn.names("w8a8") == () and onednn.candidates("w8a8", w, 8) == {}
    assert onednn.names("bf16") == (
        ("onednn_bf16", "mkldnn_bf16") if onednn.bf16_supported() else ()
    )
    assert set(onednn.names("fp32")) == set(onednn.names("int8")) == set()


def _injected(table: dict[str, dict[int, float]], monkeypatch: pytest.MonkeyPatch) -> list:
    """Timings as if measured: seconds per (path name, rows); the calls seen."""
    seen = []

    def timed(fn) -> float:
        gemm, (x,) = fn.func, fn.args
        seen.append((gemm.name, x.shape[0]))
        return table[gemm.name][x.shape[0]]

    monkeypatch.setattr(kernel_choice, "seconds_per_call", timed)
    return seen


@pytest.mark.parametrize("weights", ["w8a8", "bf16"])
def test_each_row_class_takes_its_measured_winner(
    weights: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("panels", "torch", *onednn.names(weights))
    if len(names) == 2:
        pytest.skip("torch offers no oneDNN candidate for this format here")
    one = names[2]  # a oneDNN candidate wins the prefill rows, the panels the others
    small, large = ROW_CLASSES[:-1], ROW_CLASSES[-1]
    table = {n: {r: 1.0 for r in ROW_CLASSES} for n in names}
    for rows in small:
        table["panels"][rows] = 0.1
    table[one][large] = 0.1
    seen = _injected(table, monkeypatch)
    ops = _native(weights)
    w, b, x = _data(3)
    packed = ops.pack_weight(w, 8)
    # every class measured its candidates, torch (on the rebuilt weight) the prefill one
    want = {(n, r) for n in names for r in ROW_CLASSES if n != "torch" or r == large}
    assert set(seen) == want
    keys = {kernel_choice.choice_key(f"gemm_{weights}", (N, K, r)): r for r in ROW_CLASSES}
    assert ops.choices == {key: one if r == large else "panels" for key, r in keys.items()}
    assert f"gemm_{weights}={one}:1" in ops.choice_info()["measured"]
    # the call takes its class's path: prefill rows oneDNN's, fewer the panels
    gemm = onednn.candidates(weights, w, 8)[one]
    torch.testing.assert_close(ops.linear(x, packed, b), gemm(x, b))
    few = x[: PREFILL_ROWS - 1]
    panels = ops.linear(few, packed, b)
    assert not torch.equal(panels, gemm(few, b))  # not oneDNN's: rounded otherwise
    ref = ops.methods[weights].reference
    plain = packed if weights == "w8a8" else ops.methods[weights].plain(packed)
    want = ref(few, plain, b)  # bf16 panels round x to bf16 too: a few 1e-3 off
    assert (panels - want).abs().max() < 0.01 * want.abs().max()
    # a new process reads the decisions back and builds only the winner
    kernel_choice._read.cache_clear()
    seen.clear()
    again = _native(weights)
    torch.testing.assert_close(again.linear(x, again.pack_weight(w, 8), b), gemm(x, b))
    assert seen == [] and again.choices == ops.choices


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("weights", ["w8a8", "bf16"])
def test_a_real_measurement_picks_the_fastest_and_stays_correct(weights: str) -> None:
    if not onednn.names(weights):
        # only the panels at the decode row classes: nothing competes, nothing is measured
        pytest.skip("torch offers no oneDNN candidate for this format here")
    ops = _native(weights)
    w, b, x = _data(4)
    packed = ops.pack_weight(w, 8)
    stored = kernel_choice._stored()
    for rows in ROW_CLASSES:
        key = kernel_choice.choice_key(f"gemm_{weights}", (N, K, rows))
        us = stored[key]["us"]
        torch_too = {"torch"} if rows == PREFILL_ROWS else set()
        assert set(us) == {"panels", *onednn.names(weights)} | torch_too
        assert ops.choices[key] == stored[key]["winner"] == min(us, key=us.__getitem__)
    ref = ops.methods[weights].reference
    plain = packed if weights == "w8a8" else ops.methods[weights].plain(packed)
    for rows in (1, 33, PREFILL_ROWS + 5):  # whichever path won each class, near the reference
        got, want = ops.linear(x[:rows], packed, b), ref(x[:rows], plain, b)
        assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_stored_panels_build_no_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    for rows in ROW_CLASSES:  # every class decided, for the panels or torch
        key = kernel_choice.choice_key("gemm_w8a8", (N, K, rows))
        kernel_choice._stored()[key] = {"winner": "torch" if rows == PREFILL_ROWS else "panels"}

    def never(*_: object) -> None:
        raise AssertionError("no oneDNN copy is needed where none won")

    monkeypatch.setattr(onednn, "candidates", never)
    ops = _native("w8a8")
    w, b, x = _data(5)
    packed = ops.pack_weight(w, 8)
    want = F.linear(x, packed.dequantize(), b)  # torch on the rebuilt weight, for prefills
    assert torch.equal(ops.linear(x, packed, b), want)
    assert sorted(ops.choices.values()) == ["panels", "panels", "torch"]
