"""The chain skips deployments that could never answer a request (issue 29, items 5, 7, 12).

A local SmolLM2 engine with a 128-token context; its template drops `tools`. The remote
tiers are tests/upstream_stub.py over real HTTP: `stall` stands for a tier with a longer
context that times out, `echo` for one that takes tools. Real gateway, openai client.
"""

from collections.abc import Iterator

import openai
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn
from tests.upstream_stub import upstream_stub

SHORT = [{"role": "user", "content": "Say hello."}]
LONG = [{"role": "user", "content": "hello there " * 100}]  # ~200 tokens: over small's 128
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def policy_text(stub: str) -> str:
    return f"""
auth: {{mode: none}}
engines:
  smollm2-135m: {{kv_cache_mb: 16, max_num_seqs: 4, max_model_len: 128, num_threads: 1}}
tiers:
  small:
    deployments: [{{model: smollm2-135m}}]
  large:
    deployments: [{{model: hosted_vllm/stall, api_base: "{stub}"}}]
    timeout_s: 0.5
    retries: 0
    cooldown_s: 600
    fallback: small
  tooly:
    deployments: [{{model: smollm2-135m}}]
    fallback: remote
  remote:
    deployments: [{{model: hosted_vllm/echo, api_base: "{stub}"}}]
  remote_large:
    deployments: [{{model: hosted_vllm/stall, api_base: "{stub}"}}]
    timeout_s: 0.5
    retries: 0
    fallback: tiny_only
  tiny:
    deployments: [{{model: hosted_vllm/tinyctx, api_base: "{stub}"}}]
    fallback: remote
  tiny_only:
    deployments: [{{model: hosted_vllm/tinyctx, api_base: "{stub}", client: litellm}}]
  no_tools:
    deployments: [{{model: hosted_vllm/notools, api_base: "{stub}", tools: false}}]
"""


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[FastAPI, str]]:
    app = upstream_stub()
    with run_uvicorn(app) as base:
        yield app, f"{base}/v1"


@pytest.fixture(scope="module")
def client(stub: tuple[FastAPI, str]) -> Iterator[openai.OpenAI]:
    app = create_app(parse_policy(policy_text(stub[1]), env={}))
    with run_uvicorn(app) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def calls(stub: tuple[FastAPI, str], model: str) -> int:
    return sum(1 for body in stub[0].state.bodies if body["model"] == model)


def test_a_timeout_is_not_answered_by_a_tier_too_small(
    stub: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    """#29.5: `large` times out and `small` cannot hold the prompt: the caller gets the 504,
    not small's 400; again while `large` cools down (it is the only one that can hold it)."""
    for attempt in (1, 2):
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="large", messages=LONG, max_tokens=4)
        assert caught.value.status_code == 504
        assert "no answer within 0.5s" in caught.value.message
        assert calls(stub, "stall") == attempt
    # max_tokens counts too: the short prompt fits small's context, 1000 more tokens do not
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="large", messages=SHORT, max_tokens=1000)
    assert caught.value.status_code == 504
    # what small can hold still falls back to it
    raw = client.chat.completions.with_raw_response.create(
        model="large", messages=SHORT, max_tokens=2
    )
    assert raw.headers["x-tiergate-tier"] == "small"


def test_max_tokens_no_deployment_can_hold_is_400(client: openai.OpenAI) -> None:
    """#29.12: refused up front with the engine's words, per choice."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="small", messages=SHORT, max_tokens=2147483647, n=16)
    assert caught.value.param == "max_tokens"
    assert caught.value.code == "context_length_exceeded"
    assert "This model's maximum context length is 128 tokens." in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="small", prompt="Hello", max_tokens=128)
    assert caught.value.param == "max_tokens"


def test_tool_requests_skip_templates_that_drop_tools(
    stub: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    """#29.7: SmolLM2's template drops `tools`: its tier's fallback answers a tools request;
    with nothing else to try, a 400 says why. A remote marked `tools: false` is skipped."""
    raw = client.chat.completions.with_raw_response.create(
        model="tooly", messages=SHORT, tools=TOOLS, max_tokens=2
    )
    assert raw.headers["x-tiergate-tier"] == "remote"
    assert stub[0].state.bodies[-1]["tools"][0]["function"]["name"] == "get_time"
    for tier in ("small", "no_tools"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=tier, messages=SHORT, tools=TOOLS, max_tokens=2)
        assert caught.value.param == "tools"
        assert "tools" in caught.value.message
    assert calls(stub, "notools") == 0
    # without tools the same tiers answer
    raw = client.chat.completions.with_raw_response.create(
        model="tooly", messages=SHORT, max_tokens=2
    )
    assert raw.headers["x-tiergate-tier"] == "tooly"


def test_a_remote_context_too_small_passes_the_request_on(
    stub: tuple[FastAPI, str], client: openai.OpenAI
) -> None:
    """#29.5 for remotes, whose context the gateway cannot count: their own 400
    context_length_exceeded moves the request on as a skip would; after a timeout, the
    timeout is the answer; with nothing after it, the 400 (also through litellm)."""
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=SHORT, max_tokens=2
    )
    assert raw.headers["x-tiergate-tier"] == "remote"
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="remote_large", messages=SHORT, max_tokens=2)
    assert caught.value.status_code == 504
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny_only", messages=SHORT, max_tokens=2)
    assert refused.value.code == "context_length_exceeded"
