"""Structured output on local tiers (issue 13 part 2, and part 1's forced tool calls):
`response_format` json_object / json_schema and `tool_choice` required / named, enforced
during decoding by llguidance inside the continuous batch.

Real SmolLM2 behind a real gateway (and behind the engine's own server for its 400s),
called over loopback with the openai client, whole and streamed; outputs are validated
with jsonschema. A remote tier (tests/upstream_stub.py) gets `response_format` as sent.
"""

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from fastapi import FastAPI

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn
from tests.upstream_stub import upstream_stub

KEY = "sk-structured-key"
MODEL = "smollm2-135m"
ENGINE = "{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024, num_threads: 1}"

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PERSON_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 30}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK_PERSON: Any = [{"role": "user", "content": "Invent a person. Answer in JSON."}]
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: dict[str, Any] = {"model": "small", "temperature": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[FastAPI, str]]:
    app = upstream_stub()
    with run_uvicorn(app) as base:
        yield app, f"{base}/v1"


@pytest.fixture(scope="module")
def gateway(one_torch_thread: None, stub: tuple[FastAPI, str]) -> Iterator[FastAPI]:
    policy = f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
engines:
  {MODEL}: {ENGINE}
tiers:
  small: {{deployments: [{{model: {MODEL}}}]}}
  remote: {{deployments: [{{model: hosted_vllm/echo, api_base: '{stub[1]}'}}], retries: 0}}
routes:
  auto: {{default: small}}
cache: {{enabled: false}}  # every answer comes from the engine, batched or alone
"""
    app = create_app(parse_policy(policy, env={}))
    with run_uvicorn(app) as url:
        app.state.url = url
        yield app


@pytest.fixture(scope="module")
def client(gateway: FastAPI) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.state.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def engine(one_torch_thread: None) -> Iterator[AsyncEngine]:
    config = EngineConfig(model=MODEL, kv_cache_bytes=16 * 1024 * 1024, num_threads=1)
    engine = AsyncEngine(config)
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def engine_client(engine: AsyncEngine) -> Iterator[openai.OpenAI]:
    with run_uvicorn(create_engine_app(engine, MODEL)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def streamed(client: openai.OpenAI, **request: Any) -> tuple[str, list[dict], str | None]:
    """A streamed answer's text, its tool calls assembled from the deltas, its finish."""
    text, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        reason = choice.finish_reason or reason
    return text, [calls[i] for i in sorted(calls)], reason


def calls_of(message: Any) -> list[dict]:
    return [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls or []
    ]


def check_calls(calls: list[dict], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


# ------------------------------------------------------------------------ response_format


def test_json_schema_strict_whole_and_streamed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        messages=ASK_PERSON, response_format=PERSON_FORMAT, **GREEDY
    )
    text = reply.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)
    assert reply.choices[0].finish_reason == "stop"  # ended at the grammar's end
    again, _, reason = streamed(
        client, messages=ASK_PERSON, response_format=PERSON_FORMAT, **GREEDY
    )
    assert (again, reason) == (text, "stop")


def test_json_object_whole_and_streamed(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_object"}
    ask: Any = [{"role": "user", "content": "Give the capital of France as JSON."}]
    reply = client.chat.completions.create(messages=ask, response_format=fmt, **GREEDY)
    text = reply.choices[0].message.content
    assert isinstance(json.loads(text), dict)
    again, _, _ = streamed(client, messages=ask, response_format=fmt, **GREEDY)
    assert again == text


def test_without_constraint_the_model_writes_prose(client: openai.OpenAI) -> None:
    """The constraint is what makes the JSON: the same prompt alone does not parse."""
    text = client.chat.completions.create(messages=ASK_PERSON, **GREEDY).choices[0].message
    with pytest.raises(ValueError):
        json.loads(text.content)


# ------------------------------------------------------------------------ tool_choice


def test_named_tool_choice_forces_that_function(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    request = {"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": named, **GREEDY}
    reply = client.chat.completions.create(parallel_tool_calls=False, **request)
    assert reply.choices[0].finish_reason == "tool_calls"
    calls = calls_of(reply.choices[0].message)
    assert len(calls) == 1
    check_calls(calls, {"get_time"})
    _, streamed_calls, reason = streamed(client, parallel_tool_calls=False, **request)
    assert (streamed_calls, reason) == (calls, "tool_calls")


def test_required_tool_choice_forces_a_declared_call(client: openai.OpenAI) -> None:
    request = {"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": "required", **GREEDY}
    reply = client.chat.completions.create(parallel_tool_calls=False, **request)
    calls = calls_of(reply.choices[0].message)
    assert len(calls) == 1 and reply.choices[0].finish_reason == "tool_calls"
    check_calls(calls, {"get_weather", "get_time"})
    _, streamed_calls, _ = streamed(client, parallel_tool_calls=False, **request)
    assert streamed_calls == calls  # several calls in a row: tests/test_grammar.py


def test_each_choice_of_n_has_its_own_matcher(engine_client: openai.OpenAI) -> None:
    reply = engine_client.chat.completions.create(
        model=MODEL,
        messages=ASK_PERSON,
        response_format=PERSON_FORMAT,
        n=3,
        temperature=1.0,
        seed=7,
        max_tokens=80,
    )
    texts = [choice.message.content or "" for choice in reply.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # sampled apart, each along its own grammar state


# ------------------------------------------------------------------------ the 400s

BAD_MINIMUM: Any = {
    "type": "json_schema",
    "json_schema": {"name": "p", "schema": {**PERSON, "properties": {"age": {"minimum": "x"}}}},
}
# valid JSON Schema, but a regex llguidance cannot enforce (a look-behind)
UNENFORCEABLE: Any = {
    "type": "json_schema",
    "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "(?<=a)b"}},
}


def bad_request(client: openai.OpenAI, **request: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**request)
    assert info.value.status_code == 400
    return info.value.body  # type: ignore[return-value]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("via", ["gateway", "engine"])
def test_invalid_schemas_are_400s_naming_the_place(
    client: openai.OpenAI, engine_client: openai.OpenAI, via: str, stream: bool
) -> None:
    api, model = (client, "small") if via == "gateway" else (engine_client, MODEL)
    base = {"model": model, "messages": ASK_PERSON, "max_tokens": 8, "stream": stream}
    body = bad_request(api, response_format=BAD_MINIMUM, **base)
    assert body["param"] == "response_format.json_schema.schema.properties.age.minimum"
    assert body["type"] == "invalid_request_error"
    body = bad_request(api, response_format=UNENFORCEABLE, **base)
    assert body["param"] == "response_format.json_schema.schema"
    bad_tool: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]
    body = bad_request(api, tools=bad_tool, tool_choice="required", **base)
    assert body["param"] == "tools[0].function.parameters.type"
    no_schema: Any = {"type": "json_schema"}
    assert bad_request(api, response_format=no_schema, **base)["param"] == "response_format"
    unknown: Any = {"type": "function", "function": {"name": "nope"}}
    assert bad_request(api, tools=TOOLS, tool_choice=unknown, **base)["param"] == "tool_choice"
    # the engine refused nothing else: a good request right after is served
    fine = api.chat.completions.create(
        response_format=PERSON_FORMAT, **{**base, "stream": False, "max_tokens": 80}
    )
    jsonschema.validate(json.loads(fine.choices[0].message.content or ""), PERSON)


# ------------------------------------------------------------------------ the batch


def test_mixed_batch_gives_each_request_its_answer_alone(
    client: openai.OpenAI, gateway: FastAPI
) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    requests: list[dict[str, Any]] = [
        {"messages": ASK_PERSON, "response_format": PERSON_FORMAT},
        {"messages": ASK_PERSON},
        {"messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": named},
        {"messages": ASK_WEATHER, "response_format": {"type": "json_object"}},
        {"messages": ASK_WEATHER, "stop": ["."]},  # (SmolLM2 is not offered tools: #29.7)
    ]

    def answer(request: dict[str, Any], start: threading.Barrier | None = None) -> Any:
        if start is not None:
            start.wait()
        message = client.chat.completions.create(**request, **GREEDY).choices[0].message
        return message.content, calls_of(message)

    alone = [answer(r) for r in requests]
    runner = gateway.state.gateway.engines.get(MODEL).engine.runner
    steps: list[tuple[int, int]] = []  # per step: rows sampled with a grammar, without
    execute = runner.execute

    def watched(chunks: list[Any]) -> Any:
        sampled = [c for c in chunks if c.sample]
        steps.append(
            (sum(c.grammar is not None for c in sampled), sum(c.grammar is None for c in sampled))
        )
        return execute(chunks)

    runner.execute = watched
    try:
        start = threading.Barrier(len(requests))
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: answer(r, start), requests))
    finally:
        del runner.execute
    assert any(constrained and plain for constrained, plain in steps)  # really one batch
    assert together == alone
    jsonschema.validate(json.loads(alone[0][0]), PERSON)
    check_calls(alone[2][1], {"get_weather"})


# ------------------------------------------------------------------------ off the loop


def test_grammars_compile_off_the_step_loop_once_per_schema(
    engine: AsyncEngine, engine_client: openai.OpenAI
) -> None:
    """On the compile pool's own thread (#29.6: not the pool that tokenizes prompts), and
    once: the second request takes the cached template without queueing."""
    compiler = engine.engine.grammars
    threads: list[str] = []
    compile_one = compiler._compile

    def watched_compile(constraint: Any) -> Any:
        threads.append(threading.current_thread().name)
        return compile_one(constraint)

    compiler._compile = watched_compile  # type: ignore[method-assign]
    try:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
        for _ in range(2):
            engine_client.chat.completions.create(
                model=MODEL, messages=ASK_PERSON, response_format=fmt, max_tokens=20
            )
    finally:
        del compiler._compile
    assert len(threads) == 1  # the second request reused the compiled schema
    assert threads[0].startswith("grammar-compile")


# ------------------------------------------------------------------------ remote tiers


def test_remote_tiers_get_response_format_as_sent(
    client: openai.OpenAI, stub: tuple[FastAPI, str]
) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    client.chat.completions.create(
        model="remote",
        messages=ASK_PERSON,
        response_format=PERSON_FORMAT,
        tools=TOOLS,
        tool_choice=named,
        max_tokens=5,
    )
    sent = stub[0].state.bodies[-1]
    assert sent["response_format"] == PERSON_FORMAT
    assert sent["tool_choice"] == named


# ------------------------------------------------------------------------ Qwen2.5


def test_qwen_writes_forced_calls_with_its_own_tag_tokens(one_torch_thread: None) -> None:
    name = "qwen2.5-coder-0.5b"
    engine = AsyncEngine(EngineConfig(model=name, kv_cache_bytes=64 << 20, num_threads=1))
    engine.start()
    try:
        with run_uvicorn(create_engine_app(engine, name)) as url:
            qwen = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            named: Any = {"type": "function", "function": {"name": "get_time"}}
            reply = qwen.chat.completions.create(
                model=name,
                messages=ASK_WEATHER,
                tools=TOOLS,
                tool_choice=named,
                parallel_tool_calls=False,
                temperature=0,
                max_tokens=60,
            )
    finally:
        engine.shutdown()
    assert reply.choices[0].finish_reason == "tool_calls"
    calls = calls_of(reply.choices[0].message)
    assert len(calls) == 1
    check_calls(calls, {"get_time"})
