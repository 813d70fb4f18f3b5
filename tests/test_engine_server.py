"""The engine's OpenAI-compatible server: real SmolLM2 engine, real uvicorn, real clients."""

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator

import httpx
import openai
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from tests.fake_runner import FakeRunner
from tests.servers import run_uvicorn, running_engine, wait_for, wait_idle

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported

NAME = "smollm2-135m"
USER = [{"role": "user", "content": "Name one colour."}]
# Small on purpose: 16 MiB of KV is a 352-token context, so "too long" is cheap to build;
# at most two running plus two waiting requests, so eight at once overflow the queue.
CONFIG = EngineConfig(
    model=NAME, kv_cache_bytes=16 * 1024 * 1024, max_num_seqs=2, max_waiting=2, num_threads=1
)


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    with running_engine(CONFIG) as engine:
        yield engine


@pytest.fixture(scope="module")
def base_url(engine: AsyncEngine) -> Iterator[str]:
    with run_uvicorn(create_engine_app(engine, NAME)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def async_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def test_models_and_health(client: openai.OpenAI, base_url: str) -> None:
    assert [m.id for m in client.models.list()] == [NAME]
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok"}


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    args = {"model": NAME, "messages": USER, "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(**args)
    assert whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage.prompt_tokens > 10
    assert 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    stream = client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == usage.completion_tokens
    # The same prompt again is served from the prefix cache.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_completions_sync(client: openai.OpenAI) -> None:
    out = client.completions.create(model=NAME, prompt="The sky is", max_tokens=4, temperature=0)
    assert out.id.startswith("cmpl-")
    assert out.choices[0].text
    assert out.usage.completion_tokens <= 4
    ids = client.completions.create(model=NAME, prompt=[504, 6123, 314], max_tokens=2)
    assert ids.usage.prompt_tokens == 3


async def test_async_clients_stream_and_not(async_client: openai.AsyncOpenAI) -> None:
    async def chat() -> str:
        out = await async_client.chat.completions.create(model=NAME, messages=USER, max_tokens=4)
        return out.choices[0].message.content or ""

    async def text_stream() -> tuple[str, int]:
        stream = await async_client.completions.create(
            model=NAME,
            prompt="Once upon a time",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, completion_tokens = [], 0
        async for chunk in stream:
            parts += [c.text for c in chunk.choices]
            if chunk.usage:
                completion_tokens = chunk.usage.completion_tokens
        return "".join(parts), completion_tokens

    answer, (story, tokens) = await asyncio.gather(chat(), text_stream())
    assert answer
    assert story
    assert 0 < tokens <= 4


def test_litellm_sdk(base_url: str) -> None:
    import litellm

    args = {
        "model": f"hosted_vllm/{NAME}",
        "api_base": f"{base_url}/v1",
        "messages": USER,
        "max_tokens": 4,
    }
    out = litellm.completion(**args)
    assert out.choices[0].message.content
    assert out.usage.completion_tokens <= 4
    chunks = list(litellm.completion(**args, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


def test_prompt_too_long_is_400(client: openai.OpenAI, engine: AsyncEngine) -> None:
    long = " ".join(["word"] * (engine.max_model_len + 10))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": long}], max_tokens=2
        )
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"


def test_max_tokens_beyond_the_context_is_400(client: openai.OpenAI, engine: AsyncEngine) -> None:
    """#29.12: refused up front as OpenAI and vLLM do (each of the n choices needs the room),
    on both endpoints, rather than silently capped."""
    calls = (
        lambda **kw: client.chat.completions.create(messages=USER, **kw),
        lambda **kw: client.completions.create(prompt="Name one colour.", **kw),
    )
    for call in calls:
        with pytest.raises(openai.BadRequestError) as info:
            call(model=NAME, max_tokens=2147483647, n=16)
        assert info.value.param == "max_tokens"
        assert info.value.code == "context_length_exceeded"
        context = f"This model's maximum context length is {engine.max_model_len} tokens."
        assert context in info.value.message
    # the room the prompt leaves is still served (here cut short by a stop)
    done = client.completions.create(
        model=NAME, prompt="Hi", max_tokens=engine.max_model_len - 1, stop=[" "], n=2
    )
    assert len(done.choices) == 2


def test_tools_the_template_drops_are_400(client: openai.OpenAI) -> None:
    """#29.7: SmolLM2's template drops `tools`; answering as if none were given is wrong."""
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=USER, tools=[tool], max_tokens=2)
    assert info.value.param == "tools"
    assert "cannot show it `tools`" in info.value.message


def test_schemas_past_the_size_caps_are_400s_in_our_words(client: openai.OpenAI) -> None:
    """#29.6: 2,000 forced functions made llguidance panic and the 400 carried the panic's
    text; a schema past the caps compiled for seconds. Both: our message naming the limit."""
    base: dict = {"model": NAME, "messages": USER, "max_tokens": 4}
    many = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
        for i in range(2000)
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(tools=many, tool_choice="required", **base)
    assert info.value.param == "tools" and "at most 128 functions" in info.value.message
    assert "panic" not in info.value.message
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1001)}}
    big = {"type": "json_schema", "json_schema": {"name": "big", "schema": wide}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(response_format=big, **base)  # type: ignore[arg-type]
    assert info.value.param == "response_format.json_schema.schema"
    assert "at most 1000 properties" in info.value.message


def test_bad_bodies_are_openai_400s(client: openai.OpenAI, base_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=USER, temperature=5)
    assert info.value.param == "temperature"
    assert "temperature" in info.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=USER, n=17)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=USER)
    assert missing.value.code == "model_not_found"

    garbage = httpx.post(
        f"{base_url}/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert garbage.status_code == 400
    assert garbage.json()["error"]["type"] == "invalid_request_error"
    no_prompt = httpx.post(f"{base_url}/v1/completions", json={"model": NAME})
    assert no_prompt.status_code == 400
    assert no_prompt.json()["error"]["message"] == "Missing required parameter: 'prompt'."
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model=NAME, prompt=[10**9], max_tokens=2)


async def test_queue_full_is_429_with_retry_after(base_url: str, engine: AsyncEngine) -> None:
    # Each admitted request decodes for a dozen steps; meanwhile at most four fit
    # (two running, two waiting), so of eight sent at once some must be refused.
    body = {"model": NAME, "prompt": "Count:", "max_tokens": 12, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        replies = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(8)))
    statuses = sorted(r.status_code for r in replies)
    assert statuses.count(200) >= 1
    assert 429 in statuses
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    wait_idle(engine)


def test_metrics_names(base_url: str) -> None:
    text = httpx.get(f"{base_url}/metrics").text
    for name in (
        "tiergate_engine_kv_cache_usage_perc",
        "tiergate_engine_prefix_cache_queries",
        "tiergate_engine_prefix_cache_hits",
        "tiergate_engine_num_requests_running",
        "tiergate_engine_time_to_first_token_seconds",
    ):
        assert name in text


def test_stream_disconnect_aborts(base_url: str, engine: AsyncEngine) -> None:
    wait_idle(engine)
    before = engine.metrics.snapshot().generated_tokens
    body = {"model": NAME, "messages": USER, "max_tokens": 300, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")
        assert engine.engine.has_unfinished()
    wait_idle(engine)
    assert engine.metrics.snapshot().generated_tokens - before < 300


def test_non_stream_disconnect_aborts(base_url: str, engine: AsyncEngine) -> None:
    wait_idle(engine)
    before = engine.metrics.snapshot().generated_tokens
    body = {"model": NAME, "prompt": "Hello", "max_tokens": 300, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/v1/completions", json=body, timeout=0.5)
    wait_idle(engine)
    assert engine.metrics.snapshot().generated_tokens - before < 300


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_before_the_first_token_aborts_its_queued_request(stream: bool) -> None:
    """Regression (#29.4): the server waited for the first output without watching the
    connection, so a request whose client left stayed queued until the engine reached it."""
    config = EngineConfig(model="fake", max_num_seqs=1)
    engine = AsyncEngine(config, FakeRunner(delay=0.05))
    long = {"model": "fake", "prompt": "abc", "max_tokens": 200, "ignore_eos": True}
    with (
        run_uvicorn(create_engine_app(engine, "fake")) as url,
        httpx.stream("POST", f"{url}/v1/completions", json={**long, "stream": True}) as busy,
    ):
        lines = busy.iter_lines()  # kept: a dropped iterator would close the stream
        assert next(lines).startswith("data: ")  # holds the only slot for ~10 s
        prefilled = engine.metrics.snapshot().prompt_tokens
        asyncio.run(_leave_while_queued(url, engine, {**long, "stream": stream}))
        wait_for(lambda: engine.metrics.snapshot().waiting == 0)
    wait_idle(engine)
    assert engine.metrics.snapshot().prompt_tokens == prefilled  # aborted, never admitted
    engine.shutdown()


async def _leave_while_queued(url: str, engine: AsyncEngine, body: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        post = asyncio.create_task(http.post("/v1/completions", json=body))
        await asyncio.to_thread(wait_for, lambda: engine.metrics.snapshot().waiting == 1)
        post.cancel()  # httpx closes the socket of a cancelled request
        with contextlib.suppress(asyncio.CancelledError):
            await post


@pytest.mark.parametrize("stream", [True, False])
def test_failing_model_fails_requests_then_the_engine_gives_up(stream: bool) -> None:
    # A stand-in model that fails on every step from its fourth. A stream has begun (200
    # sent), so its error travels in-band; a non-streamed answer becomes a 500. The engine
    # survives a failed step; after three in a row it gives up and answers 503.
    engine = AsyncEngine(EngineConfig(model="fake"), FakeRunner(fail_after=3))
    body = {"model": "fake", "prompt": "abc", "max_tokens": 10, "ignore_eos": True}
    with run_uvicorn(create_engine_app(engine, "fake")) as url:
        reply = httpx.post(f"{url}/v1/completions", json={**body, "stream": stream})
        if stream:
            events = [e.removeprefix("data: ") for e in reply.text.split("\n\n") if e]
            assert reply.status_code == 200
            assert len(events) == 4
            assert json.loads(events[-1])["error"]["code"] == "request_failed"
        else:
            assert reply.status_code == 500
            assert reply.json()["error"]["code"] == "request_failed"
        assert httpx.get(f"{url}/health").status_code == 200
        codes = [httpx.post(f"{url}/v1/completions", json=body).status_code for _ in range(2)]
        assert codes == [500, 503]
        assert httpx.get(f"{url}/health").status_code == 503
        dead = httpx.post(f"{url}/v1/completions", json=body)
        assert dead.status_code == 503
        assert dead.json()["error"]["code"] == "engine_dead"
    engine.shutdown()


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", 2**63), ("seed", 2**64), ("seed", -(2**63) - 1), ("stop", ["s"] * 5)],
)
def test_out_of_range_sampling_fields_are_refused_and_the_engine_lives(
    client: openai.OpenAI, base_url: str, field: str, value: object
) -> None:
    # Regression: top_k 2**63 passed validation and killed the step loop for everyone.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=NAME, messages=USER, max_tokens=2, extra_body={field: value}
        )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == field
    assert client.chat.completions.create(model=NAME, messages=USER, max_tokens=2).choices
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_prompt_far_beyond_the_context_is_refused_by_its_length(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=NAME, prompt="x" * 2_000_000, max_tokens=1)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "characters" in caught.value.body["message"]  # refused before tokenizing


def _streamed(client: openai.OpenAI, messages: list[dict], max_tokens: int, **extra: bool) -> list:
    """A greedy stream's chunks, each with its usage so far (vLLM's continuous_usage_stats)."""
    return list(
        client.chat.completions.create(
            model=NAME,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True, **extra},
        )
    )


def test_continue_final_message_goes_on_with_the_assistant_text(client: openai.OpenAI) -> None:
    """vLLM's continuation of a final assistant message: greedy, the text that was cut
    plus the continuation is the answer (what a gateway resuming a cut stream relies on)."""
    chunks = [c for c in _streamed(client, USER, 12) if c.choices and c.choices[0].delta.content]
    answer = "".join(c.choices[0].delta.content for c in chunks)
    so_far = [c.usage.completion_tokens for c in chunks]
    assert so_far == sorted(so_far) and so_far[-1] == 12
    head = "".join(c.choices[0].delta.content for c in chunks[:5])
    continuing = [*USER, {"role": "assistant", "content": head}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    rest = _streamed(client, continuing, 12 - so_far[4], **extra)
    text = "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert head + text == answer
    assert rest[-1].usage.completion_tokens == 12 - so_far[4]
    assert rest[-1].usage.prompt_tokens == chunks[0].usage.prompt_tokens + so_far[4]


def test_continue_final_message_needs_an_assistant_message_last(base_url: str) -> None:
    body = {"model": NAME, "messages": USER, "continue_final_message": True}
    body["add_generation_prompt"] = False
    refused = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "continue_final_message"
