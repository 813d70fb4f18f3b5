"""bench/requant4.py's 4/5-bit requantizer: codes in range, each value within half a step
of its reconstruction (a step more only where the top code clamps), Q4_1 exact on a group
it can represent, bit for bit what gguf-py's llama.cpp port makes, and the int8 form the
w8a8 engine takes standing for the same values."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from bench.requant4 import GROUP, RULES, requantize

QTYPES = {"q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0}
FP16_EPS = 2.0**-10  # relative spacing of fp16 values (the stored scale's rounding: half)


def weights(seed: int = 0, rows: int = 24, k: int = 4 * GROUP) -> torch.Tensor:
    """Projection-like rows, with a zero group and an outlier group among them."""
    w = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[3, :GROUP] = 0.0
    w[5, GROUP + 7] = 0.5
    return w


@pytest.mark.parametrize("name", list(RULES))
def test_codes_in_range_and_error_within_half_a_step(name: str) -> None:
    rule, w = RULES[name], weights()
    r = requantize(w, rule)
    top = (1 << rule.bits) - 1
    assert r.codes.dtype == torch.uint8 and r.codes.shape == w.shape
    assert int(r.codes.max()) <= top
    assert r.scale.shape == r.low.shape == (w.shape[0], w.shape[1] // GROUP)
    assert torch.equal(r.scale.half().float(), r.scale)  # what a file can store
    err = (w - r.dequantize()).abs().view(w.shape[0], -1, GROUP)
    step = r.scale.abs()[..., None]
    # the stored scale is the fp32 one rounded to fp16: up to top * eps / 2 steps more
    slack = step * (top * FP16_EPS / 2) + 1e-9
    clamped = (r.codes == top).view_as(err) if rule.symmetric else torch.zeros_like(err, dtype=bool)
    assert (err[~clamped] <= (step * 0.5 + slack).expand_as(err)[~clamped]).all()
    # symmetric: the value opposite the max sits at x / d + offset = top + 1, clamped to top
    assert (err[clamped] <= (step + slack).expand_as(err)[clamped]).all()
    assert torch.equal(r.dequantize()[3, :GROUP], torch.zeros(GROUP))  # a zero group stays zero
    assert err.mean() < 0.3 * step.mean()  # rounding, not truncation: errors spread in the step


def test_q4_1_exact_on_a_representable_group() -> None:
    low, scale = torch.tensor(-0.375), torch.tensor(0.0625)  # fp16 values
    codes = torch.arange(32) % 16
    w = (low + codes * scale).view(1, GROUP)
    r = requantize(w, RULES["q4_1"])
    assert torch.equal(r.codes.view(-1), codes.to(torch.uint8))
    assert torch.equal(r.dequantize(), w)


@pytest.mark.parametrize("name", list(RULES))
def test_same_blocks_as_gguf_quantize(name: str) -> None:
    w = weights(seed=1)
    want = dequantize(quantize(w.numpy(), QTYPES[name]), QTYPES[name])
    assert np.array_equal(requantize(w, RULES[name]).dequantize().numpy(), want)


@pytest.mark.parametrize("name", ["q4_0", "q5_0"])
def test_int8_form_stands_for_the_same_values(name: str) -> None:
    rule, w = RULES[name], weights(seed=2)
    r = requantize(w, rule)
    packed = r.int8(rule)
    half = 1 << (rule.bits - 1)
    assert int(packed.q.min()) >= -half and int(packed.q.max()) <= half - 1
    assert torch.equal(packed.dequantize(), r.dequantize())


@pytest.mark.parametrize("name", list(RULES))
def test_a_files_own_blocks_come_back_unchanged(name: str) -> None:
    """Requantizing a block type's own dequantization by its rule is lossless (why
    SmolLM2's Q4_1 projections requantized to Q4_1 score exactly fp32 in the bench)."""
    qtype = QTYPES[name]
    w = dequantize(quantize(weights(seed=3).numpy(), qtype), qtype)
    assert np.array_equal(requantize(torch.from_numpy(w), RULES[name]).dequantize().numpy(), w)
