"""The openai SDK's structured-output helpers on chat completions:
`chat.completions.parse(response_format=PydanticModel)` (a strict json_schema with
`additionalProperties: false` and, for a nested model, `$defs`/`$ref`), the same through
`.stream(...)`, and a strict `pydantic_function_tool` forced by name, on the three paths of
tests/tool_tiers.py, each asked twice so that the repeat is answered from the cache."""

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.tool_tiers import TIERS, CacheSeen, asked_twice, tool_tiers

ASK: Any = [{"role": "user", "content": "Which city is the capital of France?"}]


class Country(BaseModel):
    name: str


class Capital(BaseModel):
    city: str
    country: Country  # nested: the SDK's schema carries it in $defs, by $ref


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Iterator[str]:
    with tool_tiers(tmp_path_factory.mktemp("openai-parse")) as client:
        yield str(client.base_url).rstrip("/")


def ask(tier: str) -> dict[str, Any]:
    return {"model": tier, "messages": ASK, "max_tokens": 40, "temperature": 0}


@pytest.mark.parametrize("tier", TIERS)
def test_parse_with_a_pydantic_response_format(url: str, tier: str) -> None:
    def parse(seen: CacheSeen) -> Capital:
        reply = seen.client(url).chat.completions.parse(response_format=Capital, **ask(tier))
        message = reply.choices[0].message
        assert message.parsed is not None and message.refusal is None
        assert message.parsed.city == "Paris"
        return message.parsed

    first, again = asked_twice(parse)
    assert again == first


@pytest.mark.parametrize("tier", TIERS)
def test_stream_with_a_pydantic_response_format(url: str, tier: str) -> None:
    def stream(seen: CacheSeen) -> Capital:
        chat = seen.client(url).chat.completions
        with chat.stream(response_format=Capital, **ask(tier)) as events:
            kinds = {event.type for event in events}
            final = events.get_final_completion()
        assert "content.delta" in kinds and "content.done" in kinds
        parsed = final.choices[0].message.parsed
        assert parsed is not None and parsed.city == "Paris"
        return parsed

    first, again = asked_twice(stream)
    assert again == first


@pytest.mark.parametrize("tier", TIERS)
def test_parse_with_a_strict_function_tool(url: str, tier: str) -> None:
    tool = openai.pydantic_function_tool(Capital, name="record_capital")
    named: Any = {"type": "function", "function": {"name": "record_capital"}}

    def parse(seen: CacheSeen) -> Capital:
        reply = seen.client(url).chat.completions.parse(
            tools=[tool], tool_choice=named, **{**ask(tier), "max_tokens": 60}
        )
        choice = reply.choices[0]
        (call,) = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls"
        parsed = call.function.parsed_arguments
        assert isinstance(parsed, Capital) and parsed.city == "Paris"
        return parsed

    first, again = asked_twice(parse)
    assert again == first
