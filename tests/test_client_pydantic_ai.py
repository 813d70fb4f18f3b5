"""pydantic-ai's quick-start flows (an `Agent` on `OpenAIChatModel` with an
`OpenAIProvider`): a plain run, a `tool_plain` tool round trip, `output_type=` a pydantic
model, and `run_stream`, on the three paths of tests/tool_tiers.py, each asked twice so that
the repeat is answered from the cache.

Qwen 0.5B choosing a tool under `auto` is not reliable, so the tool flow forces the tool on
the first step the way pydantic-ai documents (a capability's per-step `tool_choice`), and
turns tools off once the result is in; a
pydantic `output_type` is its output tool, which pydantic-ai forces itself (`required`)."""

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.tool_tiers import TIERS, CacheSeen, asked_twice, tool_tiers

WEATHER = '{"temp_c": 18, "sky": "sunny"}'


class Capital(BaseModel):
    city: str
    country: str


@dataclass
class ToolFirst(AbstractCapability[Any]):
    """`tool_choice` naming one tool until its result is in, then `none`: the agent then
    answers with text (Qwen 0.5B under `auto` may call the tool again, for other cities)."""

    name: str

    def get_model_settings(self) -> Callable[[RunContext[Any]], ModelSettings]:
        def settings(ctx: RunContext[Any]) -> ModelSettings:
            parts = [part for message in ctx.messages for part in message.parts]
            if any(isinstance(part, ToolReturnPart) for part in parts):
                return {"tool_choice": "none"}
            return {"tool_choice": [self.name]}

        return settings


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Iterator[str]:
    with tool_tiers(tmp_path_factory.mktemp("pydantic-ai")) as client:
        yield str(client.base_url).rstrip("/")


def agent(
    url: str, tier: str, seen: CacheSeen, max_tokens: int = 16, **more: Any
) -> Agent[None, Any]:
    provider = OpenAIProvider(openai_client=seen.async_client(url))
    # one call per step: a forced choice goes out as `required`, which allows parallel calls
    # (Qwen 0.5B adds London and Berlin to Paris)
    settings: ModelSettings = {
        "temperature": 0,
        "max_tokens": max_tokens,
        "parallel_tool_calls": False,
    }
    return Agent(OpenAIChatModel(tier, provider=provider), model_settings=settings, **more)


@pytest.mark.parametrize("tier", TIERS)
def test_a_plain_run(url: str, tier: str) -> None:
    def run(seen: CacheSeen) -> str:
        result = agent(url, tier, seen).run_sync("Name three colours.")
        assert isinstance(result.output, str) and result.output
        assert result.usage.output_tokens > 0
        return result.output

    first, again = asked_twice(run)
    assert again == first


@pytest.mark.parametrize("tier", TIERS)
def test_a_tool_plain_round_trip(url: str, tier: str) -> None:
    def run(seen: CacheSeen) -> tuple[list[str], str]:
        asked: list[str] = []
        weather = agent(url, tier, seen, max_tokens=60, capabilities=[ToolFirst("get_weather")])

        @weather.tool_plain
        def get_weather(city: str) -> str:
            """Get the current weather in a city."""
            asked.append(city)
            return WEATHER

        result = weather.run_sync("What is the weather in Paris right now?")
        assert asked == ["Paris"] and "18" in result.output
        return asked, result.output

    # the call is answered again from the cache; the turn after a tool result never is
    first, again = asked_twice(run, repeat=["hit", "bypass"])
    assert again == first


@pytest.mark.parametrize("tier", TIERS)
def test_output_type(url: str, tier: str) -> None:
    def run(seen: CacheSeen) -> Capital:
        capital = agent(url, tier, seen, max_tokens=40, output_type=Capital)
        result = capital.run_sync("Which city is the capital of France?")
        assert isinstance(result.output, Capital) and result.output.city == "Paris"
        return result.output

    first, again = asked_twice(run)
    assert again == first


@pytest.mark.parametrize("tier", TIERS)
def test_run_stream(url: str, tier: str) -> None:
    def run(seen: CacheSeen) -> str:
        async def streamed() -> tuple[list[str], str]:
            async with agent(url, tier, seen).run_stream("Name three colours.") as result:
                texts = [text async for text in result.stream_text()]
                return texts, await result.get_output()

        texts, output = asyncio.run(streamed())
        assert texts and texts[-1] == output and output
        return output

    first, again = asked_twice(run)
    assert again == first
