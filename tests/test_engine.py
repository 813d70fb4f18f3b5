"""LLMEngine and AsyncEngine on the real ModelRunner with SmolLM2-135M (short generations)."""

import asyncio
import random
import time
import weakref
from collections.abc import Iterator

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.errors import (
    CompletionTooLongError,
    EngineDeadError,
    PromptTooLongError,
    QueueFullError,
    RequestFailedError,
)
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams

MODEL = "smollm2-135m"
SYSTEM = (
    "You are a careful assistant for a small bakery. Answer briefly and politely, and never "
    "invent prices. The bakery opens at seven and closes at six, sells bread, cakes and "
    "coffee, and takes orders for birthday cakes two days ahead. "
)
GREEDY = SamplingParams(temperature=0, max_tokens=12)


def _config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"model": MODEL, "kv_cache_bytes": 64 << 20, "num_threads": 1}
    return EngineConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(_config())


@pytest.fixture(scope="module")
def small_runner() -> ModelRunner:
    """A KV pool of 12 pages (192 tokens): a few requests at once must preempt."""
    per_page = ModelRunner.bytes_per_page(_load_config(), 16)
    return ModelRunner(_config(kv_cache_bytes=12 * per_page))


def _load_config():  # type: ignore[no-untyped-def]
    from engine.model_registry import resolve_model
    from engine.weights import load_model

    return load_model(resolve_model(MODEL))[0]


def _run(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    assert engine.free_pages() == engine.num_pages  # nothing leaks at rest
    return outs


def _text(outs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outs)


def test_prefix_hits_and_greedy_equality(runner: ModelRunner) -> None:
    prompt = SYSTEM + "Question: when do you open?"
    other = SYSTEM + "Question: can I order a cake for Friday?"
    cold = LLMEngine(_config(enable_prefix_caching=False), runner)
    expected = cold.generate([prompt, other], GREEDY)
    engine = LLMEngine(_config(), runner)
    ids = engine.tokenizer.encode(prompt)
    full = (len(ids) - 1) // engine.page_size * engine.page_size

    engine.add_request("first", prompt, GREEDY)
    first = _run(engine)["first"]
    assert first[-1].cached_tokens == 0 and _text(first) == expected[0]

    engine.add_request("second", prompt, GREEDY)
    second = _run(engine)["second"]
    assert second[-1].cached_tokens == full  # every full page of the prompt
    assert _text(second) == expected[0]

    engine.add_request("other", other, GREEDY)  # shares only the system prompt's pages
    third = _run(engine)["other"]
    assert 0 < third[-1].cached_tokens < full + engine.page_size
    assert _text(third) == expected[1]

    engine.add_request("salted", prompt, GREEDY, cache_salt="tenant-b")
    assert _run(engine)["salted"][-1].cached_tokens == 0
    snap = engine.metrics.snapshot()
    assert snap.prefix_cache_hits == full + third[-1].cached_tokens


def test_stop_string_across_tokens(runner: ModelRunner) -> None:
    engine = LLMEngine(_config(), runner)
    prompt = "The capital of France is"
    engine.add_request("plain", prompt, GREEDY)
    outs = _run(engine)["plain"]
    pieces = [engine.tokenizer.decode([t]) for o in outs for t in o.token_ids]
    text = "".join(pieces)
    # a stop string from the middle of one token's text to the start of the next one
    k = next(i for i in range(1, len(pieces)) if len(pieces[i - 1]) > 1 and pieces[i])
    start = sum(len(p) for p in pieces[: k - 1]) + 1
    stop = text[start : sum(len(p) for p in pieces[:k]) + 1]
    params = SamplingParams(temperature=0, max_tokens=12, stop=[stop])
    engine.add_request("stopped", prompt, params)
    got = _run(engine)["stopped"]
    assert got[-1].finish_reason == "stop"
    assert _text(got) == text[: text.find(stop)]
    assert stop not in _text(got)


def test_streamed_text_equals_full_decode(runner: ModelRunner) -> None:
    engine = LLMEngine(_config(), runner)
    prompts = ["Say hello in Chinese, Japanese and Greek:", "Emoji for joy and fire:"]
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=16)
    for i, p in enumerate(prompts):
        engine.add_request(f"u{i}", p, params)
    for outs in _run(engine).values():
        ids = [t for o in outs for t in o.token_ids]
        assert _text(outs) == engine.tokenizer.decode(ids)
        assert outs[-1].completion_tokens == len(ids)


def test_seed_reproducible(runner: ModelRunner) -> None:
    engine = LLMEngine(_config(), runner)
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=10)
    alone = engine.generate(["Once upon a time"], params)
    batched = engine.generate(["Once upon a time", "Hello there", "1, 2, 3,"], [params] * 3)
    assert alone[0] == batched[0]
    reseeded = engine.generate(["Once upon a time"], SamplingParams(1.0, seed=99, max_tokens=10))
    assert reseeded != alone


def test_preemption_with_tiny_kv_budget(runner: ModelRunner, small_runner: ModelRunner) -> None:
    prompts = [f"Item {i}. {SYSTEM[: 60 + 25 * i]}" for i in range(4)]  # distinct first pages
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    expected = LLMEngine(_config(), runner).generate(prompts, params)
    no_reserve = {"kv_watermark": 0, "kv_reserve_tokens": 0}  # admit into the last pages
    tight = LLMEngine(
        _config(kv_cache_bytes=small_runner.config.kv_cache_bytes, **no_reserve), small_runner
    )
    assert tight.num_pages == 12
    assert tight.generate(prompts, params) == expected
    assert tight.metrics.snapshot().preemptions > 0
    assert tight.free_pages() == tight.num_pages


def test_no_leak_after_finish_abort_preempt(small_runner: ModelRunner) -> None:
    engine = LLMEngine(_config(kv_watermark=0, kv_reserve_tokens=0), small_runner)
    rng = random.Random(1)
    for i in range(6):
        prompt = f"{i}. {SYSTEM[: rng.randint(100, 300)]}"
        params = SamplingParams(temperature=0.8, max_tokens=rng.randint(10, 30), ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    finished = []
    for step in range(12):
        finished += [o for o in engine.step() if o.finished]
        if step in (3, 7):
            engine.abort_request(f"r{step % 6}")
    finished += [o[-1] for o in _run(engine).values()]
    assert engine.metrics.snapshot().preemptions > 0
    assert sorted(o.finish_reason for o in finished) == ["abort"] * 2 + ["length"] * 4


def test_limits(runner: ModelRunner) -> None:
    engine = LLMEngine(_config(max_waiting=2), runner)
    engine.add_request("a", "Hi", GREEDY)
    engine.add_request("b", "Hello", GREEDY)
    with pytest.raises(QueueFullError):
        engine.add_request("c", "Hey", GREEDY)
    with pytest.raises(PromptTooLongError):
        engine.add_request("d", [1] * engine.max_model_len, GREEDY)
    engine.abort_request("a")
    engine.abort_request("b")
    _run(engine)
    # max_tokens is clamped to the context: the request ends with "length" at the limit
    engine = LLMEngine(_config(max_model_len=40), runner)
    engine.add_request("e", [1] * (engine.max_model_len - 2), SamplingParams(0, max_tokens=50))
    last = _run(engine)["e"][-1]
    assert last.finish_reason == "length" and last.completion_tokens == 2


def test_check_room_refuses_a_completion_beyond_the_context(runner: ModelRunner) -> None:
    """#29.12: a requested max_tokens the context cannot hold after the prompt is refused
    (OpenAI's wording, on max_tokens); exactly the room left is accepted."""
    engine = LLMEngine(_config(max_model_len=40), runner)
    engine.check_room(30, 10)
    engine.check_room(30, None)  # no max_tokens asked: the answer runs to the end
    with pytest.raises(CompletionTooLongError) as info:
        engine.check_room(30, 11)
    assert info.value.param == "max_tokens"
    assert str(info.value).startswith("This model's maximum context length is 40 tokens.")
    assert "41 tokens (30 in the prompt, 11 in the completion)" in str(info.value)
    with pytest.raises(PromptTooLongError):
        engine.check_room(40, None)


# -- AsyncEngine --------------------------------------------------------------------------


@pytest.fixture
def async_engine(runner: ModelRunner) -> Iterator[AsyncEngine]:
    engine = AsyncEngine(_config(), runner)
    engine.start()
    yield engine
    engine.shutdown()


async def _collect(engine: AsyncEngine, prompt: str, params: SamplingParams, rid: str) -> str:
    return "".join([o.text async for o in engine.generate(prompt, params, rid)])


async def _wait_all_free(engine: AsyncEngine) -> None:
    for _ in range(500):
        if engine.engine.free_pages() == engine.engine.num_pages:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("pages were not freed")


async def test_async_concurrent_streams(async_engine: AsyncEngine, runner: ModelRunner) -> None:
    prompts = ["The capital of France is", "def add(a, b):", "Roses are red,"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = LLMEngine(_config(), runner).generate(prompts, params)
    got = await asyncio.gather(
        *[_collect(async_engine, p, params, f"s{i}") for i, p in enumerate(prompts)]
    )
    assert got == expected
    await _wait_all_free(async_engine)
    snap = async_engine.metrics.snapshot()
    assert snap.generated_tokens == 3 * params.max_tokens and snap.running == 0


async def test_async_idle_loop_sleeps(async_engine: AsyncEngine) -> None:
    await _collect(async_engine, "Hi", SamplingParams(temperature=0, max_tokens=2), "warm")
    before = time.process_time()
    await asyncio.sleep(0.5)
    assert time.process_time() - before < 0.1  # no busy-wait while idle


async def test_async_early_close_and_cancel_free_pages(async_engine: AsyncEngine) -> None:
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    stream = async_engine.generate(SYSTEM, long, "closed")
    first = await stream.__anext__()
    assert not first.finished
    await stream.aclose()
    await _wait_all_free(async_engine)

    started = asyncio.Event()

    async def consume() -> None:
        async for _ in async_engine.generate(SYSTEM, long, "cancelled"):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_all_free(async_engine)
    assert not async_engine.engine.has_unfinished()


async def test_async_rejections_before_first_output(runner: ModelRunner) -> None:
    engine = AsyncEngine(_config(max_waiting=1, max_num_seqs=1), runner)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    with pytest.raises(PromptTooLongError):
        await _collect(engine, "word " * engine.max_model_len, GREEDY, "too-long")
    streams = [engine.generate("Tell me a story.", long, f"q{i}") for i in range(3)]
    firsts = await asyncio.gather(*[s.__anext__() for s in streams], return_exceptions=True)
    assert sum(isinstance(f, QueueFullError) for f in firsts) >= 1
    for s in streams:
        await s.aclose()
    await _wait_all_free(engine)
    engine.shutdown()
    with pytest.raises(EngineDeadError):
        await _collect(engine, "Hi", GREEDY, "after-shutdown")


async def test_async_crash_fails_streams_never_hangs(runner: ModelRunner) -> None:
    # A model that fails on every step: each batch's requests fail (never hang); after a
    # few such steps in a row the loop gives up, and everything later is EngineDeadError.
    engine = AsyncEngine(_config(), runner)
    calls = 0
    real_execute = runner.execute

    def failing_execute(chunks):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls > 3:
            raise RuntimeError("injected runner failure")
        return real_execute(chunks)

    engine.engine.runner = _Shim(runner, failing_execute)  # type: ignore[assignment]
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    results = await asyncio.wait_for(
        asyncio.gather(
            *[_collect(engine, f"Story {i}:", params, f"c{i}") for i in range(3)],
            return_exceptions=True,
        ),
        timeout=60,
    )
    assert all(isinstance(r, RequestFailedError) for r in results), results
    assert engine.is_running  # one failed step fails its requests, not the engine
    late = []
    for i in range(3):
        with pytest.raises((RequestFailedError, EngineDeadError)) as caught:
            await asyncio.wait_for(_collect(engine, "Hi", GREEDY, f"late{i}"), timeout=10)
        late.append(caught.type)
    assert late == [RequestFailedError, EngineDeadError, EngineDeadError]
    assert not engine.is_running


async def test_one_failing_request_leaves_the_others_running(runner: ModelRunner) -> None:
    # Regression: an exception raised by one request inside the step loop (top_k 2**63 did
    # it in the sampler) killed the loop and every request in flight with it.
    prompts = ["The capital of France is", "def add(a, b):"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = LLMEngine(_config(), runner).generate(prompts, params)
    engine = AsyncEngine(_config(), runner)
    real_execute = runner.execute

    def execute(chunks):  # type: ignore[no-untyped-def]
        if any(c.params.seed == 13 for c in chunks):
            raise RuntimeError("this request cannot be sampled")
        return real_execute(chunks)

    engine.engine.runner = _Shim(runner, execute)  # type: ignore[assignment]
    bad = SamplingParams(temperature=0, max_tokens=12, seed=13)
    results = await asyncio.wait_for(
        asyncio.gather(
            _collect(engine, prompts[0], params, "good0"),
            _collect(engine, "Tell me a story", bad, "bad"),
            _collect(engine, prompts[1], params, "good1"),
            return_exceptions=True,
        ),
        timeout=60,
    )
    assert isinstance(results[1], RequestFailedError)
    assert [results[0], results[2]] == expected
    assert engine.is_running
    await _wait_all_free(engine)
    engine.shutdown()


def test_huge_top_k_and_seed_do_not_break_the_engine(runner: ModelRunner) -> None:
    engine = LLMEngine(_config(), runner)
    params = SamplingParams(temperature=1.0, top_k=2**63, seed=2**63 - 1, max_tokens=4)
    engine.add_request("big", "Hello", params)
    outs = _run(engine)
    assert outs["big"][-1].finish_reason == "length" and outs["big"][-1].error is None


class _Shim:
    """The real runner with execute() replaced."""

    def __init__(self, runner: ModelRunner, execute) -> None:  # type: ignore[no-untyped-def]
        self._runner = runner
        self.execute = execute

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._runner, name)


async def test_shutdown_frees_the_weights_of_an_engine_that_built_them(
    runner: ModelRunner,
) -> None:
    """A stopped engine's model and KV pools go at once, even while something still holds the
    engine (a reference cycle, a retired slot); a runner passed in stays its owner's."""
    owned = AsyncEngine(_config())
    model = weakref.ref(owned.engine.runner.model)
    assert await _collect(owned, "Hello", GREEDY, "owned")
    owned.shutdown()
    assert owned.engine.runner.model is None and owned.engine.runner.kv_caches == []
    assert model() is None  # no collection needed: nothing else held it
    borrowed = AsyncEngine(_config(), runner)
    assert await _collect(borrowed, "Hello", GREEDY, "borrowed")
    borrowed.shutdown()
    assert runner.model is not None and runner.kv_caches
