"""The quick-start flows of the Responses API (openai, openai-agents) and Anthropic's Messages
API (anthropic), each asserted the way a user of that library would see it; the tests run
them against a gateway whose tier is a local engine or a remote one.

Every flow targets the Qwen tier (SmolLM2's template carries no tools) with greedy
decoding, so a repeat is answered from the cache where the cache serves it.
"""

import json
from typing import Any

import anthropic
import openai
from pydantic import BaseModel

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ANTHROPIC_WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": WEATHER_TOOL["parameters"],
}
ASK_WEATHER = "What is the weather in Paris right now?"
QUESTION = "Which city is the capital of France?"
WEATHER = '{"temp_c": 18, "sky": "sunny"}'
# anthropic 2.x has no temperature argument; the API takes one (as Anthropic's does)
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}


class City(BaseModel):
    name: str
    country: str


class Capital(BaseModel):
    city: str
    country: str


# ---- the Responses API, openai client


def responses_text(client: openai.OpenAI, model: str) -> tuple[str, str | None]:
    """A plain answer; returns its text and the x-tiergate-cache header."""
    raw = client.responses.with_raw_response.create(
        model=model, input="Name three colours.", max_output_tokens=16, temperature=0
    )
    response = raw.parse()
    assert response.object == "response" and response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.status in ("completed", "incomplete")
    return response.output_text, raw.headers.get("x-tiergate-cache")


def responses_tool_round_trip(client: openai.OpenAI, model: str) -> str:
    """A function call, its output sent back as items, the answer that uses it."""
    asked: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    first = client.responses.create(
        model=model, input=asked, tools=[WEATHER_TOOL], max_output_tokens=60, temperature=0
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1, first.output
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": WEATHER}
    turn = [*asked, *[item.model_dump(exclude_none=True) for item in calls], result]
    second = client.responses.create(
        model=model, input=turn, tools=[WEATHER_TOOL], max_output_tokens=40, temperature=0
    )
    assert not [item for item in second.output if item.type == "function_call"]
    assert "18" in second.output_text
    return calls[0].arguments


def responses_structured(client: openai.OpenAI, model: str) -> tuple[City, str | None]:
    raw = client.responses.with_raw_response.parse(
        model=model,
        input="Which city is the capital of France? Answer as JSON.",
        text_format=City,
        max_output_tokens=40,
        temperature=0,
    )
    city = raw.parse().output_parsed
    assert isinstance(city, City) and city.name == "Paris"
    return city, raw.headers.get("x-tiergate-cache")


def responses_forced_tool(client: openai.OpenAI, model: str) -> None:
    """A named tool_choice with parallel_tool_calls left at its default: one call that ends."""
    response = client.responses.create(
        model=model,
        input=ASK_WEATHER,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=80,
        temperature=0,
    )
    assert response.status == "completed", response.incomplete_details
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" for call in calls)
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert "<tool_call>" not in response.output_text


def responses_streamed_tool(client: openai.OpenAI, model: str) -> None:
    """The stream helper assembles a function call from the events."""
    asked: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    kinds = []
    with client.responses.stream(
        model=model, input=asked, tools=[WEATHER_TOOL], max_output_tokens=60, temperature=0
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris"}


def responses_streamed_text(client: openai.OpenAI, model: str) -> tuple[str, str]:
    """Text streamed; returns it and the response's id."""
    deltas = []
    with client.responses.stream(
        model=model, input="Name three colours.", max_output_tokens=16, temperature=0
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0
    return final.output_text, final.id


# ---- Anthropic's Messages API, anthropic client


def messages_text(client: anthropic.Anthropic, model: str) -> str:
    message = client.messages.create(
        model=model,
        max_tokens=16,
        system="You answer briefly.",
        messages=[{"role": "user", "content": "Name three colours."}],
        **GREEDY,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    return message.content[0].text


def messages_tool_round_trip(client: anthropic.Anthropic, model: str) -> None:
    asked: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    first = client.messages.create(
        model=model, max_tokens=60, tools=[ANTHROPIC_WEATHER], messages=asked, **GREEDY
    )
    assert first.stop_reason == "tool_use", first.content
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": WEATHER}
    turn = [
        *asked,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    second = client.messages.create(
        model=model, max_tokens=40, tools=[ANTHROPIC_WEATHER], messages=turn, **GREEDY
    )
    assert second.stop_reason != "tool_use"
    assert "18" in "".join(b.text for b in second.content if b.type == "text")


def messages_forced_tool(client: anthropic.Anthropic, model: str) -> None:
    """Structured output the Anthropic way: a forced tool, one call (no parallel calls)."""
    record = {
        "name": "record_city",
        "description": "Record a city and its country",
        "input_schema": Capital.model_json_schema(),
    }
    message = client.messages.create(
        model=model,
        max_tokens=60,
        tools=[record],
        tool_choice={"type": "tool", "name": "record_city", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        **GREEDY,
    )
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert Capital.model_validate(use.input).city == "Paris"


def messages_streamed(client: anthropic.Anthropic, model: str) -> None:
    """Text and a tool call streamed; the SDK's stream helper assembles both."""
    messages_streamed_text(client, model)
    messages_streamed_tool(client, model)


def messages_streamed_text(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(
        model=model,
        max_tokens=16,
        messages=[{"role": "user", "content": "Name three colours."}],
        **GREEDY,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens > 0


def messages_streamed_tool(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(
        model=model,
        max_tokens=60,
        tools=[ANTHROPIC_WEATHER],
        messages=[{"role": "user", "content": ASK_WEATHER}],
        **GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert final.stop_reason == "tool_use"
    (use,) = [block for block in final.content if block.type == "tool_use"]
    assert use.input == {"city": "Paris"}


# ---- openai-agents, its default model provider (the Responses API) pointed at the gateway


def agents_run(base_url: str, key: str, model: str, **agent: Any) -> Any:
    """Run an agent to its end on the default OpenAIProvider, greedy; returns the result."""
    import asyncio

    from agents import Agent, ModelSettings, RunConfig, Runner, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)  # no traces sent to OpenAI
    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(base_url=base_url, api_key=key))
    settings = ModelSettings(temperature=0, max_tokens=60)
    built = Agent(name="assistant", model=model, model_settings=settings, **agent)
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    return asyncio.run(
        Runner.run(built, ASK_WEATHER if agent.get("tools") else QUESTION, run_config=config)
    )


def agents_tool(base_url: str, key: str, model: str) -> str:
    """A function tool the agent calls, then answers with its result."""
    from agents import function_tool

    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return WEATHER

    result = agents_run(base_url, key, model, tools=[get_weather])
    assert seen == ["Paris"] and "18" in result.final_output
    return result.final_output


def agents_structured(base_url: str, key: str, model: str) -> City:
    result = agents_run(
        base_url, key, model, output_type=City, instructions="Name the capital of France."
    )
    assert isinstance(result.final_output, City) and result.final_output.name == "Paris"
    return result.final_output


def agents_streamed(base_url: str, key: str, model: str) -> str:
    import asyncio

    from agents import Agent, ModelSettings, RunConfig, Runner
    from agents.models.openai_provider import OpenAIProvider

    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(base_url=base_url, api_key=key))
    settings = ModelSettings(temperature=0, max_tokens=16)
    agent = Agent(name="assistant", model=model, model_settings=settings)
    config = RunConfig(model_provider=provider, tracing_disabled=True)

    async def run() -> tuple[str, list[str]]:
        streamed = Runner.run_streamed(agent, "Name three colours.", run_config=config)
        kinds = [event.type async for event in streamed.stream_events()]
        return streamed.final_output, kinds

    final, kinds = asyncio.run(run())
    assert final and "raw_response_event" in kinds
    return final
