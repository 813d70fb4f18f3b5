"""Two real `tiergate engine` processes behind one gateway tier with prefix affinity.

Each system prompt stays on one replica; one replica killed mid-run: its requests fail
over and the tier keeps answering; the health probe takes it out, and brings it back once
it serves again on the same port.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.processes import Engine
from tests.servers import eventually, run_uvicorn

SYSTEMS = [
    "You answer questions about the Python standard library. " * 25,
    "You are a terse travel agent for trains in the Alps. " * 25,
]


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Engine]]:
    pair = [Engine(), Engine()]
    try:
        for engine in pair:  # both load the model at once
            engine.launch()
        for engine in pair:
            engine.wait_ready()
        yield pair
    finally:
        for engine in pair:
            engine.kill()


@pytest.fixture(scope="module")
def gateway(engines: list[Engine]) -> Iterator[tuple[FastAPI, openai.OpenAI]]:
    deployments = ", ".join(
        f'{{model: hosted_vllm/smol, api_base: "http://127.0.0.1:{e.port}/v1"}}' for e in engines
    )
    policy = f"""
auth: {{mode: none}}
tiers:
  replicas:
    deployments: [{deployments}]
    balance: prefix_affinity
    health_check_s: 0.5
    retries: 0
    cooldown_s: 600
    timeout_s: 300
"""
    app = create_app(parse_policy(policy, env={}))
    with run_uvicorn(app) as base:
        yield app, openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, system: str, question: str, max_tokens: int = 4) -> str:
    reply = client.chat.completions.create(
        model="replicas",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.completion_tokens == max_tokens
    return reply.choices[0].message.content


def test_each_prefix_stays_on_one_replica_and_a_dead_one_fails_over(
    engines: list[Engine], gateway: tuple[FastAPI, openai.OpenAI]
) -> None:
    app, client = gateway
    balancer = app.state.gateway.balancer
    for i, which in enumerate([0, 1, 1, 0, 0, 1]):  # taking turns would mix them up
        ask(client, SYSTEMS[which], f"Question number {i}?")
    assert [e.requests_served() for e in engines] == [3, 3]
    # Each engine kept one system prompt: its 2nd and 3rd request reused the 1st's pages
    # (~2/3 of the prompt tokens). Taking turns, each would have hit on one of three.
    assert all(e.prefix_hit_rate() > 0.5 for e in engines)
    before = [e.requests_served() for e in engines]

    # Kill replica 0 while requests for both prompts are in flight on both replicas.
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(ask, client, SYSTEMS[i % 2], f"Long answer {i}", 48) for i in range(8)
        ]
        assert eventually(lambda: engines[0].requests_served() > before[0], 120)
        engines[0].kill()
        answers = [f.result(timeout=600) for f in futures]  # none fails: they fail over
    assert all(answers)
    key0 = f"hosted_vllm/smol@http://127.0.0.1:{engines[0].port}/v1"
    assert eventually(lambda: balancer.is_down(key0), 60)
    for i in range(4):  # the tier keeps answering, on the replica left
        ask(client, SYSTEMS[i % 2], f"After the crash {i}?")

    # Back on the same port: the probe returns it to rotation (the cooldown alone would
    # keep it out for 10 minutes), and new prefixes reach it again.
    engines[0].start()
    assert eventually(lambda: not balancer.is_down(key0), 60)
    for i in range(4):
        ask(client, f"A brand new system prompt {i}. " * 40, "Hello?")
    assert engines[0].requests_served() >= 1
    assert set(balancer.outstanding.values()) == {0}
