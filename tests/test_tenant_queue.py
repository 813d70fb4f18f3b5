"""max_waiting_per_tenant: one tenant (cache salt) cannot take an engine's whole queue."""

import asyncio
from concurrent.futures import ThreadPoolExecutor, as_completed

import openai
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.errors import QueueFullError
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from gateway.app import create_app
from gateway.backends.base import BackendError, GenerationRequest
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends, deployment_key
from gateway.backends.local import EngineSlot, LocalBackend
from gateway.policy import parse_policy
from tests.fake_runner import FakeRunner
from tests.limits_helpers import KEY_A, KEY_A2, KEY_B, POLICY, client, complete, fake_engine
from tests.servers import run_uvicorn, wait_for

PARAMS = SamplingParams(temperature=0, max_tokens=2)


def _engine(**cfg: object) -> LLMEngine:
    config = EngineConfig(model="fake", **{"max_num_seqs": 1, **cfg})  # type: ignore[arg-type]
    return LLMEngine(config, FakeRunner())


def test_a_tenant_gets_its_share_and_others_still_get_in() -> None:
    engine = _engine(max_waiting=4, max_waiting_per_tenant=2)
    engine.add_request("a1", "x", PARAMS, cache_salt="a")
    engine.add_request("a2", "x", PARAMS, cache_salt="a")
    with pytest.raises(QueueFullError, match="max_waiting_per_tenant=2"):
        engine.add_request("a3", "x", PARAMS, cache_salt="a")
    engine.add_request("b1", "x", PARAMS, cache_salt="b")
    engine.add_request("b2", "x", PARAMS, cache_salt="b")
    with pytest.raises(QueueFullError, match="waiting queue is full"):  # the global bound
        engine.add_request("c1", "x", PARAMS, cache_salt="c")
    engine.step()  # a1 leaves the queue for the running batch: tenant a has room again
    engine.add_request("a3", "x", PARAMS, cache_salt="a")
    while engine.has_unfinished():
        engine.step()
    assert engine.free_pages() == engine.num_pages


def test_without_a_share_one_tenant_may_fill_the_queue() -> None:
    engine = _engine(max_waiting=3)
    for i in range(3):
        engine.add_request(f"a{i}", "x", PARAMS, cache_salt="a")
    with pytest.raises(QueueFullError):
        engine.add_request("b", "x", PARAMS, cache_salt="b")


def test_a_tenant_with_fewer_running_is_admitted_first() -> None:
    """Regression (#29.3): admission was first come, first served across tenants, so one
    tenant's queued flood sat ahead of another tenant's single request."""
    engine = _engine(max_num_seqs=2, max_waiting=16)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for i in range(6):
        engine.add_request(f"a{i}", "x", long, cache_salt="a")
    engine.step()  # a0 and a1 take both slots
    engine.add_request("b0", "x", PARAMS, cache_salt="b")
    engine.abort_request("a1")
    engine.step()  # a2 arrived before b0, but tenant b has nothing running
    assert [s.request_id for s in engine.scheduler.running] == ["a0", "b0"]
    engine.abort_request("a0")
    for i in range(1, 6):
        engine.abort_request(f"a{i}")
    while engine.has_unfinished():
        engine.step()
    assert engine.free_pages() == engine.num_pages


def test_within_a_tenant_the_queue_keeps_arrival_order() -> None:
    engine = _engine(max_num_seqs=2, max_waiting=16)
    for i in range(4):
        engine.add_request(f"a{i}", "x", PARAMS, cache_salt="a")
    engine.add_request("b0", "x", PARAMS, cache_salt="b")
    engine.add_request("b1", "x", PARAMS, cache_salt="b")
    admitted: list[str] = []
    while engine.has_unfinished():
        before = {s.request_id for s in engine.scheduler.running}
        engine.step()
        admitted += [s.request_id for s in engine.scheduler.running if s.request_id not in before]
    assert [r for r in admitted if r[0] == "a"] == ["a0", "a1", "a2", "a3"]
    assert admitted.index("b1") < admitted.index("a2")  # tenants alternate


def test_preemption_takes_from_the_tenant_with_the_most_running() -> None:
    """Regression (#29.3): the newest running request was preempted, which is the one
    another tenant just got in beside a flood: it would be the first to lose its pages."""
    config = EngineConfig(
        model="fake", max_num_seqs=4, max_waiting=16, kv_watermark=0, kv_reserve_tokens=0
    )  # no admission reserve: all four get in and the pool runs out under them
    engine = LLMEngine(config, FakeRunner(num_pages=12, page_size=4))
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"a{i}", f"a{i}", long, cache_salt="a")
    engine.step()
    engine.add_request("b0", "b0", long, cache_salt="b")  # the newest one running
    seqs = dict(engine._seqs)
    while engine.metrics.snapshot().preemptions == 0:
        engine.step()
    assert seqs["b0"].num_preemptions == 0
    assert sum(seqs[f"a{i}"].num_preemptions for i in range(3)) == 1
    while engine.has_unfinished():
        engine.step()
    assert engine.free_pages() == engine.num_pages


def test_through_the_gateway_the_tenant_is_the_share() -> None:
    """Tenant one floods a one-at-a-time engine; tenant two still gets a place in line."""
    text = POLICY.replace(
        "fake: {max_num_seqs: 8}",
        "fake: {max_num_seqs: 1, max_waiting: 4, max_waiting_per_tenant: 2}",
    )
    app = create_app(parse_policy(text, env={}), engine_factory=fake_engine(0.05))
    with run_uvicorn(app) as url, ThreadPoolExecutor(4) as pool:
        running = client(url, KEY_A).completions.create(
            model="small",
            prompt="go",
            max_tokens=250,
            stream=True,  # of the 256 context
        )
        try:
            next(iter(running))  # runs (the engine's only slot) for many seconds
            flood = [pool.submit(_status, url, key) for key in (KEY_A, KEY_A2, KEY_A)]
            refused = next(as_completed(flood, 30))  # two wait; the third is refused
            assert refused.result() == 429
            other = pool.submit(_status, url, KEY_B)
            waiting = app.state.gateway.engines.get("fake").metrics
            wait_for(lambda: waiting.snapshot().waiting == 3)  # tenant two got in line
        finally:
            running.close()  # the queue moves on
        assert sorted(f.result() for f in flood) == [200, 200, 429]
        assert other.result() == 200


def _status(url: str, key: str) -> int:
    try:
        complete(url, key, max_tokens=2)
    except openai.RateLimitError as exc:
        assert exc.response.json()["error"]["type"] == "rate_limit_error"
        assert "retry-after" in exc.response.headers
        return 429
    return 200


async def test_a_full_tenant_share_cools_nothing_down_for_other_tenants() -> None:
    config = EngineConfig(model="fake", max_num_seqs=1, max_waiting=4, max_waiting_per_tenant=1)
    engine = AsyncEngine(config, FakeRunner(delay=0.01))
    backend = LocalBackend("fake", EngineSlot("fake", config, engine))
    policy = parse_policy(POLICY, env={})
    deployment = policy.tiers["small"].deployments[0]
    tier = policy.tiers["small"].model_copy(update={"retries": 1})
    cooldowns = Cooldowns()
    tiers = {"small": TierBackends("small", tier, [(deployment, backend)])}
    chain = FallbackChain(tiers, cooldowns)
    running = backend.generate(_request("a1", "one"))
    try:
        await anext(running)  # the engine's only slot
        waiting = asyncio.create_task(anext(backend.generate(_request("a2", "one"))))
        async with asyncio.timeout(30):  # tenant one's share of the line is taken
            while engine.metrics.snapshot().waiting < 1:
                await asyncio.sleep(0.01)
        with pytest.raises(BackendError) as caught:
            await chain.open(_request("a3", "one"), "small")
        assert caught.value.status == 429 and caught.value.retry_after == 1
        assert not cooldowns.cooling(deployment_key(deployment))
        await running.aclose()  # the queue moves on; tenant two is served
        served = await chain.open(_request("b1", "two"), "small")
        await served.pieces.aclose()
        waiting.cancel()
    finally:
        await running.aclose()
        await asyncio.to_thread(engine.shutdown)


def _request(rid: str, tenant: str) -> GenerationRequest:
    body = CompletionRequest(model="small", prompt="go", max_tokens=100)
    return GenerationRequest(rid, body, tenant)
