"""langchain-openai's quick-start flows (ChatOpenAI: invoke, stream, bind_tools with a
ToolMessage round trip, with_structured_output by each method) on the three paths of
tests/tool_tiers.py, each asked twice so that the repeat is answered from the cache.

Tools are forced (a named tool_choice; function_calling structured output names its tool):
Qwen 0.5B *choosing* a tool under `auto` is not reliable, while a forced call is decoded
under the tool's grammar."""

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.tool_tiers import KEY, TIERS, CacheSeen, asked_twice, tool_tiers

WEATHER = '{"temp_c": 18, "sky": "sunny"}'


class Capital(BaseModel):
    city: str
    country: str


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Iterator[str]:
    with tool_tiers(tmp_path_factory.mktemp("langchain")) as client:
        yield str(client.base_url).rstrip("/")


def chat(url: str, tier: str, seen: CacheSeen, max_tokens: int = 16) -> ChatOpenAI:
    return ChatOpenAI(
        model=tier,
        base_url=url,
        api_key=KEY,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=max_tokens,  # type: ignore[call-arg]
        max_retries=0,
        http_client=seen.http_client(),
    )


@pytest.mark.parametrize("tier", TIERS)
def test_invoke_and_stream(url: str, tier: str) -> None:
    def invoke(seen: CacheSeen) -> str:
        answer = chat(url, tier, seen).invoke("Name three colours.")
        assert isinstance(answer.content, str) and answer.content
        assert answer.usage_metadata and answer.usage_metadata["output_tokens"] > 0
        return answer.content

    def stream(seen: CacheSeen) -> str:
        chunks = list(chat(url, tier, seen).stream("Name three colours."))
        text = "".join(str(chunk.content) for chunk in chunks)
        assert text
        return text

    text, again = asked_twice(invoke)
    assert again == text
    streamed, again = asked_twice(stream)
    assert again == streamed == text


@pytest.mark.parametrize("tier", TIERS)
def test_bind_tools_and_a_tool_message_round_trip(url: str, tier: str) -> None:
    asked = HumanMessage("What is the weather in Paris right now?")

    def round_trip(seen: CacheSeen) -> tuple[dict[str, Any], str, str]:
        llm = chat(url, tier, seen, max_tokens=60)
        called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke([asked])
        (call,) = called.tool_calls
        assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
        assert "<tool_call>" not in str(called.content)
        result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
        answer = llm.bind_tools([get_weather]).invoke([asked, called, result])
        assert not answer.tool_calls and "18" in str(answer.content)
        thanks = [asked, called, result, answer, HumanMessage("Thanks! Is that warm?")]
        after = chat(url, tier, seen).invoke(thanks)
        assert after.content
        return call["args"], str(answer.content), str(after.content)

    # The call is answered again from the cache, and the next user turn too: its scope holds
    # the call, whose id every answer (a replay too) names afresh. The turn after a tool
    # result is never served from the cache.
    first, again = asked_twice(round_trip, repeat=["hit", "bypass", "hit"])
    assert again == first


@pytest.mark.parametrize("method", [None, "json_schema", "function_calling"])
@pytest.mark.parametrize("tier", TIERS)
def test_with_structured_output(url: str, tier: str, method: str | None) -> None:
    """The default method (json_schema in langchain-openai 1.x) and each named one."""
    by = {"method": method} if method else {}

    def structured(seen: CacheSeen) -> Capital:
        llm = chat(url, tier, seen, max_tokens=40).with_structured_output(Capital, **by)
        capital = llm.invoke("Which city is the capital of France?")
        assert isinstance(capital, Capital) and capital.city == "Paris"
        return capital

    first, again = asked_twice(structured)
    assert again == first
