"""The C layer ops (NativeOps) against the torch ops they replace (TorchOps)."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.attention import build_context
from engine.batch import SeqChunk
from engine.kv.pages import new_kv_pools
from engine.ops import NativeOps, TorchOps, select_ops
from engine.sampling_params import SamplingParams


def _native() -> NativeOps:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels)


def both_paths(fn: Callable[[TorchOps], Any]) -> tuple[Any, Any]:
    """fn(ops) through the C kernels, then through the torch ops."""
    return fn(_native()), fn(TorchOps())


def test_ops_are_native_when_the_kernels_load(fresh_kernels: None) -> None:
    assert type(select_ops()) is NativeOps


def test_ops_are_torch_without_the_kernels(no_kernels: None) -> None:
    chosen = select_ops()
    assert type(chosen) is TorchOps and chosen.kernels is None


@pytest.mark.parametrize("rows", [1, 7, 300])  # 300 x 576 takes the parallel branch
@pytest.mark.parametrize("add", [False, True])
def test_add_rms_norm(rows: int, add: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    base, x = torch.randn(rows, 576, generator=gen), torch.randn(rows, 576, generator=gen)
    weight = torch.rand(576, generator=gen) + 0.5

    def run(ops: TorchOps) -> tuple[torch.Tensor, torch.Tensor]:
        residual = base.clone()
        return ops.add_rms_norm(residual, x if add else None, weight, 1e-5), residual

    (c_out, c_res), (t_out, t_res) = both_paths(run)
    torch.testing.assert_close(c_res, t_res)
    torch.testing.assert_close(c_out, t_out)
    assert torch.equal(c_res, base + x if add else base)


@pytest.mark.parametrize("rows", [1, 24, 100])
def test_silu_mul(rows: int) -> None:
    gate_up = torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows)) * 8
    gate_up[0, :4] = torch.tensor([-120.0, -90.0, 90.0, 0.0])  # exp's clamped ends
    c_out, t_out = both_paths(lambda ops: ops.silu_mul(gate_up))
    torch.testing.assert_close(c_out, t_out)


def test_rope_store_kv() -> None:
    heads, kv_heads, d, page = 9, 3, 64, 16
    greedy = SamplingParams(temperature=0)
    # a prefill chunk starting mid-page and a decode, on scattered pages
    chunks = [
        SeqChunk(0, list(range(20)), 5, [7, 2], False, greedy),
        SeqChunk(1, [3], 40, [9, 4, 11], True, greedy),
    ]
    ctx = build_context(chunks, page)
    positions = torch.tensor([*range(5, 25), 40])
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(21, (heads + 2 * kv_heads) * d, generator=gen)
    angles = torch.outer(positions.double(), 1e4 ** -(torch.arange(0, d, 2).double() / d))
    rope = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]

    def run(ops: TorchOps) -> tuple[torch.Tensor, ...]:
        pools = new_kv_pools(16, page, kv_heads, d, torch.float32)
        q, k, v = ops.rope_store_kv(qkv.clone(), rope, pools, ctx, heads, kv_heads)
        return q.clone(), k.clone(), v.clone(), pools[0].clone(), pools[1].clone()

    c_out, t_out = both_paths(run)
    for c, t in zip(c_out, t_out, strict=True):
        torch.testing.assert_close(c, t)
    # token 0 (position 5) sits in page 7 at offset 5; the decode (40) in page 11 at 8
    _, k, v, k_pool, v_pool = c_out
    torch.testing.assert_close(k_pool[7, :, :, 5], k[0])
    torch.testing.assert_close(v_pool[11, :, 8], v[20])
    assert k_pool[7, :, :, :5].abs().sum() == 0  # slots before the chunk stay untouched


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 24, 64, 301])  # every row-block size
@pytest.mark.parametrize("with_bias", [False, True])
def test_panel_gemm_matches_linear(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 200, generator=gen)  # 3 panel pairs: each thread's share
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 200, generator=gen)
    ops = _native()
    packed = ops.pack_weight(weight, batch_hint=64)
    assert packed.shape == (6, 200, 16)
    # fp32 sums of 200 products in another order: ~1e-5 apart on values of ~15
    got, want = ops.linear(x, packed, bias), F.linear(x, weight, bias)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_weights_not_in_panel_pairs_use_onednn() -> None:
    weight = torch.randn(40, 64)  # 40 columns: not a whole number of panel pairs
    ops = _native()
    packed = ops.pack_weight(weight, batch_hint=8)
    assert packed.dim() == 2
    x = torch.randn(5, 64)
    torch.testing.assert_close(ops.linear(x, packed), F.linear(x, weight))
