"""Tool calls from the real Qwen2.5-Coder-0.5B through the engine's server and the openai
client's tool loop: whole and streamed, `tool_choice: none`, the tool's result next turn."""

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.config import EngineConfig
from engine.entrypoints.server import create_engine_app
from tests.servers import run_uvicorn, running_engine

NAME = "qwen2.5-coder-0.5b"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris right now?"}]
GREEDY: dict[str, Any] = {"model": NAME, "temperature": 0, "max_tokens": 60, "tools": TOOLS}


@pytest.fixture(scope="module")
def client(one_torch_thread: None) -> Iterator[openai.OpenAI]:
    config = EngineConfig(model=NAME, kv_cache_bytes=64 * 1024 * 1024, num_threads=1)
    with running_engine(config) as engine, run_uvicorn(create_engine_app(engine, NAME)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_whole_and_streamed_tool_calls_then_the_result_turn(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(messages=ASK, **GREEDY)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # streamed: the openai client's own stream helper assembles the tool-call deltas
    with client.beta.chat.completions.stream(messages=ASK, **GREEDY) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls]
    assert [(name, json.loads(args)) for name, args in got] == [("get_weather", {"city": "Paris"})]

    # the tool loop: the call and its result go back, the template renders them
    turn = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18, "sky": "sunny"}'},
    ]
    answer = client.chat.completions.create(messages=turn, **GREEDY)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.tool_calls is None
    assert "18" in answer.choices[0].message.content


def test_tool_choice_none_leaves_the_answer_as_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(messages=ASK, tool_choice="none", **GREEDY)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason != "tool_calls"
    assert choice.message.content
