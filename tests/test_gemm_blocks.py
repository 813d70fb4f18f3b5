""" "blocks" weights (a GGUF's Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks kept compact, int8
activations): the records hold exactly the file's values; the C kernel on every path this
CPU runs matches the torch reference, and gives w8a8's results bit for bit on the same
blocks expanded to int8 (Q4_0, Q5_0, Q8_0: the offsets go into the exact int32 sums); the
kernel source builds for Haswell and for baseline x86-64."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from engine import native
from engine.cpu_features import cpu_features
from engine.ops import NativeOps, TorchOps
from engine.quantization.block_weights import BlockWeight, blocks_reference, from_parts
from engine.quantization.gguf_blocks import int8_blocks
from engine.quantization.quant import W8A8_GROUP, Int8Weight, w8a8_panels
from tests.tiny_gguf import quantize_q6_k

_NEEDS = {"generic": (), "avx2": ("avx2", "fma"), "vnni": ("avx512f", "avx512bw", "avx512_vnni")}
TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K]
N, K = 128, 256  # 8 panels of 16 rows (4 of w8a8's panel pairs), one K-quant super-block
# one panel each, Q6_K between Q5_0 and Q8_0 (as in Qwen's fused rows) and after a requantized one
MIXED = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q6_K, QT.Q8_0, QT.Q4_K, None, QT.Q6_K]


def _ops(path: str, weights: str = "blocks") -> NativeOps:
    missing = [f for f in _NEEDS[path] if not cpu_features()[f]]
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(missing)}: the {path} path cannot run here")
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, weights, w8a8_path=path)


def _weight(seed: int, rows: int = N) -> torch.Tensor:
    w = torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))
    w[:, 40:60] += 0.7  # offsets Q4_1's minimum has to carry
    return w


def _file(qtype: QT, w: torch.Tensor) -> tuple[QT, np.ndarray]:
    own = {QT.Q4_K: _q4_k, QT.Q6_K: quantize_q6_k}.get(qtype)  # gguf's Python cannot write them
    return qtype, (own(w.numpy()) if own else quantize(w.numpy(), qtype))


def _q4_k(w: np.ndarray) -> np.ndarray:
    """Rows as Q4_K blocks (gguf's Python cannot write them): a plain min / max rounding,
    enough for valid blocks whose values gguf's own dequantization then defines."""
    x = w.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(x.min(axis=2), 0), x.max(axis=2)
    d, dmin = (hi - lo).max(axis=1) / 15 / 63, -lo.min(axis=1) / 63
    d, dmin = (np.where(v > 0, v, 1).astype(np.float16) for v in (d, dmin))
    sc = np.clip(np.round((hi - lo) / 15 / d[:, None].astype(np.float32)), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / dmin[:, None].astype(np.float32)), 0, 63).astype(np.uint8)
    step = (d[:, None].astype(np.float32) * sc)[..., None]
    q = np.clip(np.round((x + (dmin[:, None].astype(np.float32) * mn)[..., None]) / step), 0, 15)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    scales = np.concatenate(
        [sc[:, :4] | (sc[:, 4:] >> 4) << 6, mn[:, :4] | (mn[:, 4:] >> 4) << 6,
         (sc[:, 4:] & 15) | (mn[:, 4:] & 15) << 4], axis=1
    )  # fmt: skip
    qs = (q[:, :, 0] | q[:, :, 1] << 4).reshape(-1, 128)
    halves = [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8)]
    return np.concatenate([*halves, scales, qs], axis=1).reshape(w.shape[0], -1)


@pytest.mark.parametrize("qtype", TYPES)
def test_records_hold_the_files_values(qtype: QT) -> None:
    w = _weight(0)
    blocks = from_parts([_file(qtype, w)], [N], w)
    assert blocks.shape == (N, K) and blocks.type_counts() == {qtype.name.lower(): N}
    raw = _file(qtype, w)[1]
    if qtype == QT.Q4_K:  # scale and min per 32 widened to fp32: 6 bits a weight, not 4.5
        assert raw.size == N * K * 4.5 / 8 and blocks.data.numel() == N * K * 6 / 8
    elif qtype == QT.Q6_K:  # d repeated per 32: 7 bits a weight, not 6.5625 (Q8_0's 8.5 before)
        assert raw.size == N * K * 6.5625 / 8 and blocks.data.numel() == N * K * 7 / 8
    else:
        assert blocks.data.numel() == raw.size  # the file's bytes, no more
    assert np.array_equal(blocks.dequantize().numpy(), dequantize(raw, qtype))


def test_parts_mix_types_and_requantize_what_the_file_holds_otherwise() -> None:
    w = _weight(1, 112)
    parts = [_file(QT.Q5_0, w[:64]), _file(QT.Q8_0, w[64:80]), None]  # a K-quant, say
    blocks = from_parts(parts, [64, 16, 32], w)
    assert blocks.type_counts() == {"q5_0": 64, "q8_0": 48}
    got = blocks.dequantize()
    assert np.array_equal(got[:64].numpy(), dequantize(parts[0][1], QT.Q5_0))
    assert np.array_equal(got[80:].numpy(), dequantize(quantize(w[80:].numpy(), QT.Q8_0), QT.Q8_0))


def test_q6_k_rule_writes_blocks_gguf_reads_back() -> None:
    """The test's own Q6_K writer against gguf's dequantizer: near the weights, with
    negative sub-scales and both extreme codes in use (what the kernels must handle)."""
    w = _weight(6).numpy()
    raw = quantize_q6_k(w)
    assert raw.shape == (N, K // 256 * 210)
    back = dequantize(raw, QT.Q6_K)
    assert np.linalg.norm(back - w) / np.linalg.norm(w) < 0.03
    scales = raw.reshape(-1, 210)[:, 192:208].view(np.int8)
    assert scales.min() < 0 < scales.max()
    codes = from_parts([(QT.Q6_K, raw)], [N], torch.from_numpy(w)).dequantize().numpy()
    assert np.array_equal(codes, back)


def _mixed(seed: int) -> BlockWeight:
    w = _weight(seed)
    parts = [t and _file(t, w[16 * i : 16 * i + 16]) for i, t in enumerate(MIXED)]
    return from_parts(parts, [16] * len(MIXED), w)


@pytest.mark.parametrize("path", ["generic", "avx2", "vnni"])
@pytest.mark.parametrize("kind", [*TYPES, "mixed"])
@pytest.mark.parametrize("rows", [1, 3, 4, 13])
def test_blocks_gemm_matches_reference(path: str, kind: QT | str, rows: int) -> None:
    ops = _ops(path)
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, K, generator=gen), torch.randn(N, generator=gen)
    x[:, 7] *= 50  # an outlier channel: only its own group's scale grows
    w = _weight(2)
    blocks = _mixed(3) if kind == "mixed" else from_parts([_file(kind, w)], [N], w)
    packed = ops.pack_weight(w, rows, blocks)
    assert packed is blocks and ops.formats["blocks"] == 1
    for b in (None, bias):
        got = ops.linear(x, packed, b)
        want = blocks_reference(x, blocks, b)  # the same int8 values, fp32 sums through torch
        torch.testing.assert_close(got, want, rtol=1e-5, atol=3e-4)
        assert torch.equal(TorchOps("blocks").linear(x, blocks, b), want)
        exact = F.linear(x, blocks.dequantize(), b)
        assert (got - exact).norm() / exact.norm() < 0.02  # int8 activations: near fp32


@pytest.mark.parametrize("path", ["generic", "avx2", "vnni"])
@pytest.mark.parametrize("rows", [2, 9])
def test_q6_k_beside_other_types_at_odd_sizes(path: str, rows: int) -> None:
    """Three panels (an odd count), k of 3 super-blocks: one weight's Q6_K rows beside
    Q5_0 and Q8_0 ones, as Qwen's files mix them; 9 rows = VNNI's 8 + 1."""
    ops = _ops(path)
    w = torch.randn(48, 768, generator=torch.Generator().manual_seed(7))
    w[:, 300:330] += 1.5  # a shifted sub-block: large codes on one side only
    parts = [_file(t, w[16 * i : 16 * i + 16]) for i, t in enumerate([QT.Q5_0, QT.Q6_K, QT.Q8_0])]
    blocks = from_parts(parts, [16] * 3, w)
    assert blocks.type_counts() == {"q5_0": 16, "q6_k": 16, "q8_0": 16}
    assert np.array_equal(blocks.dequantize()[16:32].numpy(), dequantize(parts[1][1], QT.Q6_K))
    x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
    x[:, 5] *= 40  # int8 codes at +-127 beside 6-bit weight codes: no 16-bit saturation
    got, want = ops.linear(x, blocks), blocks_reference(x, blocks, None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-4)


@pytest.mark.parametrize("path", ["generic", "avx2", "vnni"])
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_0, QT.Q8_0])
def test_blocks_equal_w8a8_on_the_expanded_blocks(path: str, qtype: QT) -> None:
    """d * (q - 8) (- 16) and Q8_0 are w8a8's own layout once expanded: the compact
    kernel must give the same floats, not merely close ones."""
    blocks_ops, w8a8_ops = _ops(path), _ops(path, "w8a8")
    w = _weight(4)
    raw = _file(qtype, w)[1]
    q, scale = int8_blocks(raw, qtype)
    expanded = w8a8_panels(Int8Weight(torch.from_numpy(q), torch.from_numpy(scale), W8A8_GROUP))
    blocks = from_parts([(qtype, raw)], [N], w)
    for rows in (1, 4, 6, 13):  # every width of row kernel: 13 = 8 + 4 + 1
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(blocks_ops.linear(x, blocks), w8a8_ops.linear(x, expanded))


def test_tensors_without_kept_blocks_are_w8a8() -> None:
    ops = _ops("generic")
    packed = ops.pack_weight(_weight(5), 8, None)  # e.g. a K-quant ffn_down
    assert isinstance(packed, Int8Weight) and packed.group == W8A8_GROUP and packed.is_panels
    assert ops.choice_info()["weight_formats"] == "w8a8:1"
    torch_packed = TorchOps("blocks").pack_weight(_weight(5), 8, None)
    assert isinstance(torch_packed, Int8Weight) and not torch_packed.is_panels


@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_kernel_source_builds_for_older_cpus(march: str, tmp_path: Path) -> None:
    """-march=native here has AVX-512; the paths a Haswell or a baseline x86-64 machine
    would compile (each vector path carries its own target attribute) must build too."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = native.CSRC / "gemm_blocks.c"
    cmd = [cc, f"-march={march}", "-O2", "-fopenmp", "-std=gnu11", "-Werror", "-Wall"]
    done = subprocess.run([*cmd, "-c", str(src), "-o", str(tmp_path / "b.o")], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
