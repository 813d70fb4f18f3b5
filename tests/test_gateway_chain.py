"""Fallback-chain decisions with scripted backends and a fake clock (the live paths are in
test_gateway_fallback.py; here: backoff delays, cooldown expiry, what is never retried)."""

from collections.abc import AsyncIterator

import pytest

from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends
from gateway.policy import parse_policy

POLICY = """
tiers:
  a:
    deployments: [{model: hosted_vllm/a1, api_base: "http://a1"}, {model: hosted_vllm/a2, api_base: "http://a2"}]
    retries: 2
    backoff_s: 0.5
    cooldown_s: 30
    fallback: b
  b:
    deployments: [{model: hosted_vllm/b1, api_base: "http://b1"}]
    retries: 0
auth: {mode: none}
"""
REQUEST = GenerationRequest(
    "req-1",
    ChatCompletionRequest.model_validate(
        {"model": "a", "messages": [{"role": "user", "content": "x"}]}
    ),
    "tenant",
)


class Scripted:
    """Fails with the scripted errors in turn, then answers "ok"."""

    def __init__(self, name: str, errors: list[BackendError]) -> None:
        self.name, self.errors, self.calls = name, errors, 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        yield Piece("ok", "stop")


def down() -> BackendError:
    return BackendError(502, "down", retry=True, fallback=True)


class Clock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_chain(backends: dict[str, Scripted]) -> tuple[FallbackChain, Clock]:
    policy = parse_policy(POLICY, env={})
    clock = Clock()
    tiers = {
        name: TierBackends(name, tier, [(d, backends[d.model]) for d in tier.deployments])
        for name, tier in policy.tiers.items()
    }
    return FallbackChain(tiers, Cooldowns(lambda: clock.now), sleep=clock.sleep), clock


def backends(**errors: list[BackendError]) -> dict[str, Scripted]:
    names = ["hosted_vllm/a1", "hosted_vllm/a2", "hosted_vllm/b1"]
    return {n: Scripted(n, list(errors.get(n.split("/")[1], []))) for n in names}


async def test_retries_back_off_then_next_deployment() -> None:
    bs = backends(a1=[down(), down(), down()])
    chain, clock = make_chain(bs)
    served = await chain.open(REQUEST, "a")
    assert (served.tier, served.model) == ("a", "hosted_vllm/a2")
    assert clock.sleeps == [0.5, 1.0] and len(served.failures) == 3


async def test_cooldown_skips_then_expires() -> None:
    bs = backends(a1=[down(), down(), down()])
    chain, clock = make_chain(bs)
    await chain.open(REQUEST, "a")
    await chain.open(REQUEST, "a")
    assert bs["hosted_vllm/a1"].calls == 3  # cooling down: not tried the second time
    clock.now += 31
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a1"


async def test_overload_cools_down_only_as_long_as_asked() -> None:
    busy = BackendError(429, "busy", retry=False, fallback=True, retry_after=1)
    bs = backends(a1=[busy])
    chain, clock = make_chain(bs)
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a2"
    clock.now += 1.5
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a1"


async def test_everything_cooling_is_tried_anyway() -> None:
    bs = backends(a1=[down()] * 3, a2=[down()] * 3, b1=[down()])
    chain, _ = make_chain(bs)
    with pytest.raises(BackendError) as caught:
        await chain.open(REQUEST, "a")
    assert caught.value.status == 502
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a1"


async def test_request_errors_are_not_retried_or_passed_on() -> None:
    bad = BackendError(400, "prompt too long", retry=False, fallback=False)
    bs = backends(a1=[bad])
    chain, _ = make_chain(bs)
    with pytest.raises(BackendError) as caught:
        await chain.open(REQUEST, "a")
    assert caught.value is bad and bs["hosted_vllm/a2"].calls == 0


async def test_pinned_deployment_has_no_fallback() -> None:
    bs = backends(b1=[down()])
    chain, _ = make_chain(bs)
    with pytest.raises(BackendError):
        await chain.open(REQUEST, "b", deployment="hosted_vllm/b1")
    assert bs["hosted_vllm/a1"].calls == 0


async def test_status_when_all_fail() -> None:
    timeouts = [BackendError(504, "slow", retry=False, fallback=True) for _ in range(3)]
    bs = backends(a1=timeouts[:1], a2=timeouts[1:2], b1=timeouts[2:])
    chain, _ = make_chain(bs)
    with pytest.raises(BackendError) as caught:
        await chain.open(REQUEST, "a")
    assert caught.value.status == 504
    assert caught.value.message == "all deployments failed: slow; slow; slow"


def other_tenant(request: GenerationRequest, tenant: str) -> GenerationRequest:
    return GenerationRequest(request.request_id, request.body, tenant)


async def test_a_requests_own_failure_cools_the_deployment_for_its_tenant_only() -> None:
    bs = backends(a1=[down(), down(), down()])
    chain, _ = make_chain(bs)
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a2"
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a2"  # cooling for "tenant"
    assert (await chain.open(other_tenant(REQUEST, "other"), "a")).model == "hosted_vllm/a1"


async def test_a_deployment_fault_cools_it_for_everyone() -> None:
    refused = BackendError(502, "refused", retry=False, fallback=True, deployment_fault=True)
    bs = backends(a1=[refused])
    chain, _ = make_chain(bs)
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a2"
    assert (await chain.open(other_tenant(REQUEST, "other"), "a")).model == "hosted_vllm/a2"
    assert bs["hosted_vllm/a1"].calls == 1


async def test_an_empty_answer_is_a_failure_not_a_stop() -> None:
    class Empty(Scripted):
        async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
            self.calls += 1
            return
            yield Piece()

    bs = backends()
    bs["hosted_vllm/a1"] = Empty("hosted_vllm/a1", [])
    chain, _ = make_chain(bs)
    assert (await chain.open(REQUEST, "a")).model == "hosted_vllm/a2"
