"""One tenant's flood cannot starve another: the default per-tenant concurrency cap at the
gateway and the engine's admission across tenants, over real HTTP to a real gateway and
engine (fake runner, four sequences at a time) with no `limits` section in the policy."""

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from engine.engine import AsyncEngine
from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.policy.settings import DEFAULT_MAX_CONCURRENT
from tests.limits_helpers import KEY_A, KEY_B, POLICY, fake_engine
from tests.servers import run_uvicorn

FLOOD = DEFAULT_MAX_CONCURRENT + 8
LONG = {"model": "small", "prompt": "go", "max_tokens": 100, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, AsyncEngine]]:
    text = POLICY.replace("fake: {max_num_seqs: 8}", "fake: {max_num_seqs: 4}")
    app = create_app(parse_policy(text, env={}), engine_factory=fake_engine(0.05))
    with run_uvicorn(app) as url:
        yield url, app.state.gateway.engines.get("fake")


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _never_read(http: httpx.AsyncClient, statuses: list[int]) -> None:
    """A stream whose client reads the status line and then nothing more."""
    async with http.stream("POST", "/v1/completions", json=LONG, headers=_auth(KEY_A)) as r:
        statuses.append(r.status_code)
        if r.status_code == 200:
            await asyncio.Event().wait()  # until cancelled: the socket closes then


async def _flood_then_ask(url: str, engine: AsyncEngine) -> tuple[list[int], int, int]:
    limits = httpx.Limits(max_connections=FLOOD + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        statuses: list[int] = []
        flood = [asyncio.create_task(_never_read(http, statuses)) for _ in range(FLOOD)]
        async with asyncio.timeout(60):  # every flood request is answered (200 or 429) or queued
            while len(statuses) + engine.metrics.snapshot().waiting < FLOOD:
                await asyncio.sleep(0.05)
        body = {"model": "small", "prompt": "hi", "max_tokens": 5}
        other = await http.post("/v1/completions", json=body, headers=_auth(KEY_B))
        still_waiting = engine.metrics.snapshot().waiting  # the flood is still there
        for task in flood:
            task.cancel()
        for task in flood:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return statuses, other.status_code, still_waiting


def test_one_tenants_flood_does_not_starve_another(served: tuple[str, AsyncEngine]) -> None:
    """Regression (#29.3): with no limits set, one tenant's streams that never read took
    every engine slot and queued ahead of everyone; another tenant's 5-token request timed
    out behind them."""
    url, engine = served
    statuses, other, still_waiting = asyncio.run(_flood_then_ask(url, engine))
    assert other == 200
    assert still_waiting > 0  # served ahead of the flood's queued requests, not after them
    # the default cap: the rest of the flood is refused at once, not queued
    assert statuses.count(429) == FLOOD - DEFAULT_MAX_CONCURRENT
