"""/v1/responses and /v1/messages on remote tiers: a `tiergate engine` subprocess serving
the real Qwen2.5-Coder-0.5B over HTTP, reached by the direct client (tier `direct`) and
through litellm (tier `litellm`); the quick-start flows of openai and anthropic on each,
and repeats answered from the cache."""

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests import agent_flows as flows
from tests.processes import Engine
from tests.servers import run_uvicorn

KEY = "sk-remote-agents"
CLIENTS = ["direct", "litellm"]


def policy(api_base: str, cache_path: Path) -> str:
    deployment = f"model: hosted_vllm/qwen, api_base: '{api_base}'"
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
cache: {{enabled: true, store: embedded, path: {cache_path}}}
tiers:
  direct: {{deployments: [{{{deployment}, client: auto}}], timeout_s: 120}}
  litellm: {{deployments: [{{{deployment}, client: litellm}}], timeout_s: 120}}
routes:
  auto: {{default: direct}}
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("remote-agents")
    engine = Engine(logs / "engine.log", model="qwen2.5-coder-0.5b", served="qwen")
    engine.start()
    try:
        app = create_app(parse_policy(policy(engine.api_base(), logs / "cache.sqlite3"), env={}))
        with run_uvicorn(app) as base:
            yield base
    finally:
        engine.kill()


@pytest.fixture
def responses(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture
def messages(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)


@pytest.mark.parametrize("tier", CLIENTS)
def test_responses_text_and_its_repeat_from_the_cache(responses: openai.OpenAI, tier: str) -> None:
    text, cache = flows.responses_text(responses, tier)
    assert cache == "miss"
    again, cache = flows.responses_text(responses, tier)
    assert cache == "hit" and again == text


@pytest.mark.parametrize("tier", CLIENTS)
def test_responses_function_tool_round_trip(responses: openai.OpenAI, tier: str) -> None:
    arguments = flows.responses_tool_round_trip(responses, tier)
    assert flows.responses_tool_round_trip(responses, tier) == arguments


@pytest.mark.parametrize("tier", CLIENTS)
def test_responses_structured_output(responses: openai.OpenAI, tier: str) -> None:
    city, _ = flows.responses_structured(responses, tier)
    again, cache = flows.responses_structured(responses, tier)
    assert cache == "hit" and again == city


@pytest.mark.parametrize("tier", CLIENTS)
def test_responses_streamed_text(responses: openai.OpenAI, tier: str) -> None:
    flows.responses_streamed_text(responses, tier)


@pytest.mark.parametrize("tier", CLIENTS)
def test_responses_streamed_tool(responses: openai.OpenAI, tier: str) -> None:
    flows.responses_streamed_tool(responses, tier)


@pytest.mark.parametrize("tier", CLIENTS)
def test_messages_text_and_tool_round_trip(messages: anthropic.Anthropic, tier: str) -> None:
    flows.messages_text(messages, tier)
    flows.messages_tool_round_trip(messages, tier)


@pytest.mark.parametrize("tier", CLIENTS)
def test_messages_streamed_text(messages: anthropic.Anthropic, tier: str) -> None:
    flows.messages_streamed_text(messages, tier)


@pytest.mark.parametrize("tier", CLIENTS)
def test_messages_forced_tool_and_streamed_tool(messages: anthropic.Anthropic, tier: str) -> None:
    flows.messages_forced_tool(messages, tier)
    flows.messages_streamed_tool(messages, tier)


@pytest.mark.parametrize("tier", CLIENTS)
def test_openai_agents_structured_output_and_function_tool(url: str, tier: str) -> None:
    flows.agents_structured(f"{url}/v1", KEY, tier)
    flows.agents_tool(f"{url}/v1", KEY, tier)
