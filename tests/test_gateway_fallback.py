"""Remote tiers through litellm, with our own engine server as the remote; fallbacks.

"Down" is an api_base on a free port with nothing listening; "times out" and "flaky" are
a tiny OpenAI-shaped stub, since a real engine cannot be told to stall or fail on cue.
"""

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import free_port, run_uvicorn, running_engine

SERVED = "smol"
HELLO = [{"role": "user", "content": "Say hello."}]


def stub_app() -> FastAPI:
    """Answers a fixed chat completion; `fail` answers 503 that many times, `delay_s` stalls."""
    app = FastAPI()
    app.state.fail, app.state.delay_s, app.state.calls = 0, 0.0, 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        app.state.calls += 1
        if app.state.fail > 0:
            app.state.fail -= 1
            error = {"message": "overloaded", "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=503)
        await asyncio.sleep(app.state.delay_s)
        body = await request.json()
        return JSONResponse(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "stub answer"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    return app


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    with running_engine(EngineConfig(model="smollm2-135m", kv_cache_bytes=32 << 20)) as engine:
        yield engine


@pytest.fixture(scope="module")
def remote(engine: AsyncEngine) -> Iterator[str]:
    with run_uvicorn(create_engine_app(engine, SERVED)) as base:
        yield f"{base}/v1"


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[FastAPI, str]]:
    app = stub_app()
    with run_uvicorn(app) as base:
        yield app, f"{base}/v1"


def policy_text(remote: str, stub: str, down: str) -> str:
    return f"""
tiers:
  remote:
    deployments: [{{model: hosted_vllm/{SERVED}, api_base: "{remote}"}}]
    price: {{input: 1.0, output: 2.0}}
  via_litellm:
    deployments: [{{model: hosted_vllm/{SERVED}, api_base: "{remote}", client: litellm}}]
  down:
    deployments: [{{model: hosted_vllm/gone, api_base: "{down}"}}]
    retries: 1
    backoff_s: 0.01
    cooldown_s: 60
    fallback: remote
  down_only:
    deployments: [{{model: hosted_vllm/gone2, api_base: "{down}"}}]
    retries: 0
  slow:
    deployments: [{{model: hosted_vllm/slow, api_base: "{stub}", timeout_s: 0.5}}]
    retries: 0
    fallback: remote
  slow_only:
    deployments: [{{model: hosted_vllm/slow2, api_base: "{stub}"}}]
    timeout_s: 0.5
    retries: 0
  litellm_down:
    deployments: [{{model: hosted_vllm/gone3, api_base: "{down}", client: litellm}}]
    retries: 0
    fallback: litellm_slow
  litellm_slow:
    deployments:
      - {{model: hosted_vllm/slow3, api_base: "{stub}", client: litellm, timeout_s: 0.5}}
    retries: 0
    fallback: via_litellm
  flaky:
    deployments: [{{model: hosted_vllm/flaky, api_base: "{stub}"}}]
    retries: 2
    backoff_s: 0.01
auth: {{mode: none}}
"""


@pytest.fixture(scope="module")
def gateway(remote: str, stub: tuple[FastAPI, str]) -> Iterator[tuple[FastAPI, str]]:
    down = f"http://127.0.0.1:{free_port()}/v1"
    app = create_app(parse_policy(policy_text(remote, stub[1], down), env={}))
    with run_uvicorn(app) as base:
        yield app, base


@pytest.fixture
def client(gateway: tuple[FastAPI, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway[1]}/v1", api_key="unused", max_retries=0)


def failures(app: FastAPI, model: str) -> float:
    counters = app.state.gateway.stats.snapshot().get("tiergate_deployment_failures", {})
    return sum(v for k, v in counters.items() if f"model={model}," in k)


REMOTE_TIERS = pytest.mark.parametrize("tier", ["remote", "via_litellm"])


@REMOTE_TIERS
def test_remote_engine_chat_and_completion(client: openai.OpenAI, tier: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=tier, messages=HELLO, max_tokens=6, temperature=0
    )
    assert raw.headers["x-tiergate-tier"] == tier
    assert raw.headers["x-tiergate-model"] == f"hosted_vllm/{SERVED}"
    answer = raw.parse()
    assert answer.choices[0].message.content
    assert answer.usage.prompt_tokens > 0 and 0 < answer.usage.completion_tokens <= 6
    text = client.completions.create(
        model=tier, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert text.choices[0].text and text.usage.completion_tokens <= 6


@REMOTE_TIERS
def test_remote_streams_piece_by_piece(client: openai.OpenAI, tier: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=tier,
            messages=HELLO,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    pieces = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 4  # passed through as they came, not one buffered blob
    assert chunks[-1].usage.completion_tokens == 8
    text = client.completions.create(
        model=tier, prompt="1, 2, 3,", max_tokens=5, temperature=0, stream=True
    )
    assert len([c for c in text if c.choices and c.choices[0].text]) >= 2


def test_backend_down_falls_back(gateway: tuple[FastAPI, str], client: openai.OpenAI) -> None:
    app, _ = gateway
    raw = client.chat.completions.with_raw_response.create(
        model="down", messages=HELLO, max_tokens=4
    )
    assert raw.headers["x-tiergate-tier"] == "remote"
    assert raw.parse().choices[0].message.content
    assert failures(app, "hosted_vllm/gone") == 2  # one attempt and one retry
    # Cooling down now: the next request skips it without trying.
    stream = client.chat.completions.create(model="down", messages=HELLO, max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert failures(app, "hosted_vllm/gone") == 2


def test_all_down_is_502(gateway: tuple[FastAPI, str]) -> None:
    response = httpx.post(
        f"{gateway[1]}/v1/chat/completions", json={"model": "down_only", "messages": HELLO}
    )
    assert response.status_code == 502
    assert response.json()["error"]["message"].startswith("all deployments failed: ")
    assert response.headers["x-tiergate-tier"] == "down_only"


def test_timeout_falls_back(
    stub: tuple[FastAPI, str], gateway: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    stub[0].state.delay_s = 5.0
    timed_out = failures(gateway[0], "hosted_vllm/slow")
    try:
        # Had the 0.5 s timeout not fired, the stub would have answered after 5 s from `slow`.
        raw = client.chat.completions.with_raw_response.create(
            model="slow", messages=HELLO, max_tokens=4
        )
        assert raw.headers["x-tiergate-tier"] == "remote"
        assert failures(gateway[0], "hosted_vllm/slow") == timed_out + 1
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="slow_only", messages=HELLO, max_tokens=4)
        assert caught.value.status_code == 504
    finally:
        stub[0].state.delay_s = 0.0


def test_litellm_down_and_timeout_fall_back(
    gateway: tuple[FastAPI, str], stub: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    stub[0].state.delay_s = 5.0
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="litellm_down", messages=HELLO, max_tokens=4
        )
        assert raw.headers["x-tiergate-tier"] == "via_litellm"
    finally:
        stub[0].state.delay_s = 0.0
    assert failures(gateway[0], "hosted_vllm/gone3") == 1
    assert failures(gateway[0], "hosted_vllm/slow3") == 1


def test_retries_recover_from_transient_errors(
    stub: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    stub[0].state.fail, calls = 2, stub[0].state.calls
    answer = client.chat.completions.create(model="flaky", messages=HELLO)
    assert answer.choices[0].message.content == "stub answer"
    assert stub[0].state.calls - calls == 3
    stub[0].state.fail = 5
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="flaky", messages=HELLO)
    assert caught.value.status_code == 503  # every attempt said 503: passed on as such
    stub[0].state.fail = 0


@REMOTE_TIERS
def test_disconnect_aborts_the_remote_request(
    engine: AsyncEngine, gateway: tuple[FastAPI, str], tier: str
) -> None:
    body = {
        "model": tier,
        "messages": HELLO,
        "max_tokens": 600,  # what the engine's 704-token context leaves after the prompt
        "ignore_eos": True,
        "stream": True,
    }
    before = engine.metrics.snapshot().generated_tokens
    with httpx.stream("POST", f"{gateway[1]}/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        for _ in range(8):
            next(lines)
    deadline = time.monotonic() + 10
    while engine.metrics.snapshot().running and time.monotonic() < deadline:
        time.sleep(0.05)
    after = engine.metrics.snapshot()
    assert after.running == 0 and after.kv_cache_usage_perc == 0
    assert after.generated_tokens - before < 400


def test_cost_from_tier_prices(gateway: tuple[FastAPI, str], client: openai.OpenAI) -> None:
    stats = gateway[0].state.gateway.stats
    before = (
        stats.snapshot().get("tiergate_cost_usd", {}).get("model=hosted_vllm/smol,tier=remote", 0)
    )
    usage = client.chat.completions.create(model="remote", messages=HELLO, max_tokens=3).usage
    after = stats.snapshot()["tiergate_cost_usd"]["model=hosted_vllm/smol,tier=remote"]
    expected = (usage.prompt_tokens * 1.0 + usage.completion_tokens * 2.0) / 1e6
    assert after - before == pytest.approx(expected)


@REMOTE_TIERS
def test_a_remote_engine_refuses_max_tokens_beyond_its_context(
    client: openai.OpenAI, tier: str
) -> None:
    """#29.12: the remote's own 400 comes back (not a fallback, not a silent cap); through
    litellm without its words (litellm keeps the upstream body from us)."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=tier, messages=HELLO, max_tokens=2147483647, n=2)
    if tier == "remote":
        assert "maximum context length" in caught.value.message
