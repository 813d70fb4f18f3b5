"""The whole scale-out path as separate processes on loopback: two `tiergate serve`
gateways sharing one real redis-server, in front of two `tiergate engine` processes (the
small model, one thread each), driven by the openai client.

A policy reload through one gateway's admin API is applied by the other process.
One engine is killed mid-run: its requests fail over and the tier keeps answering. One
gateway is killed: the other keeps serving, including a cache hit for an answer that was
stored through the one that died, and its /admin/stats stops counting it.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.processes import Engine, Gateway
from tests.servers import RedisServer, eventually, redis_server

KEY, ADMIN = "sk-fleet-proc", "sk-fleet-proc-admin"


def policy_text(redis_url: str, engines: list[Engine], aliases: str = "[]") -> str:
    deployments = ", ".join(
        f'{{model: hosted_vllm/smol, api_base: "{e.api_base()}"}}' for e in engines
    )
    return f"""
server: {{reload_interval_s: 0}}  # reloads only through the admin API (and so the fleet)
auth:
  keys: [{{key: {KEY}, tenant: acme}}]
  admin_key: {ADMIN}
cache: {{enabled: true, store: redis, redis_url: "{redis_url}", redis_prefix: fleet-proc}}
tiers:
  small:
    deployments: [{deployments}]
    balance: least_outstanding
    health_check_s: 0.5
    retries: 0
    cooldown_s: 600
    timeout_s: 300
routes:
  auto: {{default: small, aliases: {aliases}}}
"""


@dataclass
class Fleet:
    redis: RedisServer
    engines: list[Engine]
    gateways: list[Gateway]
    policy: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("fleet")
    with redis_server() as redis:
        engines = [Engine(logs / f"engine{i}.log") for i in range(2)]
        policy = logs / "policy.yaml"
        policy.write_text(policy_text(redis.url, engines))
        gateways = [Gateway(policy, f"gw{i}", logs / f"gateway{i}.log") for i in range(2)]
        processes = [*engines, *gateways]
        try:
            for process in processes:  # all four load at once
                process.launch()
            for process in processes:
                process.wait_ready()
            yield Fleet(redis, engines, gateways, policy)
        finally:
            for process in processes:
                process.kill()


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=300)


def ask(gateway: Gateway, question: str, max_tokens: int = 4) -> tuple[str, str]:
    """The answer's text and its x-tiergate-cache header."""
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    reply = raw.parse()
    assert reply.usage.completion_tokens == max_tokens
    return reply.choices[0].message.content, raw.headers["x-tiergate-cache"]


def admin(gateway: Gateway, method: str, path: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, f"{gateway.url}{path}", headers=headers, timeout=30)


def admin_stats(gateway: Gateway) -> dict:
    response = admin(gateway, "GET", "/admin/stats")
    assert response.status_code == 200, response.text
    return response.json()


def models(gateway: Gateway) -> set[str]:
    return {m.id for m in client(gateway).models.list()}


def test_an_engine_and_a_gateway_die_and_the_fleet_keeps_serving(fleet: Fleet) -> None:
    a, b = fleet.gateways
    first, second = fleet.engines
    stored, outcome = ask(a, "What colour is the sky on a clear day?")
    assert outcome == "miss"

    # A reload through one gateway's admin API reaches the other process.
    fleet.policy.write_text(policy_text(fleet.redis.url, fleet.engines, "[everyday]"))
    reloaded = admin(a, "POST", "/admin/policy/reload")
    assert reloaded.status_code == 200 and reloaded.json()["shared"] is True
    assert eventually(lambda: "everyday" in models(b), 10)

    # Kill an engine while requests through both gateways are in flight on both engines.
    served_before = first.requests_served()
    with ThreadPoolExecutor(6) as pool:
        futures = [
            pool.submit(ask, (a, b)[i % 2], f"Tell me a long story number {i}.", 32)
            for i in range(6)
        ]
        assert eventually(lambda: first.requests_served() > served_before, 120)
        first.kill()
        answers = [f.result(timeout=300) for f in futures]  # none fails: they fail over
    assert all(text and cache == "miss" for text, cache in answers)
    served = second.requests_served()
    assert ask(b, "Is the tier still answering?")[0]  # on the engine left
    assert second.requests_served() == served + 1

    # Both gateways counted into one fleet, failed attempts included; then one dies.
    assert eventually(lambda: admin_stats(b)["windows"]["all"]["requests"] == 8, 15)
    stats = admin_stats(b)
    assert stats["fleet"]["replicas"] == 2
    assert {r: v["windows"]["all"]["requests"] for r, v in stats["replicas"].items()} == {
        "gw0": 4,
        "gw1": 4,
    }
    everything = stats["windows"]["all"]
    assert everything["tiers"]["small"]["models"]["hosted_vllm/smol"]["failed_attempts"] >= 1
    a.kill()
    # The answer stored through the dead gateway is a hit through the live one.
    assert ask(b, "What colour is the sky on a clear day?") == (stored, "hit")
    assert ask(b, "And one more question for the engine left?")[1] == "miss"
    # The dead gateway's figures age out of the fleet's (it never said goodbye).
    assert eventually(lambda: admin_stats(b)["fleet"]["replicas"] == 1, 30)
    stats = admin_stats(b)
    assert list(stats["replicas"]) == ["gw1"] and stats["fleet"]["shared"] is True
