"""The end of the grace period: requests still waiting on an engine are aborted (pages
freed) and end with a 503 error; a real AsyncEngine on the fake runner."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.protocol import CompletionRequest
from gateway.backends.base import BackendError, GenerationRequest
from gateway.backends.local import EngineSlot, LocalBackend
from gateway.drain import Drain
from tests.fake_runner import FakeRunner


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    engine = AsyncEngine(EngineConfig(model="fake", max_num_seqs=1), FakeRunner(delay=0.01))
    engine.start()
    yield engine
    await asyncio.to_thread(engine.shutdown)


def generation(rid: str) -> GenerationRequest:
    return GenerationRequest(rid, CompletionRequest(model="fake", prompt="go", max_tokens=200), "t")


async def all_free(engine: AsyncEngine) -> None:
    async with asyncio.timeout(30):
        while (
            engine.engine.free_pages() != engine.engine.num_pages or engine.engine.has_unfinished()
        ):
            await asyncio.sleep(0.01)


async def test_expire_ends_a_running_answer_and_frees_its_pages(engine: AsyncEngine) -> None:
    drain = Drain()
    pieces = drain.pieces(
        LocalBackend("fake", EngineSlot("fake", engine.engine.config, engine)).generate(
            generation("r1")
        )
    )
    received = [await anext(pieces)]
    asyncio.get_running_loop().call_later(0.05, drain.expire)
    with pytest.raises(BackendError) as caught:
        async for piece in pieces:
            received.append(piece)
    assert caught.value.status == 503 and "shutting down" in caught.value.message
    assert len(received) < 200  # cut short, not run to the end
    await all_free(engine)


async def test_expire_refuses_a_request_still_in_line(engine: AsyncEngine) -> None:
    drain = Drain()
    backend = LocalBackend("fake", EngineSlot("fake", engine.engine.config, engine))
    running = drain.pieces(backend.generate(generation("first")))
    await anext(running)  # holds the engine's only slot
    queued = backend.generate(generation("second"))
    asyncio.get_running_loop().call_later(0.05, drain.expire)
    with pytest.raises(OpenAIError) as caught:
        await drain.opening(anext(queued))
    assert caught.value.status == 503 and caught.value.code == "shutting_down"
    await queued.aclose()
    with pytest.raises(BackendError):  # the running one ends too
        await anext(running)
    await all_free(engine)
    with pytest.raises(OpenAIError):  # and anything that starts later is refused at once
        await drain.opening(asyncio.sleep(10))
