"""Scheduler behaviour with a fake runner whose "KV cache" really goes through page tables."""

import random

import pytest

from engine.config import EngineConfig
from engine.errors import PromptTooLongError, QueueFullError
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.fake_runner import EOS, FakeRunner

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def _engine(num_pages: int = 64, page_size: int = 4, **cfg: object) -> LLMEngine:
    config = EngineConfig(model="fake", **cfg)  # type: ignore[arg-type]
    return LLMEngine(config, FakeRunner(num_pages=num_pages, page_size=page_size))


def _drain(engine: LLMEngine) -> dict[str, str]:
    texts: dict[str, str] = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
    assert engine.free_pages() == engine.num_pages  # no page leak at rest
    return texts


def test_token_budget_and_chunked_prefill() -> None:
    engine = _engine(max_num_batched_tokens=8)
    engine.add_request("long", "x" * 30, GREEDY)
    engine.step()
    runner = engine.runner
    for _ in range(3):
        engine.step()
    chunks = [c for call in runner.calls for c in call]
    assert [len(c.token_ids) for c in chunks[:4]] == [8, 8, 8, 6]
    assert [c.sample for c in chunks[:4]] == [False, False, False, True]
    assert [c.start_pos for c in chunks[:4]] == [0, 8, 16, 24]
    _drain(engine)
    assert all(sum(len(c.token_ids) for c in call) <= 8 for call in runner.calls)


def test_continuous_batching_join_and_leave() -> None:
    engine = _engine()
    engine.add_request("a", "first prompt", SamplingParams(temperature=0, max_tokens=3))
    engine.step()
    engine.add_request("b", "second prompt", SamplingParams(temperature=0, max_tokens=6))
    outs = engine.step()  # b joins while a decodes
    assert {o.request_id for o in outs} == {"a", "b"}
    engine.step()
    assert [o.request_id for o in engine.step()] == ["b"]  # a left after 3 tokens
    _drain(engine)


def test_decodes_never_stall_behind_a_long_prefill() -> None:
    engine = _engine(max_num_batched_tokens=8)
    engine.add_request("short", "hi", SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    engine.add_request("long", "y" * 60, GREEDY)  # 8 steps of prefill at 8 tokens a step
    for _ in range(6):
        outs = engine.step()
        assert [o.request_id for o in outs] == ["short"]  # one token every step
    calls = engine.runner.calls[-6:]
    assert all(sum(len(c.token_ids) for c in call) == 8 for call in calls)
    _drain(engine)


def test_max_num_seqs_limits_running() -> None:
    engine = _engine(max_num_seqs=2)
    for i in range(5):
        engine.add_request(f"r{i}", f"{i} prompt", GREEDY)
    engine.step()
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.waiting) == 3
    _drain(engine)


def test_queue_full_and_prompt_too_long() -> None:
    engine = _engine(max_waiting=2)
    engine.add_request("a", "one", GREEDY)
    engine.add_request("b", "two", GREEDY)
    with pytest.raises(QueueFullError):
        engine.add_request("c", "three", GREEDY)
    with pytest.raises(PromptTooLongError):
        engine.add_request("d", "x" * engine.max_model_len, GREEDY)
    with pytest.raises(ValueError):
        engine.add_request("a", "dup", GREEDY)
    _drain(engine)


def test_max_tokens_clamped_to_context() -> None:
    engine = _engine()
    n = engine.max_model_len - 3
    engine.add_request("a", "x" * n, SamplingParams(temperature=0, max_tokens=100))
    outs = [o for _ in range(10) for o in engine.step()]
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 3
    _drain(engine)


def test_preemption_completes_with_same_output() -> None:
    prompts = [f"request number {i} " * (1 + i % 3) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=24)
    roomy = _engine(num_pages=128)
    expected = roomy.generate(prompts, params)
    tight = _engine(num_pages=24)  # far too few pages for all eight at once
    assert tight.generate(prompts, params) == expected
    assert tight.metrics.snapshot().preemptions > 0
    assert tight.free_pages() == tight.num_pages


def test_preempted_output_tokens_not_duplicated() -> None:
    engine = _engine(num_pages=20)
    for i in range(6):
        engine.add_request(
            f"r{i}", f"prompt {i} " * 3, SamplingParams(temperature=0, max_tokens=20)
        )
    tokens: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    while engine.has_unfinished():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.token_ids)
            counts[o.request_id] = o.completion_tokens
    assert engine.metrics.snapshot().preemptions > 0
    assert all(len(tokens[r]) == counts[r] == 20 for r in tokens)


def test_no_leak_after_random_finish_abort_preempt() -> None:
    rng = random.Random(0)
    engine = _engine(num_pages=24, max_num_batched_tokens=16)
    live: set[str] = set()
    for step in range(300):
        if rng.random() < 0.3 and len(engine.scheduler.waiting) < 10:
            rid = f"r{step}"
            prompt = "".join(rng.choice("abc ") for _ in range(rng.randint(1, 40)))
            params = SamplingParams(temperature=rng.choice([0, 1]), max_tokens=rng.randint(1, 30))
            engine.add_request(rid, prompt, params, cache_salt=rng.choice([None, "t1"]))
            live.add(rid)
        if live and rng.random() < 0.1:
            rid = rng.choice(sorted(live))
            engine.abort_request(rid)
        for out in engine.step():
            if out.finished:
                live.discard(out.request_id)
        held = engine.kv.pool.num_in_use()
        assert held + engine.free_pages() == engine.num_pages
    _drain(engine)
    assert engine.metrics.snapshot().preemptions > 0
    assert engine.kv.pool.num_in_use() == 0


def test_abort_frees_pages_at_once_and_reports() -> None:
    engine = _engine()
    engine.add_request("a", "x" * 20, GREEDY)
    engine.step()
    assert engine.free_pages() < engine.num_pages
    engine.abort_request("a")
    assert engine.free_pages() == engine.num_pages
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("a", True, "abort")]
    assert not engine.has_unfinished()
    engine.abort_request("a")  # unknown ids are ignored


def test_prefix_reuse_skips_computation_and_keeps_output() -> None:
    prompt = "shared system prompt " * 3 + "question"
    cold = _engine(enable_prefix_caching=False)
    expected = cold.generate([prompt], GREEDY)
    engine = _engine()
    assert engine.generate([prompt], GREEDY) == expected
    before = engine.runner.computed_tokens
    engine.add_request("again", prompt, GREEDY)
    outs = [o for _ in range(20) for o in engine.step()]
    assert "".join(o.text for o in outs) == expected[0]
    full_pages = (len(prompt) - 1) // 4
    assert outs[-1].cached_tokens == full_pages * 4
    computed = engine.runner.computed_tokens - before
    assert computed == len(prompt) - full_pages * 4 + GREEDY.max_tokens - 1
    snap = engine.metrics.snapshot()
    assert snap.prefix_cache_hits == full_pages * 4
    _drain(engine)
    engine.reset_prefix_cache()
    engine.add_request("cold", prompt, GREEDY)
    outs = [o for _ in range(20) for o in engine.step()]
    assert outs[-1].cached_tokens == 0 and "".join(o.text for o in outs) == expected[0]


def test_stop_token_eos_and_ignore_eos() -> None:
    engine = _engine()
    prompt = tuple(b"go")
    engine.runner.scripts[prompt] = [ord("h"), ord("i"), EOS, ord("x")]
    out = engine.generate([list(prompt)], SamplingParams(temperature=0, max_tokens=10))
    assert out == ["hi"]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert engine.generate([list(prompt)], params) == ["hix"]
    params = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ord("i")])
    assert engine.generate([list(prompt)], params) == ["h"]


def test_seeded_sampling_reproducible_even_when_preempted() -> None:
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=20)
    prompts = [f"p{i} " * 4 for i in range(6)]
    a = _engine(num_pages=128).generate(prompts, [params] * 6)
    b = _engine(num_pages=22).generate(prompts, [params] * 6)
    assert a == b
    other = SamplingParams(temperature=1.0, seed=8, max_tokens=20)
    assert _engine().generate(prompts[:1], other) != a[:1]


def test_same_prefix_arriving_together_is_computed_once() -> None:
    engine = _engine(num_pages=128, page_size=4, max_num_batched_tokens=16)
    prompt = "a long shared system prompt, then: "  # 35 tokens, then "q1" / "q2" / "q3"
    params = SamplingParams(temperature=0, max_tokens=4)
    prompts = [prompt + "q1", prompt + "q2", prompt + "q3"]
    expected = _engine(enable_prefix_caching=False).generate(prompts, params)
    assert engine.generate(prompts, params) == expected
    # r0 computes all 37 prompt tokens + 3 decodes; r1 and r2 wait for its pages, then
    # reuse 9 full pages (36 tokens) and compute 1 prompt token + 3 decodes each
    assert engine.runner.computed_tokens == 40 + 4 + 4
    assert engine.metrics.snapshot().prefix_cache_hits == 2 * 36
