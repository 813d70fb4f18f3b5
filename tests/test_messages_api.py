"""POST /v1/messages (Anthropic's Messages API) on a local tier (the real Qwen2.5-Coder-0.5B),
through the real gateway over loopback with the anthropic client: the quick-start flows,
repeats answered from the cache, both ways of sending the key, Anthropic's error shape."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests import agent_flows as flows
from tests.servers import run_uvicorn

KEY, TIGHT = "sk-messages-a", "sk-messages-tight"
QWEN = "qwen2.5-coder-0.5b"
ASK: list[Any] = [{"role": "user", "content": "Name three colours."}]


def policy(cache_path: Path) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}, {{key: {TIGHT}, tenant: tight}}]
limits: {{tenants: {{tight: {{requests_per_minute: 1}}}}}}
cache: {{enabled: true, store: embedded, path: {cache_path}}}
engines:
  {QWEN}: {{kv_cache_mb: 64, max_num_seqs: 4, max_model_len: 2048, num_threads: 1}}
tiers:
  large: {{deployments: [{{model: {QWEN}}}]}}
routes:
  auto: {{default: large}}
"""


@pytest.fixture(scope="module")
def url(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("messages") / "cache.sqlite3"
    with run_uvicorn(create_app(parse_policy(policy(path), env={}))) as base:
        yield base


def client(url: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def test_plain_text_then_the_same_answer_from_the_cache(url: str) -> None:
    text = flows.messages_text(client(url), "auto")
    raw = client(url).messages.with_raw_response.create(
        model="auto", max_tokens=16, system="You answer briefly.", messages=ASK, **flows.GREEDY
    )
    assert raw.headers["x-tiergate-cache"] == "hit"
    assert raw.parse().content[0].text == text


def test_tool_use_round_trip(url: str) -> None:
    flows.messages_tool_round_trip(client(url), "auto")
    flows.messages_tool_round_trip(client(url), "auto")  # asked again: the same call


def test_forced_tool_as_structured_output(url: str) -> None:
    flows.messages_forced_tool(client(url), "auto")


def test_structured_output_with_output_format(url: str) -> None:
    parsed = client(url).messages.parse(
        model="auto",
        max_tokens=40,
        messages=[{"role": "user", "content": "Which city is the capital of France? As JSON."}],
        output_format=flows.City,
        **flows.GREEDY,
    )
    assert parsed.parsed_output is not None and parsed.parsed_output.name == "Paris"


def test_streamed_text_and_tool_use(url: str) -> None:
    flows.messages_streamed(client(url), "auto")


def test_any_tool_choice_with_parallel_calls_allowed_ends(url: str) -> None:
    message = client(url).messages.create(
        model="auto",
        max_tokens=80,
        tools=[flows.ANTHROPIC_WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": flows.ASK_WEATHER}],
        **flows.GREEDY,
    )
    assert message.stop_reason == "tool_use", message.content
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and uses[0].input == {"city": "Paris"}


def test_stop_sequences_and_tool_choice_none(url: str) -> None:
    message = client(url).messages.create(
        model="auto",
        max_tokens=30,
        messages=[{"role": "user", "content": "Count from 1 to 9 separated by spaces."}],
        stop_sequences=["5"],
        **flows.GREEDY,
    )
    assert "5" not in message.content[0].text and "4" in message.content[0].text
    plain = client(url).messages.create(
        model="auto",
        max_tokens=20,
        tools=[flows.ANTHROPIC_WEATHER],
        tool_choice={"type": "none"},
        messages=[{"role": "user", "content": flows.ASK_WEATHER}],
        **flows.GREEDY,
    )
    assert plain.stop_reason != "tool_use" and plain.content[0].type == "text"


def test_the_key_as_x_api_key_or_bearer(url: str) -> None:
    bearer = anthropic.Anthropic(base_url=url, auth_token=KEY, max_retries=0)
    assert bearer.messages.create(model="auto", max_tokens=2, messages=ASK).content
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        client(url, "sk-wrong").messages.create(model="auto", max_tokens=2, messages=ASK)
    assert wrong.value.body["error"]["type"] == "authentication_error"
    missing = httpx.post(f"{url}/v1/messages", json={"model": "auto"})
    assert missing.status_code == 401 and "x-api-key" in missing.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"messages": ASK}, 400, "invalid_request_error"),  # max_tokens is required
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            400,
            "invalid_request_error",
        ),
        ({"max_tokens": 4, "messages": ASK, "model": "no-such-model"}, 404, "not_found_error"),
        ({"max_tokens": 4, "messages": ASK, "temperature": 3}, 400, "invalid_request_error"),
        (
            {"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "tool"}},
            400,
            "invalid_request_error",
        ),
    ],
)
def test_errors_have_anthropics_shape(url: str, body: dict, status: int, kind: str) -> None:
    sent = {"model": "auto"} | body
    reply = httpx.post(f"{url}/v1/messages", json=sent, headers={"x-api-key": KEY})
    assert reply.status_code == status
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert error["error"]["message"]


def test_limits_apply_and_refuse_in_anthropics_shape(url: str) -> None:
    tight = client(url, TIGHT)
    assert tight.messages.create(model="auto", max_tokens=2, messages=ASK).content
    with pytest.raises(anthropic.RateLimitError) as limited:
        tight.messages.create(model="auto", max_tokens=2, messages=ASK)
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers.get("retry-after")
