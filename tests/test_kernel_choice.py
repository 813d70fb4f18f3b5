"""Kernel choice by measurement (engine/quantization/kernel_choice.py): the faster path wins, the
decision is kept per CPU in the cache folder and read back without measuring, and the
engine's ops use it for weights "auto" and for prefill-sized matmuls."""

import json
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from prometheus_client import generate_latest

from engine import native
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.ops import NativeOps, TorchOps
from engine.quantization import kernel_choice
from engine.quantization.matmuls import PREFILL_ROWS
from engine.quantization.packing import weight_format
from engine.quantization.quant import Int8Weight, w8a8_reference
from engine.runner import ModelRunner
from gateway.cli import build_parser
from gateway.policy import EngineSettings


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _native(weights: str) -> NativeOps:
    kernels = native.kernels()
    assert kernels is not None, "the C kernels must build here (is gcc installed?)"
    return NativeOps(kernels, weights)


def _never() -> None:
    raise AssertionError("a stored decision must not be measured again")


def test_the_faster_candidate_wins_and_is_kept_per_cpu() -> None:
    calls = {"slow": 0, "fast": 0}

    def slow() -> None:
        calls["slow"] += 1
        time.sleep(0.003)

    def fast() -> None:
        calls["fast"] += 1

    assert kernel_choice.choose("demo", (8, 4), {"slow": slow, "fast": fast}) == "fast"
    assert calls["slow"] >= 2 and calls["fast"] >= 2  # warm-up and timed calls
    stored = json.loads(kernel_choice.choice_file().read_text())
    assert stored["demo:8x4"]["winner"] == "fast"
    assert set(stored["demo:8x4"]["us"]) == {"slow", "fast"}
    # read back (a new process would read the same file): nothing runs
    assert kernel_choice.choose("demo", (8, 4), {"slow": _never, "fast": _never}) == "fast"
    kernel_choice._read.cache_clear()
    assert kernel_choice.choose("demo", (8, 4), {"slow": _never, "fast": _never}) == "fast"
    # another shape class is its own decision
    assert kernel_choice.choose("demo", (16, 4), {"fast": fast, "slow": slow}) == "fast"


def test_a_changed_field_of_candidates_is_measured_again() -> None:
    def nap() -> None:
        time.sleep(0.003)

    def idle() -> None:
        pass

    assert kernel_choice.choose("field", (1,), {"a": idle, "b": nap}) == "a"
    assert kernel_choice.choose("field", (1,), {"b": _never}) == "b"  # one candidate: itself
    # a new path joins (a = fp32, b = int8, c = w8a8, say): measured against all of them
    assert kernel_choice.choose("field", (1,), {"a": nap, "b": nap, "c": idle}) == "c"
    assert kernel_choice.choose("field", (1,), {"a": _never, "b": _never, "c": _never}) == "c"


def test_a_damaged_decision_file_is_measured_again(own_cache: Path) -> None:
    path = kernel_choice.choice_file()
    path.parent.mkdir(parents=True)
    path.write_text("[not, json")
    kernel_choice._read.cache_clear()
    assert (
        kernel_choice.choose("x", (2,), {"a": lambda: None, "b": lambda: time.sleep(0.003)}) == "a"
    )
    assert json.loads(path.read_text())["x:2"]["winner"] == "a"


def test_auto_weights_pack_the_measured_format_and_stay_exact() -> None:
    ops = _native("auto")
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(64, 96, generator=gen), torch.randn(5, 96, generator=gen)
    packed = ops.pack_weight(weight, 8)
    fmt = ops.choices["format:64x96x8"]
    assert fmt in ("fp32", "int8", "w8a8") and ops.formats == {fmt: 1}
    assert isinstance(packed, Int8Weight) == (fmt != "fp32")
    if fmt == "w8a8":
        want = w8a8_reference(x, packed, None)
    else:
        want = F.linear(x, packed.dequantize() if fmt == "int8" else weight)
    torch.testing.assert_close(ops.linear(x, packed), want, rtol=1e-5, atol=1e-4)
    assert ops.choice_info()["weight_formats"] == f"{fmt}:1"
    # the torch path has no int8 kernel worth choosing: auto is fp32 there
    assert not isinstance(TorchOps("auto").pack_weight(weight, 8), Int8Weight)


@pytest.mark.parametrize("winner", ["panels", "torch"])
@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_prefill_matmuls_take_the_stored_winner(winner: str, weights: str) -> None:
    n, k = 64, 96
    key = f"gemm_{weights}:{n}x{k}x{PREFILL_ROWS}"
    kernel_choice._stored()[key] = {"winner": winner}
    ops = _native(weights)
    weight = torch.randn(n, k)
    packed = ops.pack_weight(weight, 8)
    # fewer rows: the panels, unmeasured (torch competes for prefills; oneDNN has no
    # candidate for these formats)
    assert ops.choices == {key: winner}
    assert ops.choice_info()["measured"] == f"gemm_{weights}={winner}:1"
    plain = packed.dequantize() if weights == "int8" else weight
    x, b = torch.randn(PREFILL_ROWS + 3, k), torch.randn(n)
    want = F.linear(x, plain, b)
    got = ops.linear(x, packed, b)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if winner == "torch":  # torch's own GEMM on the same plain weight: the same bits
        assert torch.equal(got, want)
    torch.testing.assert_close(ops.linear(x[:4], packed, b), want[:4], rtol=1e-5, atol=1e-4)


@pytest.mark.usefixtures("one_torch_thread")
def test_auto_runner_reports_its_choices_on_metrics() -> None:
    config = EngineConfig("smollm2-135m", kv_cache_bytes=16 * 737280, weights="auto")
    runner = ModelRunner(config)
    packed = [m.packed for m in runner.model.modules() if getattr(m, "packed", None) is not None]
    packed = list({id(p): p for p in [*packed, runner.model.packed_head]}.values())
    info = runner.kernel_info()
    assert info["weights"] == "auto" and runner.fused is not None
    formats = runner.ops.formats
    assert formats == Counter(weight_format(p) for p in packed)
    assert info["weight_formats"] == ",".join(f"{f}:{n}" for f, n in sorted(formats.items()))
    assert info["measured"].count("format=") >= 1
    # blocks get no row-class choice (torch would dequantize them per call); panels do
    assert ("gemm_" in info["measured"]) == any(f != "blocks" for f in formats)
    engine = LLMEngine(config, runner=runner)
    text = generate_latest(engine.metrics.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("tiergate_engine_kernel_info{"))
    assert f'weight_formats="{info["weight_formats"]}"' in line
    assert f'measured="{info["measured"]}"' in line
    # decisions are kept: a second runner measures nothing
    before = kernel_choice.choice_file().read_text()
    assert ModelRunner(config).ops.choices == runner.ops.choices
    assert kernel_choice.choice_file().read_text() == before


def test_auto_on_cli_and_policy() -> None:
    args = build_parser().parse_args(["engine", "--model", "m", "--weights", "auto"])
    assert args.weights == "auto"
    assert EngineSettings(weights="auto").to_config("smollm2-135m").weights == "auto"
