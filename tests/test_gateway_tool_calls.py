"""Tool calls on every path (issue 23 (a), (c)): the real Qwen2.5 as a local tier and as a
real `tiergate engine` behind the direct client and litellm (tests/tool_tiers.py), called
with the official openai client, whole and streamed; and logprobs through the remotes."""

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.tool_tiers import ASK, NAMED, NO_CACHE, TIERS, WEATHER, tool_tiers

PARIS = ("get_weather", {"city": "Paris"})
TOOLS: dict[str, Any] = {"tools": [WEATHER], "temperature": 0, "extra_headers": NO_CACHE}


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None
) -> Iterator[openai.OpenAI]:
    with tool_tiers(tmp_path_factory.mktemp("tools")) as tiers:
        yield tiers


def calls_of(message: Any) -> list[tuple[str, dict]]:
    assert "<tool_call>" not in (message.content or "")  # no markup beside the calls
    calls = message.tool_calls or []
    assert all(c.type == "function" and c.id.startswith("call_") for c in calls)
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@pytest.mark.parametrize("tier", TIERS)
def test_a_named_call_with_parallel_calls_by_default_ends_as_one_tool_call(
    client: openai.OpenAI, tier: str
) -> None:
    """(a): the model went on calling (Paris, London...) until max_tokens, and the answer
    came back as `<tool_call>` text with finish_reason length; (c): remotes dropped calls."""
    reply = client.chat.completions.create(
        model=tier, messages=ASK, tool_choice=NAMED, max_tokens=60, **TOOLS
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == [PARIS] and not choice.message.content


@pytest.mark.parametrize("tier", TIERS)
def test_calls_cut_by_max_tokens_are_dropped_and_the_complete_ones_returned(
    client: openai.OpenAI, tier: str
) -> None:
    # `required` with parallel calls: Qwen 0.5B goes on to London; 30 tokens cut that call
    reply = client.chat.completions.create(
        model=tier, messages=ASK, tool_choice="required", max_tokens=30, **TOOLS
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == [PARIS] and not choice.message.content


@pytest.mark.parametrize("tier", TIERS)
def test_streamed_calls_come_as_openai_sends_them(client: openai.OpenAI, tier: str) -> None:
    deltas = []
    request = {"model": tier, "messages": ASK, "tool_choice": NAMED, "max_tokens": 60, **TOOLS}
    with client.chat.completions.stream(**request) as stream:
        for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                deltas += event.chunk.choices[0].delta.tool_calls or []
        final = stream.get_final_completion()
    # the call's id and name first, its arguments in the deltas after
    head, *rest = deltas
    assert head.index == 0 and head.id.startswith("call_") and head.function.name == PARIS[0]
    assert rest and all(d.id is None and d.function.name is None for d in rest)
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == PARIS[1]
    choice = final.choices[0]  # and the SDK's stream helper assembles them
    assert choice.finish_reason == "tool_calls" and calls_of(choice.message) == [PARIS]


@pytest.mark.parametrize("tier", ["direct", "litellm"])
def test_logprobs_pass_through_a_remote_tier(client: openai.OpenAI, tier: str) -> None:
    """(c): the remote clients read only the content, and never asked for logprobs."""
    ask = {"model": tier, "messages": ASK, "max_tokens": 5, "temperature": 0}
    reply = client.chat.completions.create(
        logprobs=True, top_logprobs=2, extra_headers=NO_CACHE, **ask
    )
    entries = reply.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    streamed = []
    for chunk in client.chat.completions.create(
        logprobs=True, top_logprobs=2, stream=True, extra_headers=NO_CACHE, **ask
    ):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in entries]
    text = client.completions.create(
        model=tier, prompt="The sky is", max_tokens=5, temperature=0, logprobs=1
    ).choices[0]
    assert text.logprobs is not None and "".join(text.logprobs.tokens) == text.text
