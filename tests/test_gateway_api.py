"""The gateway over HTTP with the real small model: the openai client, errors, headers, abort."""

import asyncio
import os
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.policy import Policy, parse_policy
from gateway.routing.router import RoutingInput, Scored
from tests.servers import run_uvicorn, wait_idle

KEY, OTHER_KEY, ADMIN = "sk-test-key-1", "sk-test-key-2", "sk-test-admin"
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}, {{key: {OTHER_KEY}, tenant: two}}]
  admin_key: {ADMIN}
engines:
  smollm2-135m: {{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024}}
  one-at-a-time: {{model: smollm2-135m, kv_cache_mb: 16, max_num_seqs: 1, max_waiting: 1}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
  large: {{deployments: [{{model: smollm2-135m}}], fallback: small}}
  busy: {{deployments: [{{model: one-at-a-time}}], retries: 0}}
routes:
  auto:
    rules: [{{tier: large, contains_code: true}}, {{tier: large, min_score: 0.5}}]
    default: small
"""
HELLO = [{"role": "user", "content": "Say hello."}]


class KeywordScorer:
    """Stands in for the difficulty router: "prove" makes a prompt hard."""

    async def score(self, inp: RoutingInput, signals: object) -> Scored:
        return Scored(0.9 if "prove" in inp.features.last_user_text else 0.1)


async def keyword_scorer(policy: Policy) -> KeywordScorer:
    return KeywordScorer()


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(parse_policy(POLICY, env={}), scorer_factory=keyword_scorer)


@pytest.fixture(scope="module")
def url(app: FastAPI) -> Iterator[str]:
    with run_uvicorn(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture
def aclient(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def assert_tiergate_headers(headers: httpx.Headers, tier: str, model: str) -> None:
    assert headers["x-tiergate-tier"] == tier
    assert headers["x-tiergate-model"] == model
    assert headers["x-tiergate-cache"] == "off"
    assert headers["x-request-id"].startswith("req-")


def test_chat_sync(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HELLO, max_tokens=6, temperature=0
    )
    assert_tiergate_headers(raw.headers, "small", "smollm2-135m")
    answer = raw.parse()
    assert answer.id.startswith("chatcmpl-") and answer.created > 0
    assert answer.model == "smollm2-135m"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    usage = answer.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_stream_sync_with_usage(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="small",
        messages=HELLO,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert_tiergate_headers(response.headers, "small", "smollm2-135m")
        chunks = list(response.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 6
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="small", messages=HELLO, max_tokens=4, temperature=0, stream=True
        )
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_stream_matches_whole_answer(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model="small", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    parts = client.completions.create(
        model="small", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.usage.completion_tokens <= 8


async def test_async_chat_and_completion(aclient: openai.AsyncOpenAI) -> None:
    answer, text = await asyncio.gather(
        aclient.chat.completions.create(model="auto", messages=HELLO, max_tokens=5),
        aclient.completions.create(model="large", prompt="1, 2, 3,", max_tokens=5),
    )
    assert answer.choices[0].message.content and text.choices[0].text
    stream = await aclient.chat.completions.create(
        model="auto",
        messages=HELLO,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage.total_tokens > 0
    stream = await aclient.completions.create(
        model="small", prompt="Once upon a time", max_tokens=5, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream if c.choices])


def test_routing_by_name(client: openai.OpenAI) -> None:
    def tier_of(model: str, content: str = "hi") -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=2
        )
        return raw.headers["x-tiergate-tier"]

    assert tier_of("auto") == "small"
    assert tier_of("auto", "prove that there are infinitely many primes") == "large"  # scored
    assert tier_of("auto", "why does this fail?\n```python\nx = [1, 2\n```") == "large"
    assert tier_of("large") == "large"
    assert tier_of("smollm2-135m") == "small"  # a deployment's model: the first tier using it


def test_callers_request_id_is_kept(url: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "x-request-id": "my-trace-42"}
    response = httpx.get(f"{url}/v1/models", headers=headers)
    assert response.headers["x-request-id"] == "my-trace-42"


def test_models_list(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    names = ["auto", "small", "large", "busy", "smollm2-135m", "one-at-a-time"]
    assert ids == [*names, "all-MiniLM-L6-v2"]  # the embeddings model last


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_auth_errors(url: str, client: openai.OpenAI) -> None:
    body = {"model": "auto", "messages": HELLO}
    missing = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert missing.status_code == 401
    assert error_of(missing)["code"] == "missing_api_key"
    assert_tiergate_headers(missing.headers, "none", "none")
    wrong = httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-nope"}
    )
    assert wrong.status_code == 401 and error_of(wrong)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()
    second = openai.OpenAI(base_url=f"{url}/v1", api_key=OTHER_KEY, max_retries=0)
    assert second.models.list().data


def test_unknown_model_is_404(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-17", messages=HELLO)
    assert caught.value.code == "model_not_found"
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": "gpt-17", "prompt": "x"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 404
    assert error_of(response)["param"] == "model"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b'{"model": "auto"}', "messages"),
        (b'{"model": "auto", "messages": []}', "messages"),
        (
            b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "temperature": 5}',
            "temperature",
        ),
        (b"{not json", None),
        (b"[1, 2]", None),
    ],
)
def test_bad_body_is_400(url: str, content: bytes, param: str | None) -> None:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        content=content,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_prompt_too_long_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="small", prompt="word " * 3000, max_tokens=4)


def test_unknown_path_has_openai_error_shape(url: str) -> None:
    response = httpx.get(f"{url}/v1/nothing-here")
    assert response.status_code == 404 and error_of(response)["message"] == "Not Found"


def test_health_ready_metrics(url: str, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="small", messages=HELLO, max_tokens=2)
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/ready").json()
    assert ready["status"] == "ready"
    assert ready["engines"]["smollm2-135m"] == {"running": True, "restarts": 0}
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    assert 'tiergate_requests_total{model="smollm2-135m",route="-",status="200",tier="small"}' in (
        metrics
    )
    assert "tiergate_completion_tokens_total" in metrics
    assert metrics.count("# HELP tiergate_engine_num_requests_running ") == 1


def test_disconnect_aborts_the_engine_request(app: FastAPI, url: str) -> None:
    engine = app.state.gateway.engines.get("smollm2-135m")
    before = wait_idle(engine).generated_tokens
    body = {
        "model": "small",
        "messages": HELLO,
        "max_tokens": 600,  # most of the 704-token context (32 MiB of KV)
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        for _ in range(8):  # a few pieces arrive, then the client hangs up
            next(lines)
        assert engine.metrics.snapshot().running == 1
    after = wait_idle(engine)
    assert after.generated_tokens - before < 400  # stopped long before its 600 tokens


def test_disconnect_aborts_a_whole_answer_too(app: FastAPI, url: str) -> None:
    engine = app.state.gateway.engines.get("smollm2-135m")
    before = wait_idle(engine).generated_tokens
    body = {"model": "small", "messages": HELLO, "max_tokens": 600, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
        httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=1.0)
    after = wait_idle(engine)
    assert after.generated_tokens - before < 400


async def test_litellm_sdk_works_unchanged(url: str) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # here, not at the top: it takes seconds to import

    common = {"model": "openai/auto", "api_base": f"{url}/v1", "api_key": KEY, "max_tokens": 4}
    answer = await litellm.acompletion(messages=HELLO, **common)
    assert answer.choices[0].message.content and answer.usage.total_tokens > 0
    stream = await litellm.acompletion(messages=HELLO, stream=True, **common)
    assert "".join([c.choices[0].delta.content or "" async for c in stream])


def test_content_parts_and_system_message(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="small",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        ],
        max_tokens=4,
    )
    assert answer.choices[0].message.content


async def test_full_queue_is_429_with_retry_after(app: FastAPI, url: str) -> None:
    engine = app.state.gateway.engines.get("one-at-a-time")
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "busy", "messages": HELLO, "max_tokens": 300, "ignore_eos": True}

    async def until(running: int, waiting: int) -> None:
        for _ in range(600):  # the CPU may be shared: allow up to 30 s
            snap = engine.metrics.snapshot()
            if (snap.running, snap.waiting) == (running, waiting):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"engine never reached {running} running, {waiting} waiting")

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

        async def hold() -> None:  # occupies the engine's one running slot or waiting slot
            async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}):
                await asyncio.sleep(60)

        holders = [asyncio.create_task(hold())]
        try:
            await until(running=1, waiting=0)  # one at a time, or the second finds it full
            holders.append(asyncio.create_task(hold()))
            await until(running=1, waiting=1)
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 429
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["type"] == "rate_limit_error"
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)


def test_tenants_never_share_prefix_pages(app: FastAPI, url: str) -> None:
    engine = app.state.gateway.engines.get("smollm2-135m")
    system = "You are a careful assistant. " * 20  # several full KV pages
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}]

    def hits_after(key: str) -> int:
        before = engine.metrics.snapshot().prefix_cache_hits
        answer = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        answer.chat.completions.create(model="small", messages=messages, max_tokens=1)
        return engine.metrics.snapshot().prefix_cache_hits - before

    hits_after(KEY)  # tenant one fills the cache
    assert hits_after(OTHER_KEY) == 0  # tenant two cannot reuse it
    assert hits_after(KEY) > 100  # tenant one can


async def test_concurrent_requests_are_served_side_by_side(aclient: openai.AsyncOpenAI) -> None:
    # Served one at a time, every answer would end before the next one began: the most
    # answers under way at once would be 1.
    under_way, most = 0, 0

    async def one(i: int) -> str:
        nonlocal under_way, most
        stream = await aclient.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": f"Count to {i}."}],
            max_tokens=12,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        parts: list[str] = []
        async for chunk in stream:
            text = chunk.choices[0].delta.content if chunk.choices else None
            if text and not parts:
                under_way += 1
                most = max(most, under_way)
            parts += [text] if text else []
        under_way -= 1 if parts else 0
        return "".join(parts)

    answers = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(answers)
    assert most >= 2, "the gateway served the requests one at a time"
