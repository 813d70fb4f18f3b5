"""engine/structured_output/compile_pool.py (issue 29, item 6) on an AsyncEngine with the
fake runner: compiles that hold their thread (a stand-in for seconds-long schemas, released
by the test) must not hold up other requests, and a request that leaves takes its queued
compile with it. Order, not timing: what finished while the compiles were still held."""

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.errors import EngineDeadError, InvalidParamError, QueueFullError
from engine.sampling_params import SamplingParams
from engine.structured_output.compile_pool import CompilePool
from engine.structured_output.constraints import JsonConstraint, SchemaSource
from tests.fake_runner import FakeRunner

LONG_PROMPT = "tokenized in a worker thread " * 100  # over the engine's inline bound


def constraint(i: int) -> JsonConstraint:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"}}}
    return JsonConstraint(SchemaSource(json.dumps(schema), "response_format"))


@pytest.fixture
def engine() -> Iterator[AsyncEngine]:
    config = EngineConfig(model="fake", max_num_seqs=64, max_waiting=256)
    engine = AsyncEngine(config, FakeRunner(num_pages=1024, max_model_len=4096))
    engine.start()
    yield engine
    engine.shutdown()


def hold(started: list[Any], release: threading.Event) -> Callable[[Any], Any]:
    """A compile that runs until the test releases it, then refuses the schema."""

    def compile_one(constraint: Any) -> Any:
        started.append(constraint)
        release.wait(60)
        raise InvalidParamError("response_format", "held")

    return compile_one


async def first(engine: AsyncEngine, prompt: str, params: SamplingParams, rid: str) -> Any:
    outputs = engine.generate(prompt, params, rid)
    try:
        return await anext(outputs)
    finally:
        await outputs.aclose()


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_held_compiles_do_not_hold_up_tokenizing(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many held compiles as asyncio's default pool has threads: a long prompt without a
    schema still gets tokenized and its first token while they are all held."""
    started: list[Any] = []
    release = threading.Event()
    monkeypatch.setattr(engine.engine.grammars, "_compile", hold(started, release))
    n = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default size
    held = [
        asyncio.create_task(
            first(engine, "hi", SamplingParams(max_tokens=2, constraint=constraint(i)), f"c{i}")
        )
        for i in range(n)
    ]
    await until(lambda: bool(started))
    try:
        plain = await asyncio.wait_for(
            first(engine, LONG_PROMPT, SamplingParams(max_tokens=1), "plain"), 60
        )
        answered_while_held = not release.is_set()
    finally:
        release.set()
        results = await asyncio.gather(*held, return_exceptions=True)
    assert answered_while_held and plain.finished
    assert all(isinstance(r, InvalidParamError | QueueFullError) for r in results)


async def test_a_request_that_leaves_takes_its_queued_compile_with_it(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    release = threading.Event()
    monkeypatch.setattr(engine.engine.grammars, "_compile", hold(started, release))
    params = [SamplingParams(max_tokens=2, constraint=constraint(i)) for i in range(3)]
    running = asyncio.create_task(first(engine, "hi", params[0], "c0"))
    await until(lambda: bool(started))
    leaving = asyncio.create_task(first(engine, "hi", params[1], "c1"))
    await asyncio.sleep(0.05)  # queued behind c0 (with no pool of its own: compiling)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)  # it has left before c0 ends
    release.set()
    with pytest.raises(InvalidParamError):
        await running
    with pytest.raises(InvalidParamError):  # queued after c1: c1's turn has passed by now
        await first(engine, "hi", params[2], "c2")
    assert started == [params[0].constraint, params[2].constraint]


async def test_a_compile_waits_at_most_its_timeout(engine: AsyncEngine) -> None:
    """The one compiling gets a 400 naming its schema; one queued behind it a 429."""
    started: list[Any] = []
    release = threading.Event()
    compiler = engine.engine.grammars
    compiler._compile = hold(started, release)  # type: ignore[method-assign]
    pool = CompilePool(compiler, timeout_s=0.3)
    try:
        results = await asyncio.gather(
            pool.state_for(constraint(0)), pool.state_for(constraint(1)), return_exceptions=True
        )
    finally:
        release.set()
        pool.shutdown()
    compiling, queued = results
    assert isinstance(compiling, InvalidParamError) and compiling.param == "response_format"
    assert "did not compile within 0.3 s" in str(compiling)
    assert isinstance(queued, QueueFullError)


async def test_a_constrained_request_after_shutdown_is_engine_dead(engine: AsyncEngine) -> None:
    engine.shutdown()
    with pytest.raises(EngineDeadError):
        await first(engine, "hi", SamplingParams(max_tokens=2, constraint=constraint(0)), "late")
