"""A client that leaves before the first token: the engine aborts the request it queued and
the tenant's concurrency slot comes back, over real HTTP to a real gateway and engine.

The engine (fake runner, one sequence at a time) is busy with another tenant's long stream,
so the request under test waits in the engine's queue when its client goes away.
"""

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.engine import AsyncEngine
from engine.metrics import EngineSnapshot
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.limits_helpers import KEY_A, KEY_B, POLICY, client, complete, fake_engine
from tests.servers import run_uvicorn, wait_for

LIMITS = "limits:\n  default: {max_concurrent: 1}\n"
BUSY = "fake: {max_num_seqs: 1}"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, AsyncEngine]]:
    text = POLICY.replace("fake: {max_num_seqs: 8}", BUSY) + LIMITS
    app = create_app(parse_policy(text, env={}), engine_factory=fake_engine(0.1))
    with run_uvicorn(app) as url:
        yield url, app.state.gateway.engines.get("fake")


async def _leave_while_queued(url: str, engine: AsyncEngine, stream: bool) -> None:
    body = {"model": "small", "prompt": "wait", "max_tokens": 4, "stream": stream}
    headers = {"Authorization": f"Bearer {KEY_A}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        post = asyncio.create_task(http.post("/v1/completions", json=body, headers=headers))
        await asyncio.to_thread(wait_for, lambda: _snapshot(engine).waiting == 1)
        post.cancel()  # httpx closes the socket of a cancelled request
        with contextlib.suppress(asyncio.CancelledError):
            await post


def _snapshot(engine: AsyncEngine) -> EngineSnapshot:
    return engine.metrics.snapshot()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_client_gone_before_the_first_token_is_aborted_and_frees_its_slot(
    served: tuple[str, AsyncEngine], stream: bool
) -> None:
    """Regression (#29.4): the handler waited for the first token without watching the
    connection, so the engine kept the request queued and the tenant's slot stayed taken
    until the engine got to it."""
    url, engine = served
    busy = client(url, KEY_B).completions.create(
        model="small", prompt="go", max_tokens=250, stream=True, extra_body={"ignore_eos": True}
    )
    with ThreadPoolExecutor(1) as pool:
        try:
            next(iter(busy))  # tenant two holds the engine's only running slot for ~25 s
            prefilled = _snapshot(engine).prompt_tokens
            asyncio.run(_leave_while_queued(url, engine, stream))
            wait_for(lambda: _snapshot(engine).waiting == 0)
            assert _snapshot(engine).running == 1  # tenant two's stream still runs
            assert _snapshot(engine).prompt_tokens == prefilled  # aborted, never admitted
            # Tenant one's slot is free again: its next request is admitted (a held slot
            # would answer 429 at once) and queues behind the stream.
            again = pool.submit(complete, url, KEY_A, "again", 2)
            wait_for(lambda: again.done() or _snapshot(engine).waiting == 1)
            assert not again.done(), again.exception()
        finally:
            busy.close()
        assert again.result() is not None  # served once the stream is gone
