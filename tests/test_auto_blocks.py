"""`weights: auto` considers a GGUF's kept blocks and costs each format as a decode step
streams it (engine/quantization/memory_roofline.py): max(hot time, bytes / measured
bandwidth) per row count. The choice is driven here by given bandwidths and timings, so it
is deterministic; the tiny GGUF's auto model runs each chosen format as that format's
reference does, decisions are kept per CPU, and a Hugging Face folder (no blocks) never
offers blocks."""

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine.layers.linear import Linear
from engine.model_registry import resolve_model
from engine.ops import TorchOps, select_ops
from engine.quantization import kernel_choice, memory_roofline
from engine.quantization.block_weights import BlockWeight
from engine.quantization.memory_roofline import KeptBlocks, roofline_seconds
from engine.quantization.onednn import Gemm
from engine.quantization.packing import weight_format
from engine.weights import load_model
from tests.test_model_reference import one_pass_logits
from tests.tiny_gguf import tiny_llama, write_llama_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(3)).tolist()
TYPES = {
    "attn_q": QT.Q4_1,
    "attn_k": QT.Q5_0,
    "attn_v": QT.Q8_0,
    "attn_output": QT.Q4_0,
    "ffn_gate": QT.Q4_1,
    "ffn_up": QT.Q4_1,
}  # fmt: skip  (ffn_down f32: no blocks)
GB = 1e9


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _tiny_gguf(folder: Path) -> Path:
    types = {"token_embd.weight": QT.Q8_0}
    for i in range(2):
        types |= {f"blk.{i}.{n}.weight": t for n, t in TYPES.items()}
    return write_llama_gguf(folder / "tiny.gguf", tiny_llama(True), lambda _: None, types)


def _bandwidth(bytes_per_s: float) -> None:
    """This machine's streaming bandwidth as if measured (one thread: the fixture's)."""
    key = f"figure:stream_bytes_per_s_t{torch.get_num_threads()}"
    kernel_choice._stored()[key] = {"value": bytes_per_s}


def _hot_seconds(per_format: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """Hot GEMM timings as if measured: per format, seconds per row of x."""

    def timed(fn) -> float:
        if isinstance(fn.func, Gemm):  # a row class's paths (matmuls._choose_rows): panels
            return 0.0 if fn.func.name == "panels" else 1.0
        x, packed = fn.args
        return per_format[weight_format(packed)] * x.shape[0]

    monkeypatch.setattr(kernel_choice, "seconds_per_call", timed)


def _auto_model(path: Path, batch: int = 8) -> torch.nn.Module:
    _, model = load_model(resolve_model(str(path)), select_ops("auto"))
    assert model.ops.kernels is not None, "the C kernels must build here (is gcc installed?)"
    model.pack_weights(batch_hint=batch)
    return model


def _packed(model: torch.nn.Module) -> dict[str, object]:
    found = {n: m.packed for n, m in model.named_modules() if isinstance(m, Linear)}
    return found | {"head": model.packed_head}


def test_bytes_decide_at_one_row_compute_at_the_batch() -> None:
    """The README's Qwen figures (Q5_0 gate|up 9728 x 896, 20 GB/s, one thread): hot,
    blocks tie w8a8 at 1 row and lose ~10% at 32; streamed they read 61% of the bytes."""
    w8a8, blocks = 9728 * 896 * 36 // 32, 9728 * 896 * 22 // 32
    cost = {"w8a8": ([150e-6, 1.67e-3], w8a8), "blocks": ([150e-6, 1.86e-3], blocks)}

    def pick(bandwidth: float) -> str:
        costs = {f: roofline_seconds(hot, n, bandwidth) for f, (hot, n) in cost.items()}
        return min(costs, key=costs.__getitem__)

    assert pick(20 * GB) == "blocks"  # 0.49 vs 0.30 ms at one row: bytes decide
    assert pick(1e6 * GB) == "w8a8"  # a cache-fast memory: only compute counts
    # Q8_0 blocks save 6% of the bytes: not worth 20% more compute at the batch
    cost["blocks"] = ([150e-6, 2.0e-3], w8a8 * 17 // 18)
    assert pick(20 * GB) == "w8a8"
    assert roofline_seconds([1.0, 4.0], 1, 1e9) == pytest.approx(2.0)  # geometric mean
    assert roofline_seconds([1e-6, 1e-3], 10**6, 1e6) == pytest.approx(1.0)  # bytes floor


def test_auto_picks_blocks_where_bytes_dominate(tmp_path: Path) -> None:
    _bandwidth(1e6)  # 1 MB/s: every format is bound by its bytes
    path = _tiny_gguf(tmp_path)
    model = _auto_model(path)
    got = {n: weight_format(p) for n, p in _packed(model).items()}
    # the fewest bytes win: the 4-5-bit blocks; int8 (8 bits + a scale per row of 64 or
    # 96) where the file kept none (down_proj) or only Q8_0 (the head: 8.5 bits a weight)
    for name, fmt in got.items():
        int8 = name == "head" or name.endswith("mlp.down_proj")
        assert fmt == ("int8" if int8 else "blocks"), name
    assert model.ops.formats == {"blocks": 6, "int8": 3}
    info = model.ops.choice_info()
    assert info["weight_formats"] == "blocks:6,int8:3" and "format=blocks:" in info["measured"]
    # each chosen format runs as its reference does; the model stays near fp32's
    reference, x = TorchOps(), torch.randn(5, 96)
    for name, packed in _packed(model).items():
        xk = x[:, : packed.shape[1]]
        want, out = reference.linear(xk, packed), model.ops.linear(xk, packed)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, msg=name)
    _, fp32 = load_model(resolve_model(str(path)))
    want, logits = one_pass_logits(fp32, IDS, 4), one_pass_logits(model, IDS, 4)
    assert torch.cosine_similarity(logits, want, dim=1).min() > 0.995
    # where auto took blocks it holds the records `weights: blocks` packs
    _, blocks = load_model(resolve_model(str(path)), select_ops("blocks"))
    blocks.pack_weights(batch_hint=8)
    held = _packed(blocks)
    for name, packed in _packed(model).items():
        if isinstance(packed, BlockWeight):
            assert torch.equal(held[name].data, packed.data), name


@pytest.mark.parametrize("fastest", ["fp32", "w8a8"])
def test_auto_keeps_the_faster_compute_where_bytes_do_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fastest: str
) -> None:
    _bandwidth(1e9 * GB)  # memory as fast as the cache: the hot timings decide
    hot = {"fp32": 2e-6, "int8": 3e-6, "w8a8": 2e-6, "blocks": 2.2e-6} | {fastest: 1e-6}
    _hot_seconds(hot, monkeypatch)
    model = _auto_model(_tiny_gguf(tmp_path))
    assert model.ops.formats == {fastest: 9}


def test_decisions_and_bandwidth_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _tiny_gguf(tmp_path)
    first = {n: weight_format(p) for n, p in _packed(_auto_model(path)).items()}
    stored = json.loads(kernel_choice.choice_file().read_text())
    key = f"figure:stream_bytes_per_s_t{torch.get_num_threads()}"
    assert stored[key]["value"] > 1e8  # measured: any machine streams > 100 MB/s
    offered = [set(v["us"]) for k, v in stored.items() if k.startswith("format:")]
    assert {"fp32", "int8", "w8a8", "blocks"} in offered  # kept blocks compete
    assert {"fp32", "int8", "w8a8"} in offered  # down_proj: none kept

    def never(*_: object) -> float:
        raise AssertionError("a kept decision or figure was measured again")

    monkeypatch.setattr(kernel_choice, "seconds_per_call", never)
    monkeypatch.setattr(memory_roofline, "measure_bandwidth", never)
    kernel_choice._read.cache_clear()  # as a new process: read back from the file
    before = kernel_choice.choice_file().read_text()
    again = _auto_model(path)
    assert {n: weight_format(p) for n, p in _packed(again).items()} == first
    assert kernel_choice.choice_file().read_text() == before


def test_a_hugging_face_folder_never_offers_blocks(tmp_path: Path) -> None:
    _bandwidth(1e6)  # where blocks would win if offered
    folder = tmp_path / "hf"
    tiny_llama(True).save_pretrained(folder)
    _, model = load_model(resolve_model(str(folder)), select_ops("auto"))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert not any(isinstance(m.blocks, KeptBlocks) for m in linears)
    model.pack_weights(batch_hint=8)
    assert "blocks" not in model.ops.formats and sum(model.ops.formats.values()) == 9
    stored = json.loads(kernel_choice.choice_file().read_text())
    offered = [set(v["us"]) for k, v in stored.items() if k.startswith("format:")]
    assert offered and all(names == {"fp32", "int8", "w8a8"} for names in offered)


def test_without_the_c_kernels_auto_reads_no_blocks(tmp_path: Path, no_kernels: None) -> None:
    """The torch path's auto is fp32 (its int8 is only the reference): no records built."""
    _, model = load_model(resolve_model(str(_tiny_gguf(tmp_path))), select_ops("auto"))
    assert model.ops.kernels is None
    assert not any(
        isinstance(m.blocks, KeptBlocks) for m in model.modules() if hasattr(m, "blocks")
    )
    model.pack_weights(batch_hint=8)
    assert model.ops.formats == {"fp32": 9}
    assert not list((tmp_path / "cache" / "weights").glob("*.records*"))
