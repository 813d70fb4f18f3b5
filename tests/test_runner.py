"""Paged forward: chunked prefill and mixed batches match one full forward."""

import random
from pathlib import Path

import pytest
import torch

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.config import EngineConfig
from engine.model_registry import resolve_model
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.weights import load_model

GREEDY = SamplingParams(temperature=0)
PAGE = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(
        EngineConfig(model="smollm2-135m", kv_cache_bytes=256 * 737280, page_size=PAGE)
    )


def _prompt(runner: ModelRunner, n: int, seed: int) -> list[int]:
    text = "The history of paged attention and continuous batching. " * 40
    ids = runner.tokenizer.encode(text)
    start = seed * 7 % 50
    assert len(ids) >= start + n
    return ids[start : start + n]


def _logits(runner: ModelRunner, chunks: list[SeqChunk], use_kernel: bool = False) -> torch.Tensor:
    """All-token logits of a batch packed the way the runner packs it (prefills first);
    attention through the torch path, or the runner's C kernels with use_kernel."""
    ids = torch.tensor([t for c in chunks for t in c.token_ids])
    pos = torch.tensor(
        [p for c in chunks for p in range(c.start_pos, c.start_pos + len(c.token_ids))]
    )
    with torch.inference_mode():
        ctx = build_context(chunks, PAGE, kernels=runner.ops.kernels if use_kernel else None)
        hidden = runner.model(ids, pos, ctx, runner.kv_caches)
        return runner.model.compute_logits(hidden)


def test_bytes_per_page(runner: ModelRunner) -> None:
    c = runner.model_config
    assert (
        ModelRunner.bytes_per_page(c, 16) == 2 * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 4
    )
    assert runner.num_pages == 256
    assert runner.kv_caches[0][0].shape == (256, c.num_kv_heads, c.head_dim, PAGE)
    assert runner.kv_caches[0][1].shape == (256, c.num_kv_heads, PAGE, c.head_dim)


@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
def test_chunked_prefill_matches_full_forward(runner: ModelRunner, use_kernel: bool) -> None:
    """Chunks after the first continue a cached prefix: SDPA over gathered pages, or
    each token a C-kernel row reading the pages in place."""
    ids = _prompt(runner, 75, 0)
    full = _logits(runner, [SeqChunk(0, ids, 0, list(range(5)), False, GREEDY)])
    pages = random.Random(1).sample(range(10, 200), 5)  # scattered, non-contiguous pages
    got, start = [], 0
    for size in (5, 16, 11, 1, 30, 12):  # crosses page boundaries, includes a 1-token chunk
        chunk = ids[start : start + size]
        chunks = [SeqChunk(1, chunk, start, pages, False, GREEDY)]
        if use_kernel and start > 0 and size > 1:
            ctx = build_context(chunks, PAGE, kernels=runner.ops.kernels)
            assert len(ctx.prefix_rows) == 1
        got.append(_logits(runner, chunks, use_kernel))
        start += size
    torch.testing.assert_close(torch.cat(got), full, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
def test_mixed_batch_matches_single_sequences(runner: ModelRunner, use_kernel: bool) -> None:
    """Three sequences in one step (prefill chunk with a prefix, a fresh prefill, decodes)
    give the same logits as each run alone."""
    a, b, c = _prompt(runner, 40, 1), _prompt(runner, 23, 2), _prompt(runner, 33, 3)
    alone = [_logits(runner, [SeqChunk(0, s, 0, list(range(3)), False, GREEDY)]) for s in (a, b, c)]
    pa, pb, pc = [50, 7, 90], [120, 33], [15, 200, 201]
    # step 1: cache a[:20] and c[:32]
    _logits(
        runner,
        [SeqChunk(1, a[:20], 0, pa, False, GREEDY), SeqChunk(3, c[:32], 0, pc, False, GREEDY)],
    )
    # step 2: a continues (prefix 20), b starts fresh, c decodes its 33rd token
    mixed = _logits(
        runner,
        [
            SeqChunk(1, a[20:], 20, pa, False, GREEDY),
            SeqChunk(2, b, 0, pb, False, GREEDY),
            SeqChunk(3, c[32:], 32, pc, False, GREEDY),
        ],
        use_kernel,
    )
    torch.testing.assert_close(mixed[:20], alone[0][20:], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(mixed[20:43], alone[1], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(mixed[43:], alone[2][32:], atol=2e-3, rtol=1e-3)


def _greedy_alone(runner: ModelRunner, ids: list[int], pages: list[int], n: int) -> list[int]:
    out = [runner.execute([SeqChunk(0, ids, 0, pages, True, GREEDY)])[0]]
    while len(out) < n:
        pos = len(ids) + len(out) - 1
        out.append(runner.execute([SeqChunk(0, [out[-1]], pos, pages, True, GREEDY)])[0])
    return out


def test_execute_interleaved_equals_alone(runner: ModelRunner) -> None:
    """execute() over staggered sequences (chunked prefills next to decodes, caller order
    mixed) returns each sequence's own greedy continuation."""
    prompts = [_prompt(runner, n, i) for i, n in enumerate((37, 5, 20))]
    tables = [[60 + 4 * i + j for j in range(4)] for i in range(3)]
    expected = [_greedy_alone(runner, p, tables[i], 6) for i, p in enumerate(prompts)]
    done = [0, 0, 0]  # prompt tokens cached so far
    outs: list[list[int]] = [[], [], []]
    for step in range(12):
        chunks, who = [], []
        for i in range(3) if step % 2 else (2, 0, 1):
            if step < i * 2 or len(outs[i]) >= 6:
                continue  # staggered arrivals; finished sequences leave
            p = prompts[i]
            if done[i] < len(p):  # prefill in chunks of at most 16 tokens
                n = min(16, len(p) - done[i])
                chunk = SeqChunk(
                    i, p[done[i] : done[i] + n], done[i], tables[i], done[i] + n == len(p), GREEDY
                )
                done[i] += n
            else:
                chunk = SeqChunk(
                    i, [outs[i][-1]], len(p) + len(outs[i]) - 1, tables[i], True, GREEDY
                )
            chunks.append(chunk)
            who.append(i)
        for i, tok in zip(who, runner.execute(chunks), strict=True):
            if tok is not None:
                outs[i].append(tok)
            else:
                assert done[i] < len(prompts[i])
    assert outs == expected


def test_execute_returns_none_for_non_sampling_chunks(runner: ModelRunner) -> None:
    ids = _prompt(runner, 10, 4)
    out = runner.execute(
        [SeqChunk(0, ids[:6], 0, [3], False, GREEDY), SeqChunk(1, ids, 0, [4], True, GREEDY)]
    )
    assert out[0] is None and isinstance(out[1], int)


@pytest.mark.parametrize("use_kernel", [False, True], ids=["torch", "kernel"])
def test_decode_batch_of_mixed_lengths_matches_alone(runner: ModelRunner, use_kernel: bool) -> None:
    """Decodes of very different context lengths in one step."""
    lens = [3, 150, 20, 17, 90, 5, 40, 33, 120, 8, 64, 2]
    tables = [[i * 10 + j for j in range(10)] for i in range(len(lens))]
    prompts = [_prompt(runner, n + 1, i) for i, n in enumerate(lens)]
    for i, p in enumerate(prompts):  # cache all but the last token
        _logits(runner, [SeqChunk(i, p[:-1], 0, tables[i], False, GREEDY)])
    decodes = [
        SeqChunk(i, p[-1:], len(p) - 1, tables[i], False, GREEDY) for i, p in enumerate(prompts)
    ]
    batched = _logits(runner, decodes, use_kernel)
    for row, c in enumerate(decodes):
        alone = _logits(runner, [c])  # the torch path
        torch.testing.assert_close(batched[row : row + 1], alone, atol=2e-3, rtol=1e-3)


def test_fused_decode_step_equals_the_layer_by_layer_forward(runner: ModelRunner) -> None:
    """Decode-only steps run as one C call (engine/csrc/decode_step.c): the same kernels in
    the same order as the model's forward, so the logits are bit-identical."""
    assert runner.fused is not None, "the C kernels must build here (is gcc installed?)"
    lens = [1, 15, 16, 17, 70, 33]
    tables = [[200 + i * 8 + j for j in range(8)] for i in range(len(lens))]
    prompts = [_prompt(runner, n + 1, i + 3) for i, n in enumerate(lens)]
    for i, p in enumerate(prompts):  # cache all but the last token
        _logits(runner, [SeqChunk(i, p[:-1], 0, tables[i], False, GREEDY)])
    decodes = [
        SeqChunk(i, p[-1:], len(p) - 1, tables[i], True, GREEDY) for i, p in enumerate(prompts)
    ]
    decodes.sort(key=lambda c: c.start_pos)
    layer_by_layer = _logits(runner, decodes, use_kernel=True)
    ids = torch.tensor([c.token_ids[0] for c in decodes])
    pos = torch.tensor([c.start_pos for c in decodes])
    ctx = build_context(decodes, PAGE, kernels=runner.ops.kernels)
    scratch = torch.empty(runner.fused.workspace_floats(len(decodes)))
    with torch.inference_mode():
        fused = runner.fused.logits(ids, runner.model.rotary(pos), ctx, scratch)
        # into a caller's buffer (the runner keeps one): every value written, same logits
        buffer = torch.full((len(decodes) + 2, fused.shape[1]), float("nan"))
        into = runner.fused.logits(ids, runner.model.rotary(pos), ctx, scratch, buffer[1:-1])
    assert torch.equal(fused, layer_by_layer)
    assert torch.equal(into, fused) and into.data_ptr() == buffer[1].data_ptr()
    assert buffer[0].isnan().all() and buffer[-1].isnan().all()


def _mapped_file(address: int) -> str | None:
    """The file behind the memory mapping holding address (None: anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            path = fields[5] if len(fields) > 5 else ""
            return path if path.startswith("/") else None
    return None


def test_plain_weights_dropped_and_rebuilt_exactly(runner: ModelRunner) -> None:
    _, fresh = load_model(resolve_model("smollm2-135m"))
    for i in (0, 17):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            lin = runner.model.layers[i].get_submodule(name)
            assert lin.weight is None, "the panels hold it: the plain copy is dropped"
            want = fresh.layers[i].get_submodule(name).weight
            assert torch.equal(lin.plain_weight(), want)
    # what stays was copied out of the weight cache's file mapping, so that mapping closes
    for name, param in runner.model.named_parameters():
        assert _mapped_file(param.data_ptr()) is None, name
    assert _mapped_file(fresh.embed_tokens.weight.data_ptr()) is not None  # the check sees maps
