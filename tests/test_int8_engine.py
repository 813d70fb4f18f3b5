"""An engine with int8 weights (`weights: int8`): what it holds, its fused decode step,
how close it stays to fp32, and where it says what it runs (/metrics, the CLI)."""

import pytest
import torch
from prometheus_client import generate_latest

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.layers.linear import Linear
from engine.llm_engine import LLMEngine
from engine.quantization.quant import Int8Weight
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from gateway.cli import build_parser
from gateway.policy import EngineSettings

GREEDY = SamplingParams(temperature=0)
PAGE = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Water boils at a temperature of",
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _runner(weights: str) -> ModelRunner:
    config = EngineConfig("smollm2-135m", kv_cache_bytes=64 * 737280, weights=weights)
    return ModelRunner(config)


@pytest.fixture(scope="module")
def runners() -> dict[str, ModelRunner]:
    with torch.inference_mode():
        return {w: _runner(w) for w in ("fp32", "int8")}


def _prefill_logits(runner: ModelRunner, ids: list[int], seq: int) -> torch.Tensor:
    chunk = SeqChunk(seq, ids, 0, list(range(seq * 8, seq * 8 + 8)), True, GREEDY)
    with torch.inference_mode():
        ctx = build_context([chunk], PAGE, kernels=runner.ops.kernels)
        hidden = runner.model(torch.tensor(ids), torch.arange(len(ids)), ctx, runner.kv_caches)
        return runner.model.compute_logits(hidden[-1:])[0]


def test_int8_runner_holds_int8_panels_only(runners: dict[str, ModelRunner]) -> None:
    r = runners["int8"]
    linears = [m for m in r.model.modules() if isinstance(m, Linear)]
    assert linears and all(isinstance(m.packed, Int8Weight) for m in linears)
    assert all(m.weight is None and m.packed.q.dtype == torch.int8 for m in linears)
    assert isinstance(r.model.packed_head, Int8Weight) and r.model.packed_head.is_panels
    assert r.fused is not None, "int8 decode steps run fused too"
    info = r.kernel_info()
    assert info["weights"] == "int8" and info["int8_path"] == r.ops.int8_path != "torch"
    assert runners["fp32"].kernel_info()["int8_path"] == "none"
    fp32_bytes = sum(
        m.packed.nbytes for m in runners["fp32"].model.modules() if isinstance(m, Linear)
    )
    int8_bytes = sum(m.packed.nbytes for m in linears)
    assert int8_bytes < fp32_bytes / 3.9  # a byte a weight plus a scale a row


def test_int8_fused_decode_equals_layer_by_layer(runners: dict[str, ModelRunner]) -> None:
    r = runners["int8"]
    prompts = [r.tokenizer.encode(p) for p in PROMPTS]
    for i, ids in enumerate(prompts):  # cache all but the last token
        _prefill_logits(r, ids[:-1], i)
    decodes = [
        SeqChunk(i, ids[-1:], len(ids) - 1, list(range(i * 8, i * 8 + 8)), True, GREEDY)
        for i, ids in enumerate(prompts)
    ]
    decodes.sort(key=lambda c: c.start_pos)
    ids = torch.tensor([c.token_ids[0] for c in decodes])
    pos = torch.tensor([c.start_pos for c in decodes])
    with torch.inference_mode():
        ctx = build_context(decodes, PAGE, kernels=r.ops.kernels)
        layer_by_layer = r.model.compute_logits(r.model(ids, pos, ctx, r.kv_caches))
        ctx = build_context(decodes, PAGE, kernels=r.ops.kernels)
        scratch = torch.empty(r.fused.workspace_floats(len(decodes)))
        fused = r.fused.logits(ids, r.model.rotary(pos), ctx, scratch)
    assert torch.equal(fused, layer_by_layer)


def test_int8_logits_stay_close_to_fp32(runners: dict[str, ModelRunner]) -> None:
    for i, text in enumerate(PROMPTS):
        ids = runners["fp32"].tokenizer.encode(text)
        want = _prefill_logits(runners["fp32"], ids, i)
        got = _prefill_logits(runners["int8"], ids, i)
        # int8's pick is fp32's pick or a near tie with it (greedy agreement over a prompt
        # set is bench/precision.py's measure)
        assert want.max() - want[got.argmax()] < 0.25, text
        assert torch.cosine_similarity(got, want, dim=0) > 0.995
        # and not bit-identical: the int8 weights are really in use
        assert not torch.equal(got, want)


def test_int8_without_c_kernels_runs_the_torch_reference(
    runners: dict[str, ModelRunner], no_kernels: None
) -> None:
    reference = _runner("int8")  # `runners` were built (ops chosen) before the kernels went off
    assert reference.ops.kernels is None and reference.fused is None
    assert reference.kernel_info()["int8_path"] == "torch"
    ids = reference.tokenizer.encode(PROMPTS[0])
    got = _prefill_logits(runners["int8"], ids, 5)
    torch.testing.assert_close(got, _prefill_logits(reference, ids, 5), rtol=1e-3, atol=2e-3)


def test_kernel_info_gauge_on_metrics(runners: dict[str, ModelRunner]) -> None:
    engine = LLMEngine(runners["int8"].config, runner=runners["int8"])
    text = generate_latest(engine.metrics.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("tiergate_engine_kernel_info{"))
    assert 'weights="int8"' in line and f'int8_path="{runners["int8"].ops.int8_path}"' in line
    assert 'ops="native"' in line and "avx512f=" in line and line.endswith(" 1.0")


def test_weights_setting_on_cli_and_policy() -> None:
    parser = build_parser()
    assert parser.parse_args(["engine", "--model", "m"]).weights == "fp32"
    assert parser.parse_args(["engine", "--model", "m", "--weights", "int8"]).weights == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["engine", "--model", "m", "--weights", "int4"])
    assert EngineSettings(weights="int8").to_config("smollm2-135m").weights == "int8"
    assert EngineSettings().to_config("smollm2-135m").weights == "fp32"
    with pytest.raises(ValueError, match="fp32"):
        EngineSettings(weights="int4")
