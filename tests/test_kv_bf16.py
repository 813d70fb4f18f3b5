"""K/V cache in bf16 (`kv_dtype: bf16`): twice the pages per budget, the C kernels that
store and read bf16 pages against the fp32 ones on the same values, and an engine that
runs on them (fused decode, torch fallback, settings)."""

import pytest
import torch

from engine import native
from engine.attention import AttentionContext, build_context, kernel_attention
from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.kv.pages import new_kv_pools
from engine.ops import NativeOps, TorchOps, select_ops
from engine.runner import ModelRunner
from gateway.cli import build_parser
from gateway.policy import EngineSettings
from tests.engine_steps import GREEDY, decode_logits

BUDGET = 16 * 737280  # 16 fp32 pages of SmolLM2


def _kernels():
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return kernels


@pytest.fixture(scope="module")
def runners(one_torch_thread: None) -> dict[str, ModelRunner]:
    return {
        kv: ModelRunner(EngineConfig("smollm2-135m", kv_cache_bytes=BUDGET, kv_dtype=kv))
        for kv in ("fp32", "bf16")
    }


def test_bf16_pools_hold_twice_the_pages(runners: dict[str, ModelRunner]) -> None:
    fp32, bf16 = runners["fp32"], runners["bf16"]
    assert bf16.num_pages == 2 * fp32.num_pages == 32
    assert all(k.dtype == v.dtype == torch.bfloat16 for k, v in bf16.kv_caches)
    pool_bytes = sum(k.untyped_storage().nbytes() for k, _ in bf16.kv_caches)
    assert pool_bytes <= BUDGET
    assert bf16.kernel_info()["kv_dtype"] == "bf16" and bf16.fused is not None
    with pytest.raises(ValueError, match="kv_dtype"):
        ModelRunner(EngineConfig("smollm2-135m", kv_cache_bytes=BUDGET, kv_dtype="int4"))


def test_bf16_attention_kernel_equals_fp32_on_the_same_values() -> None:
    kernels = _kernels()
    gen = torch.Generator().manual_seed(0)
    pages, page, kvh, d, heads = 12, 16, 3, 64, 9
    k16, v16 = new_kv_pools(pages, page, kvh, d, torch.bfloat16)
    k16.copy_(torch.randn(k16.shape, generator=gen))
    v16.copy_(torch.randn(v16.shape, generator=gen))
    k32, v32 = new_kv_pools(pages, page, kvh, d, torch.float32)
    k32.copy_(k16.float())
    v32.copy_(v16.float())
    chunks = [
        SeqChunk(i, [1], n - 1, table, True, GREEDY)
        for i, (n, table) in enumerate([(37, [4, 9, 2]), (16, [0]), (70, [1, 3, 5, 7, 11])])
    ]
    q = torch.randn(3, heads, d, generator=gen)
    outs = []
    for k_pool, v_pool in ((k16, v16), (k32, v32)):
        ctx = build_context(chunks, page, kernels=kernels)
        out = torch.empty_like(q)
        kernel_attention(kernels, q, k_pool, v_pool, ctx.decode_rows, out)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def _store(ops: NativeOps | TorchOps, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    heads, kvh, d, t = 6, 2, 32, 5
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=gen)
    cos, sin = torch.randn(t, 1, d // 2, generator=gen), torch.randn(t, 1, d // 2, generator=gen)
    pools = new_kv_pools(4, 16, kvh, d, dtype)
    chunk = SeqChunk(0, list(range(t)), 14, [2, 0], True, GREEDY)
    ctx: AttentionContext = build_context([chunk], 16, kernels=ops.kernels)
    ops.rope_store_kv(qkv, (cos.contiguous(), sin.contiguous()), pools, ctx, heads, kvh)
    return pools


def test_bf16_store_rounds_as_torch() -> None:
    native_ops, torch_ops = NativeOps(_kernels()), TorchOps()
    got, want = _store(native_ops, torch.bfloat16), _store(torch_ops, torch.bfloat16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    fp32 = _store(torch_ops, torch.float32)
    assert torch.equal(got[0], fp32[0].bfloat16()) and fp32[0].abs().sum() > 0


@pytest.mark.parametrize("text", ["The capital of France is", "def fibonacci(n):\n    "])
def test_bf16_kv_decode_stays_close_to_fp32(runners: dict[str, ModelRunner], text: str) -> None:
    bf16 = runners["bf16"]
    fused, layer_by_layer = decode_logits(bf16, text, True), decode_logits(bf16, text, False)
    assert torch.equal(fused, layer_by_layer)
    want = decode_logits(runners["fp32"], text, False)
    assert torch.cosine_similarity(fused, want, dim=0) > 0.999
    assert want.max() - want[fused.argmax()] < 0.25  # fp32's pick, or a near tie with it
    assert not torch.equal(fused, want)  # the bf16 pages are really in use


def test_bf16_kv_on_the_torch_path(
    runners: dict[str, ModelRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERGATE_NATIVE", "0")
    native.kernels.cache_clear()
    try:
        assert select_ops().kernels is None
        r = ModelRunner(EngineConfig("smollm2-135m", kv_cache_bytes=BUDGET, kv_dtype="bf16"))
    finally:
        monkeypatch.delenv("TIERGATE_NATIVE")
        native.kernels.cache_clear()
    assert r.ops.kernels is None and r.kv_caches[0][0].dtype == torch.bfloat16
    text = "The capital of France is"
    got = decode_logits(r, text, False)
    want = decode_logits(runners["bf16"], text, False)
    # oneDNN's matmuls against the C panels' (fp32 KV differs by as much), same pick
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-2)
    assert got.argmax() == want.argmax()


def test_kv_dtype_on_cli_and_policy() -> None:
    parser = build_parser()
    assert parser.parse_args(["engine", "--model", "m"]).kv_dtype == "fp32"
    assert parser.parse_args(["engine", "--model", "m", "--kv-dtype", "bf16"]).kv_dtype == "bf16"
    with pytest.raises(SystemExit):
        parser.parse_args(["engine", "--model", "m", "--kv-dtype", "int4"])
    assert EngineSettings(kv_dtype="bf16").to_config("smollm2-135m").kv_dtype == "bf16"
    with pytest.raises(ValueError, match="fp32"):
        EngineSettings(kv_dtype="fp16")
