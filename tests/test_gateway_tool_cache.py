"""The cache keeps an answer's structure (issue 23 (b)): a hit on a request with tools
answers the same message, tool_calls and finish_reason, whole and streamed, from a local
tier (calls stored as the model wrote them) and from remote tiers (stored structured);
tool results and the assistant's calls in the conversation are part of the scope."""

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.entrypoints.openai.protocol import ChatCompletionRequest
from gateway.api.cache_step import scope_of
from tests.servers import eventually
from tests.tool_tiers import ASK, NAMED, TIERS, WEATHER, tool_tiers

PARIS = ("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None
) -> Iterator[openai.OpenAI]:
    with tool_tiers(tmp_path_factory.mktemp("tool-cache")) as tiers:
        yield tiers


def calls_of(message: Any) -> list[tuple[str, dict]]:
    assert "<tool_call>" not in (message.content or "")
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("tier", TIERS)
def test_a_hit_on_a_tools_request_replays_the_tool_calls(client: openai.OpenAI, tier: str) -> None:
    request: dict[str, Any] = {
        "model": tier,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "temperature": 0,
        "max_tokens": 60,
    }
    first = client.chat.completions.create(**request)
    hit: list[Any] = []

    def answered_from_cache() -> bool:  # the store runs after the answer: until it landed
        raw = client.chat.completions.with_raw_response.create(**request)
        hit[:] = [raw.parse()]
        return raw.headers.get("x-tiergate-cache") == "hit"

    assert eventually(answered_from_cache, 30)
    (again,) = hit
    for reply in (first, again):
        assert reply.choices[0].finish_reason == "tool_calls"
        assert calls_of(reply.choices[0].message) == [PARIS]
    # an id names one answer's call: a replay gives its own
    assert again.choices[0].message.tool_calls[0].id != first.choices[0].message.tool_calls[0].id
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls" and calls_of(streamed.message) == [PARIS]


def _scope(*messages: dict[str, Any]) -> str:
    body = ChatCompletionRequest(model="auto", messages=[*messages, ASK[0]], tools=[WEATHER])
    return scope_of("t", body)


def test_tool_results_and_calls_in_the_conversation_are_part_of_the_scope() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    asked = {"role": "assistant", "content": None, "tool_calls": [call]}
    paris = {**call, "function": {**call["function"], "arguments": '{"city": "Paris"}'}}
    rome = {**call, "function": {**call["function"], "arguments": '{"city": "Rome"}'}}
    sunny = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    rain = {**sunny, "content": "rain"}
    scopes = {
        _scope(ASK[0], {**asked, "tool_calls": [paris]}, sunny),
        _scope(ASK[0], {**asked, "tool_calls": [paris]}, rain),
        _scope(ASK[0], {**asked, "tool_calls": [rome]}, sunny),
        _scope(),
    }
    assert len(scopes) == 4


def test_tool_call_ids_in_the_conversation_are_not_part_of_the_scope() -> None:
    """Every answer (a replay too) names its calls afresh: with the ids in the scope, a turn
    after a cached call could never be answered from the cache."""

    def turns(call_id: str) -> tuple[dict[str, Any], ...]:
        call = {"id": call_id, "type": "function", "function": {"name": "get_weather"}}
        call["function"]["arguments"] = '{"city": "Paris"}'
        asked = {"role": "assistant", "content": None, "tool_calls": [call]}
        said = {"role": "tool", "tool_call_id": call_id, "content": "sunny"}
        return ASK[0], asked, said, {"role": "assistant", "content": "Sunny."}

    assert _scope(*turns("call_1")) == _scope(*turns("call_9f2c"))
    # which result answers which call still counts
    first, asked, said, answer = turns("call_1")
    other = {**said, "tool_call_id": "call_2"}
    assert _scope(first, asked, other, answer) != _scope(*turns("call_1"))
