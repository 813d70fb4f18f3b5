"""POST /v1/responses on a local tier (the real Qwen2.5-Coder-0.5B), through the real gateway
over loopback with the openai client and openai-agents' default (Responses) model: the
quick-start flows, repeats answered from the cache, stored responses (tenant-scoped),
errors, and the requests counted like chat's."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.policy import parse_policy
from tests import agent_flows as flows
from tests.servers import run_uvicorn

KEY, OTHER_KEY, ADMIN = "sk-responses-a", "sk-responses-b", "sk-responses-admin"
QWEN = "qwen2.5-coder-0.5b"


def policy(cache_path: Path) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}, {{key: {OTHER_KEY}, tenant: two}}]
  admin_key: {ADMIN}
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
    path = tmp_path_factory.mktemp("responses") / "cache.sqlite3"
    with run_uvicorn(create_app(parse_policy(policy(path), env={}))) as base:
        yield base


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_plain_text_then_the_same_answer_from_the_cache(url: str) -> None:
    text, cache = flows.responses_text(client(url), "auto")
    assert cache == "miss"
    again, cache = flows.responses_text(client(url), "auto")
    assert cache == "hit" and again == text


def test_function_tool_round_trip_and_its_repeat(url: str) -> None:
    arguments = flows.responses_tool_round_trip(client(url), "auto")
    # asked again (answered from the cache where it serves tool calls): the same call
    assert flows.responses_tool_round_trip(client(url), "auto") == arguments


def test_forced_function_call_ends(url: str) -> None:
    flows.responses_forced_tool(client(url), "auto")


def test_structured_output_then_from_the_cache(url: str) -> None:
    city, cache = flows.responses_structured(client(url), "auto")
    assert cache == "miss"
    again, cache = flows.responses_structured(client(url), "auto")
    assert cache == "hit" and again == city


def test_streamed_text_and_function_call(url: str) -> None:
    text, response_id = flows.responses_streamed_text(client(url), "auto")
    again, _ = flows.responses_streamed_text(client(url), "auto")
    assert again == text  # a hit streams too
    assert client(url).responses.retrieve(response_id).output_text == text  # stored once sent
    flows.responses_streamed_tool(client(url), "auto")


def test_previous_response_id_continues_only_for_its_own_tenant(url: str) -> None:
    one, two = client(url), client(url, OTHER_KEY)
    first = one.responses.create(
        model="auto", input="My name is Ada. Reply with OK.", max_output_tokens=8, temperature=0
    )
    assert one.responses.retrieve(first.id).output_text == first.output_text
    follow = one.responses.create(
        model="auto",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    )
    assert "Ada" in follow.output_text and follow.previous_response_id == first.id
    # another tenant knowing the id can neither read, continue nor delete it
    with pytest.raises(openai.NotFoundError):
        two.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        two.responses.create(model="auto", input="Hi", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        two.responses.delete(first.id)
    one.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(first.id)


def test_store_false_keeps_nothing(url: str) -> None:
    reply = client(url).responses.create(
        model="auto", input="Say yes.", store=False, max_output_tokens=4, temperature=0
    )
    with pytest.raises(openai.NotFoundError):
        client(url).responses.retrieve(reply.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]"),
        ({"input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"temperature": 5}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"conversation": "conv_123"}, "conversation"),  # its turns: not here to read
        ({"conversation": {"id": "conv_123"}}, "conversation"),
    ],
)
def test_what_chat_cannot_serve_is_a_400_naming_the_field(
    url: str, extra: dict, param: str
) -> None:
    body = {"model": "auto", "input": "Hi"} | extra
    reply = httpx.post(f"{url}/v1/responses", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith(param)


def test_auth_and_unknown_ids(url: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(url, "sk-wrong").responses.create(model="auto", input="Hi")
    with pytest.raises(openai.NotFoundError):
        client(url).responses.create(model="no-such-model", input="Hi")
    with pytest.raises(openai.NotFoundError) as missing:
        client(url).responses.create(model="auto", input="Hi", previous_response_id="resp_x")
    assert missing.value.body["param"] == "previous_response_id"


def _requests(url: str, status: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tiergate_requests_total"
        and s.labels["tier"] == "large"
        and s.labels["route"] == "auto"
        and s.labels["status"] == status
    )


def test_requests_are_counted_under_their_route_and_tier(url: str) -> None:
    before = _requests(url, "200")
    client(url).responses.create(model="auto", input="Count me.", max_output_tokens=4)
    assert _requests(url, "200") == before + 1


def test_openai_agents_flows_on_the_default_responses_model(url: str) -> None:
    base = f"{url}/v1"
    answer = flows.agents_tool(base, KEY, "auto")
    assert flows.agents_tool(base, KEY, "auto") == answer  # again, the cache where it serves
    city = flows.agents_structured(base, KEY, "auto")
    assert flows.agents_structured(base, KEY, "auto") == city
    text = flows.agents_streamed(base, KEY, "auto")
    assert flows.agents_streamed(base, KEY, "auto") == text
