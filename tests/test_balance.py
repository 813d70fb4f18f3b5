"""Balancing a tier's replicas: the balancer's decisions on fixed inputs, its bookkeeping
through the fallback chain, and health probes over real HTTP."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, Usage
from gateway.app import create_app
from gateway.backends.balance import BLOCK_CHARS, Balancer, prefixes_of
from gateway.backends.base import BackendError, GenerationRequest, Piece
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends, deployment_key
from gateway.backends.health import HealthChecker, health_url
from gateway.policy import Deployment, Tier, parse_policy
from tests.servers import run_uvicorn

KEYS = ["m@http://a/v1", "m@http://b/v1", "m@http://c/v1"]
SYSTEM = "You are a support agent for ACME. " * 60  # ~2,000 characters, 8 blocks


def chat(system: str, question: str, tenant: str = "t") -> GenerationRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = ChatCompletionRequest(model="auto", messages=messages)
    return GenerationRequest("r", body, tenant)


def loaded(balancer: Balancer, loads: list[int]) -> Balancer:
    for key, load in zip(KEYS, loads, strict=True):
        balancer.outstanding[key] = load
    return balancer


def test_ordered_keeps_the_policy_order_whatever_the_load() -> None:
    balancer = loaded(Balancer(), [9, 0, 3])
    assert balancer.order("t", "ordered", KEYS) == [0, 1, 2]


def test_round_robin_starts_one_further_each_time() -> None:
    balancer = loaded(Balancer(), [9, 0, 3])
    firsts = [balancer.order("t", "round_robin", KEYS)[0] for _ in range(6)]
    assert firsts == [0, 1, 2, 0, 1, 2]


def test_least_outstanding_then_by_load_and_ties_take_turns() -> None:
    balancer = loaded(Balancer(), [5, 1, 3])
    assert balancer.order("t", "least_outstanding", KEYS) == [1, 2, 0]
    loaded(balancer, [2, 2, 7])
    firsts = {balancer.order("t", "least_outstanding", KEYS)[0] for _ in range(4)}
    assert firsts == {0, 1}  # the tie alternates; the busy replica never goes first


def test_affinity_sends_a_prefix_back_to_the_replica_that_served_it() -> None:
    balancer = loaded(Balancer(), [0, 0, 0])
    first = chat(SYSTEM, "How do I reset my password?")
    balancer.served("t", prefixes_of(first), KEYS[2])
    loaded(balancer, [0, 1, 6])  # within the slack of 8 above the least loaded
    later = prefixes_of(chat(SYSTEM, "Where is my invoice?"))
    assert balancer.order("t", "prefix_affinity", KEYS, later, slack=8)[0] == 2
    # The rest follow by load: the fallbacks when the owner fails.
    assert balancer.order("t", "prefix_affinity", KEYS, later, slack=8) == [2, 0, 1]


def test_affinity_yields_to_load_beyond_the_slack() -> None:
    balancer = loaded(Balancer(), [0, 0, 0])
    balancer.served("t", prefixes_of(chat(SYSTEM, "q1")), KEYS[2])
    loaded(balancer, [3, 1, 10])  # 9 above the least loaded
    later = prefixes_of(chat(SYSTEM, "q2"))
    assert balancer.order("t", "prefix_affinity", KEYS, later, slack=8)[0] == 1


def test_the_longest_known_prefix_wins() -> None:
    balancer = Balancer()
    history = [SYSTEM, "x" * 2 * BLOCK_CHARS]  # a conversation that grew on replica b
    balancer.served("t", prefixes_of(chat(SYSTEM, "q")), KEYS[0])
    balancer.served("t", prefixes_of(chat(history[0] + history[1], "q")), KEYS[1])
    later = prefixes_of(chat(history[0] + history[1], "next turn"))
    assert balancer.order("t", "prefix_affinity", KEYS, later)[0] == 1


def test_a_short_shared_preamble_is_no_affinity() -> None:
    """A prefix covering under half of the prompt's head does not pin requests."""
    balancer = loaded(Balancer(), [0, 0, 0])
    preamble = "Be brief. " * 30  # 300 characters: one block
    balancer.served("t", prefixes_of(chat(preamble, "d" * 3000)), KEYS[2])
    loaded(balancer, [1, 0, 2])
    later = prefixes_of(chat(preamble, "e" * 3000))
    assert balancer.order("t", "prefix_affinity", KEYS, later)[0] == 1


def test_prefixes_are_per_tenant_and_per_tier() -> None:
    balancer = loaded(Balancer(), [0, 0, 0])
    balancer.served("t", prefixes_of(chat(SYSTEM, "q", tenant="acme")), KEYS[2])
    loaded(balancer, [1, 0, 2])
    other_tenant = prefixes_of(chat(SYSTEM, "q", tenant="globex"))
    assert balancer.order("t", "prefix_affinity", KEYS, other_tenant)[0] == 1
    same_tenant = prefixes_of(chat(SYSTEM, "q", tenant="acme"))
    assert balancer.order("other-tier", "prefix_affinity", KEYS, same_tenant)[0] == 1
    assert balancer.order("t", "prefix_affinity", KEYS, same_tenant)[0] == 2


def test_completions_hash_the_head_of_the_prompt() -> None:
    body = CompletionRequest(model="m", prompt=SYSTEM + "tail")
    a = prefixes_of(GenerationRequest("r", body, "t"))
    b = prefixes_of(chat(SYSTEM, "tail"))
    assert len(a.hashes) == len(SYSTEM + "tail") // BLOCK_CHARS
    assert a.hashes[0] != b.hashes[0]  # a chat's roles are part of its prefix


def test_a_replica_owned_by_a_removed_deployment_is_ignored() -> None:
    balancer = Balancer()
    balancer.served("t", prefixes_of(chat(SYSTEM, "q")), "gone@http://z/v1")
    loaded(balancer, [2, 0, 1])
    assert balancer.order("t", "prefix_affinity", KEYS, prefixes_of(chat(SYSTEM, "q")))[0] == 1


def test_health_marks() -> None:
    balancer = Balancer()
    assert balancer.mark(KEYS[0], False) and balancer.is_down(KEYS[0])
    assert not balancer.mark(KEYS[0], False)  # no change
    assert balancer.mark(KEYS[0], True) and not balancer.is_down(KEYS[0])


# ---------------------------------------------------------------- through the chain


class Replica:
    """A backend double that answers when released (the chain is what is tested here)."""

    def __init__(self, name: str, fail: bool = False, hold_first: bool = False) -> None:
        self.name, self.fail, self.calls, self.hold_first = name, fail, 0, hold_first
        self.questions: list[str] = []
        self.release = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece]:
        self.calls += 1
        self.questions.append(request.body.messages[-1].content)  # type: ignore[union-attr]
        if self.fail:
            raise BackendError(502, f"{self.name}: refused", True, True, deployment_fault=True)
        if self.hold_first:  # like a whole (non-streamed) answer: nothing until it is done
            await self.release.wait()
        yield Piece("hi")
        await self.release.wait()
        yield Piece("", "stop", Usage.of(1, 1))


def chain_of(mode: str, replicas: list[Replica]) -> tuple[FallbackChain, list[str]]:
    deps = [Deployment(model="hosted_vllm/m", api_base=f"http://{r.name}/v1") for r in replicas]
    tier = Tier(deployments=deps, balance=mode, retries=0)
    backends = TierBackends("small", tier, list(zip(deps, replicas, strict=True)))
    chain = FallbackChain({"small": backends}, Cooldowns())
    return chain, [deployment_key(d) for d in deps]


async def test_outstanding_counts_follow_answers_and_spread_the_load() -> None:
    replicas = [Replica("a"), Replica("b")]
    chain, keys = chain_of("least_outstanding", replicas)
    served = [await chain.open(chat("s", f"q{i}"), "small") for i in range(4)]
    assert [r.calls for r in replicas] == [2, 2]
    assert chain.balancer.outstanding == {keys[0]: 2, keys[1]: 2}
    for answer in served:
        for replica in replicas:
            replica.release.set()
        assert "".join([p.text async for p in answer.pieces]) == "hi"
        await answer.pieces.aclose()
        await answer.pieces.aclose()  # a second close counts nothing
    assert chain.balancer.outstanding == {keys[0]: 0, keys[1]: 0}


async def test_a_failed_replica_is_skipped_and_not_counted() -> None:
    replicas = [Replica("a", fail=True), Replica("b")]
    chain, keys = chain_of("round_robin", replicas)
    for i in range(3):
        served = await chain.open(chat("s", f"q{i}"), "small")
        await served.pieces.aclose()
    assert replicas[0].calls == 1  # then cooling down
    assert replicas[1].calls == 3
    assert chain.balancer.outstanding == {keys[0]: 0, keys[1]: 0}


async def test_a_replica_marked_down_is_skipped_until_it_is_back() -> None:
    replicas = [Replica("a"), Replica("b")]
    chain, keys = chain_of("round_robin", replicas)
    chain.balancer.mark(keys[0], False)
    for i in range(4):
        await (await chain.open(chat("s", f"q{i}"), "small")).pieces.aclose()
    assert [r.calls for r in replicas] == [0, 4]
    chain.balancer.mark(keys[0], True)
    for i in range(4):
        await (await chain.open(chat("s", f"q{i}"), "small")).pieces.aclose()
    assert replicas[0].calls == 2


async def test_when_every_replica_is_down_they_are_tried_anyway() -> None:
    replicas = [Replica("a"), Replica("b")]
    chain, keys = chain_of("ordered", replicas)
    for key in keys:
        chain.balancer.mark(key, False)
    served = await chain.open(chat("s", "q"), "small")
    await served.pieces.aclose()
    assert replicas[0].calls == 1


async def test_a_replica_down_by_its_probe_is_tried_when_the_ready_one_refuses() -> None:
    """A busy replica can miss a health probe while the other dies under a request: the
    request then goes to the one the probe held down rather than failing with a 502."""
    replicas = [Replica("dead", fail=True), Replica("busy")]
    chain, keys = chain_of("ordered", replicas)
    chain.balancer.mark(keys[1], False)
    served = await chain.open(chat("s", "q"), "small")
    await served.pieces.aclose()
    assert [r.calls for r in replicas] == [1, 1]


async def test_affinity_through_the_chain() -> None:
    replicas = [Replica("a"), Replica("b")]
    chain, _ = chain_of("prefix_affinity", replicas)
    systems = {"S": SYSTEM, "O": "Other rules. " * 100}
    for i, name in enumerate("OSSOOSSO"):  # taking turns alone would mix them up
        await (await chain.open(chat(systems[name], f"{name} q{i}"), "small")).pieces.aclose()
    # Nothing in flight: each prefix stays on the replica it met first.
    assert sorted({q[0] for q in r.questions} for r in replicas) == [{"O"}, {"S"}]


async def test_a_prefix_belongs_to_its_replica_from_dispatch() -> None:
    """A second request for a prefix still being prefilled queues behind the first one
    rather than prefilling it again elsewhere (a whole answer's first piece is its end)."""
    replicas = [Replica("a", hold_first=True), Replica("b", hold_first=True)]
    chain, _ = chain_of("prefix_affinity", replicas)
    first = asyncio.create_task(chain.open(chat(SYSTEM, "S q1"), "small"))
    while sum(r.calls for r in replicas) == 0:
        await asyncio.sleep(0)
    second = asyncio.create_task(chain.open(chat(SYSTEM, "S q2"), "small"))
    while sum(r.calls for r in replicas) == 1:
        await asyncio.sleep(0)
    assert sorted(r.calls for r in replicas) == [0, 2]
    for replica in replicas:
        replica.release.set()
    for task in (first, second):
        await (await task).pieces.aclose()
    assert set(chain.balancer.outstanding.values()) == {0}


# ---------------------------------------------------------------- health probes


def test_health_url() -> None:
    dep = Deployment(model="hosted_vllm/m", api_base="http://10.0.0.5:8100/v1/")
    assert health_url(dep) == "http://10.0.0.5:8100/health"
    assert health_url(Deployment(model="openai/gpt-4o", api_base="http://x/v1")) is None
    assert health_url(Deployment(model="smollm2-135m")) is None


async def test_probes_take_a_replica_out_and_bring_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = FastAPI()
    app.state.status = 200
    monkeypatch.setenv("PROBE_TEST_KEY", "sk-engine")

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != "Bearer sk-engine":  # a guarded /health
            return JSONResponse({}, status_code=401)
        return JSONResponse({}, status_code=app.state.status)

    with run_uvicorn(app) as url:
        dep = Deployment(model="hosted_vllm/m", api_base=url + "/v1", api_key_env="PROBE_TEST_KEY")
        key = deployment_key(dep)
        tier = Tier(deployments=[dep], health_check_s=0.01)
        tiers = {"small": TierBackends("small", tier, [(dep, Replica("a"))])}
        balancer, cooldowns = Balancer(), Cooldowns()
        async with httpx.AsyncClient() as http:
            checker = HealthChecker(balancer, cooldowns, http, lambda: tiers)
            await checker.check_once()
            assert not balancer.is_down(key)
            app.state.status = 503
            await asyncio.sleep(0.02)
            await checker.check_once()
            assert balancer.is_down(key)
            cooldowns.trip(key, 60)  # requests failed on it meanwhile
            cooldowns.trip(key, 60, tenant="acme")
            app.state.status = 200
            await asyncio.sleep(0.02)
            await checker.check_once()
            assert not balancer.is_down(key) and not cooldowns.cooling(key, "acme")
            app.state.status = 503
            await asyncio.sleep(0.02)
            await checker.check_once()
            assert balancer.is_down(key)
            tier.health_check_s = 0  # probing turned off by a reload: not held down
            await checker.check_once()
            assert not balancer.is_down(key)
    # Nothing listening at all: down.
    async with httpx.AsyncClient() as http:
        tier.health_check_s = 0.01
        checker = HealthChecker(balancer, cooldowns, http, lambda: tiers)
        await checker.check_once()
        assert balancer.is_down(key)


@pytest.mark.parametrize("bad", [{"balance": "random"}, {"affinity_slack": -1}])
def test_policy_refuses_bad_balance_settings(bad: dict) -> None:
    with pytest.raises(ValueError):
        Tier(deployments=[Deployment(model="m")], **bad)


def test_a_reload_keeps_the_replicas_load_and_prefixes(tmp_path: Path) -> None:
    """The runtime a reload builds shares the gateway's one balancer with the old one."""
    text = (
        "auth: {mode: none, admin_key: sk-adm}\nserver: {reload_interval_s: 0}\n"
        "tiers:\n  small:\n    balance: least_outstanding\n"
        "    deployments: [{model: hosted_vllm/m, api_base: 'http://a/v1'}]\n"
    )
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    app = create_app(parse_policy(text, env={}), policy_path=path)
    with TestClient(app) as client:
        state = app.state.gateway
        before = state.runtime
        path.write_text(text.replace("least_outstanding", "prefix_affinity"))
        reply = client.post("/admin/policy/reload", headers={"authorization": "Bearer sk-adm"})
        assert reply.status_code == 200 and state.runtime is not before
        assert before.chain.balancer is state.balancer is state.runtime.chain.balancer


def test_metrics_show_each_replica_up_and_its_load() -> None:
    text = (
        "auth: {mode: none, admin_key: sk-adm}\ntiers:\n  small:\n"
        "    deployments: [{model: hosted_vllm/m, api_base: 'http://a/v1'},"
        " {model: hosted_vllm/m, api_base: 'http://b/v1'}]\n"
    )
    app = create_app(parse_policy(text, env={}))
    with TestClient(app) as client:
        balancer = app.state.gateway.balancer
        balancer.mark("hosted_vllm/m@http://b/v1", False)
        balancer.started("hosted_vllm/m@http://a/v1")
        body = client.get("/metrics", headers={"authorization": "Bearer sk-adm"}).text
    samples = {
        (s.name, s.labels["deployment"]): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("tiergate_replica_")
    }
    assert samples == {
        ("tiergate_replica_up", "hosted_vllm/m@http://a/v1"): 1.0,
        ("tiergate_replica_up", "hosted_vllm/m@http://b/v1"): 0.0,
        ("tiergate_replica_outstanding", "hosted_vllm/m@http://a/v1"): 1.0,
        ("tiergate_replica_outstanding", "hosted_vllm/m@http://b/v1"): 0.0,
    }
