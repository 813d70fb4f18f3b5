"""Fault drill: a local engine's step loop dies while requests run, seen from outside.

The gateway runs under real uvicorn and is called over loopback; its engines are real
AsyncEngines over tests/fake_runner.py. With two streams and a whole answer generating and
two more requests queued in the engine, its runner raises what no step can isolate (a
BaseException): the step thread dies. Requests already answering go on on the fallback
tier's engine (a resumed answer); without a fallback they get a clean error (an SSE error
event, a 503 body) that names no internals; queued ones are served by the tier's
fallback (on a tier without one they get a clean 503 too); the engine restarts in its
slot and the next request is its own again.
"""

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from gateway.app import create_app
from gateway.backends.local import LocalEngines
from gateway.policy import parse_policy
from tests.fake_runner import FakeRunner
from tests.servers import run_uvicorn, wait_for

POLICY = """
server: {reload_interval_s: 0}
auth: {mode: none, metrics_key: sk-drill-metrics}
engines:
  flaky: {kv_cache_mb: 1, max_num_seqs: 3}
  steady: {kv_cache_mb: 1}
  lonely: {kv_cache_mb: 1, max_num_seqs: 1}
tiers:
  small: {deployments: [{model: flaky}], fallback: large, retries: 0}
  large: {deployments: [{model: steady}]}
  solo: {deployments: [{model: lonely}], retries: 0}
"""
LONG = {"model": "small", "prompt": "tell", "max_tokens": 300, "ignore_eos": True}
INTERNALS = ("Crash", "process state", "Traceback", "step loop")


class Crash(BaseException):
    """A hard fault: not an Exception the step loop could pin on one request."""


class CrashingRunner(FakeRunner):
    crash = False

    def execute(self, chunks):  # type: ignore[no-untyped-def]
        if self.crash:
            raise Crash("the model process state is gone")
        return super().execute(chunks)


@dataclass
class Factory:
    runners: dict[str, list[CrashingRunner]] = field(default_factory=dict)

    def __call__(self, config: EngineConfig) -> AsyncEngine:
        runner = CrashingRunner(max_model_len=4096, num_pages=4200, delay=0.02)
        self.runners.setdefault(config.model, []).append(runner)
        return AsyncEngine(config, runner)


@pytest.fixture(scope="module")
def drill() -> Iterator[tuple[str, Factory, LocalEngines]]:
    factory = Factory()
    app = create_app(parse_policy(POLICY, env={}), engine_factory=factory)
    with run_uvicorn(app) as url:
        yield url, factory, app.state.gateway.engines


def _clean(message: str) -> None:
    assert message and not any(word in message for word in INTERNALS), message


async def _stream(
    http: httpx.AsyncClient, started: asyncio.Event, model: str = "small"
) -> list[dict]:
    """The stream's data events, from a client that reads them all."""
    events: list[dict] = []
    body = {**LONG, "model": model, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return events
            events.append(json.loads(line.removeprefix("data: ")))
            started.set()
    raise AssertionError("the stream ended without [DONE]")


def _running(engines: LocalEngines, name: str = "flaky") -> tuple[int, int]:
    snapshot = engines.get(name).metrics.snapshot()
    return snapshot.running, snapshot.waiting


async def _crash_under_load(url: str, factory: Factory, engines: LocalEngines) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        started = [asyncio.Event(), asyncio.Event()]
        streams = [asyncio.create_task(_stream(http, s)) for s in started]
        for s in started:
            await asyncio.wait_for(s.wait(), 60)
        whole = [asyncio.create_task(http.post("/v1/completions", json=LONG)) for _ in range(3)]
        async with asyncio.timeout(60):  # three generating, two queued behind them
            while _running(engines) != (3, 2):
                await asyncio.sleep(0.02)
        factory.runners["flaky"][-1].crash = True  # the step thread dies on its next step
        return {
            "streams": [await s for s in streams],
            "whole": [await w for w in whole],
        }


def test_a_dead_step_loop_s_answers_go_on_on_the_fallback_and_it_restarts(
    drill: tuple[str, Factory, LocalEngines],
) -> None:
    url, factory, engines = drill
    seen = asyncio.run(_crash_under_load(url, factory, engines))
    for events in seen["streams"]:  # cut mid-answer, continued by the fallback's engine
        assert "error" not in events[-1], events[-1]
        assert events[-1]["usage"]["completion_tokens"] == LONG["max_tokens"]  # both engines'
    replies: list[httpx.Response] = seen["whole"]
    assert [r.status_code for r in replies] == [200, 200, 200]
    # The one that was generating started on its tier (and went on on the fallback's
    # engine); the queued two fell back before they started.
    assert sorted(r.headers["x-tiergate-tier"] for r in replies) == ["large", "large", "small"]
    for r in replies:
        assert r.json()["usage"]["completion_tokens"] == LONG["max_tokens"]
    headers = {"Authorization": "Bearer sk-drill-metrics"}
    metrics = httpx.get(f"{url}/metrics", headers=headers).text
    resumed = 'tiergate_stream_resumes_total{outcome="resumed",served_tier="large",tier="small"}'
    assert f"{resumed} 3.0" in metrics
    # the supervisor restarts the engine in its slot; the tier's own engine serves again
    wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, 60)
    ready = httpx.get(f"{url}/ready").json()["engines"]["flaky"]
    assert ready == {"running": True, "restarts": 1}
    again = httpx.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 5}, timeout=60)
    assert again.status_code == 200 and again.headers["x-tiergate-tier"] == "small"
    assert len(factory.runners["flaky"]) == 2  # a new engine on a new runner


async def _crash_without_fallback(url: str, factory: Factory, engines: LocalEngines) -> tuple:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        started = asyncio.Event()
        stream = asyncio.create_task(_stream(http, started, "solo"))
        await asyncio.wait_for(started.wait(), 60)
        queued = asyncio.create_task(http.post("/v1/completions", json={**LONG, "model": "solo"}))
        async with asyncio.timeout(60):
            while _running(engines, "lonely") != (1, 1):
                await asyncio.sleep(0.02)
        factory.runners["lonely"][-1].crash = True
        return await stream, await queued


def test_without_a_fallback_every_request_in_the_dead_engine_gets_a_clean_503(
    drill: tuple[str, Factory, LocalEngines],
) -> None:
    url, factory, engines = drill
    events, queued = asyncio.run(_crash_without_fallback(url, factory, engines))
    _clean(events[-1]["error"]["message"])
    assert queued.status_code == 503  # never started: nothing else could take it
    error = queued.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    _clean(error["message"])
    wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, 60)
    again = httpx.post(f"{url}/v1/completions", json={**LONG, "model": "solo", "max_tokens": 5})
    assert again.status_code == 200 and again.headers["x-tiergate-tier"] == "solo"
