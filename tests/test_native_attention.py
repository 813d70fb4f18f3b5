"""The C decode-attention kernel against plain torch attention, and its fallback."""

from pathlib import Path

import pytest
import torch

from engine import native
from engine.attention import KernelRows, kernel_attention
from engine.config import EngineConfig
from engine.kv.pages import new_kv_pools
from engine.ops import TorchOps
from engine.runner import ModelRunner

pytestmark = pytest.mark.usefixtures("fresh_kernels")


def _random_case(
    heads: int, kv_heads: int, lens: list[int], page_size: int = 16, head_dim: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(lens) * 31 + heads)
    num_pages = 4 * sum(-(-n // page_size) for n in lens)
    k_pool, v_pool = new_kv_pools(num_pages, page_size, kv_heads, head_dim, torch.float32)
    k_pool.copy_(torch.randn(k_pool.shape, generator=gen))
    v_pool.copy_(torch.randn(v_pool.shape, generator=gen))
    width = max(-(-n // page_size) for n in lens)
    # scattered pages, as a long-running pool hands them out
    table = torch.randperm(num_pages, generator=gen)[: len(lens) * width].view(len(lens), width)
    q = torch.randn(len(lens), heads, head_dim, generator=gen)
    return q, k_pool, v_pool, table.to(torch.int32), torch.tensor(lens, dtype=torch.int32)


def _torch_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
) -> torch.Tensor:
    """Each row's pages gathered token-major, then softmax attention over its length."""
    kv_heads, d = v_pool.shape[1], v_pool.shape[3]  # [pages, KVH, page_size, D]
    out = torch.empty_like(q)
    for row, n in enumerate(lens.tolist()):
        pages = table[row].long()
        k = k_pool[pages].permute(1, 0, 3, 2).reshape(kv_heads, -1, d)[:, :n]
        v = v_pool[pages].transpose(0, 1).reshape(kv_heads, -1, d)[:, :n]
        group = q.shape[1] // kv_heads  # query heads per KV head
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (q[row, :, None, :] @ k.transpose(1, 2)) * d**-0.5  # [H, 1, n]
        out[row] = (torch.softmax(scores, dim=-1) @ v)[:, 0]
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "lens", "page_size"),
    [
        (9, 3, [1, 16, 17, 33, 250, 700], 16),  # SmolLM2's grouping; page-edge lengths
        (14, 2, [5, 64, 300], 16),  # Qwen2.5-0.5B's grouping
        (4, 4, [2, 31], 16),  # no grouping
        (9, 3, [1, 5, 6, 11, 40], 5),  # pages narrower than a vector: the scalar tails
        (9, 3, [31, 32, 33, 100], 32),  # two vectors per page
    ],
)
def test_kernel_matches_torch_path(
    heads: int, kv_heads: int, lens: list[int], page_size: int
) -> None:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    q, k_pool, v_pool, table, ctx_lens = _random_case(heads, kv_heads, lens, page_size)
    out = torch.full_like(q, float("nan"))
    kernel_attention(kernels, q, k_pool, v_pool, KernelRows(0, len(lens), table, ctx_lens), out)
    torch.testing.assert_close(out, _torch_decode(q, k_pool, v_pool, table, ctx_lens))


def test_kernel_ignores_pages_past_each_length() -> None:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    q, k_pool, v_pool, table, lens = _random_case(9, 3, [20, 40])
    out = torch.empty_like(q)
    kernel_attention(kernels, q, k_pool, v_pool, KernelRows(0, 2, table, lens), out)
    # poison every slot past each sequence's length: the result must not move
    for row, n in enumerate(lens.tolist()):
        for pos in range(n, table.shape[1] * 16):
            k_pool[table[row, pos // 16], :, :, pos % 16] = float("nan")
            v_pool[table[row, pos // 16], :, pos % 16] = float("nan")
    again = torch.empty_like(q)
    kernel_attention(kernels, q, k_pool, v_pool, KernelRows(0, 2, table, lens), again)
    assert torch.equal(out, again)


def test_disabled_kernels_fall_back_to_torch(no_kernels: None) -> None:
    assert native.kernels() is None
    runner = ModelRunner(EngineConfig(model="smollm2-135m", kv_cache_bytes=64 * 737280))
    assert type(runner.ops) is TorchOps and runner.ops.kernels is None and runner.fused is None


def test_missing_compiler_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert native.kernels() is None
