"""`n > 1` through the live gateway with the openai client: served by the local engine as
sibling requests (real SmolLM2), passed through to remote tiers (tests/upstream_stub.py over
real HTTP, native client and litellm), never served from or stored in the cache."""

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from engine.config import EngineConfig
from engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.app import create_app
from gateway.backends.base import GenerationRequest
from gateway.backends.forward import sampling_fields
from gateway.policy import parse_policy
from tests.servers import run_uvicorn
from tests.test_gateway_api import wait_idle
from tests.upstream_stub import upstream_stub

KEY = "sk-choices-key"
MODEL = "smollm2-135m"
USER = [{"role": "user", "content": "Name three colours."}]
GREEDY: dict[str, Any] = {"model": "auto", "temperature": 0, "max_tokens": 8}
PAGE_SIZE = EngineConfig(model=MODEL).page_size  # the policy leaves the default


def _policy(stub: str, cache_path: Path) -> str:
    def remote(client: str) -> str:
        deployment = f"{{model: hosted_vllm/echo, api_base: '{stub}', client: {client}}}"
        return f"{{deployments: [{deployment}], retries: 0}}"

    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
cache: {{enabled: true, store: embedded, path: {cache_path}}}
engines:
  {MODEL}: {{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: {MODEL}}}]}}
  direct: {remote("auto")}
  via_litellm: {remote("litellm")}
  cut: {remote("auto").replace("echo", "cutchoice")}
routes:
  auto: {{default: small}}
"""


@pytest.fixture(scope="module")
def stub() -> Iterator[FastAPI]:
    app = upstream_stub()
    with run_uvicorn(app) as base:
        app.state.base = f"{base}/v1"
        yield app


@pytest.fixture(scope="module")
def app(stub: FastAPI, one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    cache = tmp_path_factory.mktemp("cache") / "cache.sqlite3"
    return create_app(parse_policy(_policy(stub.state.base, cache), env={}))


@pytest.fixture(scope="module")
def url(app: FastAPI) -> Iterator[str]:
    with run_uvicorn(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def _streamed(chunks: Any) -> tuple[dict[int, str], dict[int, str], list[Any]]:
    """Texts and finish reasons per choice index, and the usage chunks."""
    texts: dict[int, str] = defaultdict(str)
    reasons: dict[int, str] = {}
    usages = []
    for chunk in chunks:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            delta = getattr(choice, "delta", None)
            texts[choice.index] += (delta.content if delta else choice.text) or ""
            if choice.finish_reason is not None:
                assert choice.index not in reasons, "one finish per choice"
                reasons[choice.index] = choice.finish_reason
    return dict(texts), reasons, usages


def test_local_greedy_choices_are_the_single_answer_n_times(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(messages=USER, **GREEDY)
    three = client.chat.completions.create(messages=USER, n=3, **GREEDY)
    assert [c.index for c in three.choices] == [0, 1, 2]
    answer = one.choices[0].message.content
    assert answer and [c.message.content for c in three.choices] == [answer] * 3
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_local_seeded_choice_i_uses_seed_plus_i(client: openai.OpenAI) -> None:
    sampled = {"model": "auto", "temperature": 1.0, "max_tokens": 12, "messages": USER}
    two = client.chat.completions.create(n=2, seed=41, **sampled)
    alone = [client.chat.completions.create(seed=s, **sampled) for s in (41, 42)]
    got = [c.message.content for c in two.choices]
    assert got == [a.choices[0].message.content for a in alone]
    assert got[0] != got[1]  # sampled choices differ


def test_local_choices_share_the_prompt_pages(app: FastAPI, client: openai.OpenAI) -> None:
    engine = app.state.gateway.engines.get(MODEL)
    system = "You answer in one careful sentence. " * 20  # several full KV pages
    messages = [{"role": "system", "content": system}, *USER]
    before = wait_idle(engine)
    reply = client.chat.completions.create(messages=messages, n=3, **GREEDY)
    after = wait_idle(engine)
    full_pages = reply.usage.prompt_tokens // PAGE_SIZE * PAGE_SIZE
    # the two siblings reused every full page of the prompt the first one computed
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 2 * full_pages > 0
    assert after.prompt_tokens - before.prompt_tokens == 3 * reply.usage.prompt_tokens


def test_a_disconnect_aborts_every_choice(app: FastAPI, url: str) -> None:
    engine = app.state.gateway.engines.get(MODEL)
    before = wait_idle(engine).generated_tokens
    body = {**GREEDY, "messages": USER, "n": 3, "max_tokens": 600, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as response:
        lines = response.iter_lines()
        for _ in range(12):  # a few pieces arrive, then the client hangs up
            next(lines)
        assert engine.metrics.snapshot().running == 3
    after = wait_idle(engine)  # every choice's request aborted, its pages freed
    assert after.generated_tokens - before < 3 * 400  # long before 3 x 600 tokens
    with pytest.raises(httpx.ReadTimeout):  # a whole answer: the client gives up
        httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=1.0)
    assert wait_idle(engine).generated_tokens - after.generated_tokens < 3 * 400


def test_local_streamed_choices_carry_their_index(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(messages=USER, n=2, **GREEDY)
    stream = client.chat.completions.create(
        messages=USER, n=2, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    texts, reasons, usages = _streamed(stream)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert len(usages) == 1 and usages[0].completion_tokens == whole.usage.completion_tokens


def test_local_text_completion_choices(client: openai.OpenAI) -> None:
    whole = client.completions.create(prompt="The sky is", n=2, logprobs=1, **GREEDY)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.choices[0].text == whole.choices[1].text
    for choice in whole.choices:
        assert "".join(choice.logprobs.tokens) == choice.text
    texts, reasons, _ = _streamed(
        client.completions.create(prompt="The sky is", n=2, stream=True, **GREEDY)
    )
    assert texts == {c.index: c.text for c in whole.choices}
    assert set(reasons) == {0, 1}


def test_choices_are_never_served_from_or_stored_in_the_cache(client: openai.OpenAI) -> None:
    ask = client.chat.completions.with_raw_response.create
    question = [{"role": "user", "content": "What is the tallest mountain in Africa?"}]
    many = ask(messages=question, n=2, **GREEDY)
    assert many.headers["x-tiergate-cache"] == "bypass"
    time.sleep(0.3)  # a store would run after the answer went out
    single = ask(messages=question, **GREEDY)
    assert single.headers["x-tiergate-cache"] == "miss"  # the n=2 answer was not stored
    time.sleep(0.3)
    assert ask(messages=question, **GREEDY).headers["x-tiergate-cache"] == "hit"
    again = ask(messages=question, n=2, **GREEDY)  # an entry exists, yet n=2 bypasses it
    assert again.headers["x-tiergate-cache"] == "bypass"
    assert len(again.parse().choices) == 2


@pytest.mark.parametrize("tier", ["direct", "via_litellm"])
def test_remote_tiers_get_n_and_answer_every_choice(
    client: openai.OpenAI, stub: FastAPI, tier: str
) -> None:
    whole = client.chat.completions.create(model=tier, messages=USER, n=3)
    assert stub.state.bodies[-1]["n"] == 3
    got = [(c.index, c.message.content) for c in whole.choices]
    assert got == [(0, "stub answer"), (1, "stub answer 1"), (2, "stub answer 2")]
    assert whole.usage.completion_tokens == 2  # the upstream's usage, as reported
    texts, reasons, _ = _streamed(
        client.chat.completions.create(model=tier, messages=USER, n=3, stream=True)
    )
    assert texts == dict(got) and reasons == {0: "stop", 1: "stop", 2: "stop"}


def test_a_streamed_choice_left_unfinished_is_an_error_not_a_stop(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="cut", messages=USER, n=2, stream=True)
    with pytest.raises(openai.APIError, match="a choice of the answer was cut"):
        list(stream)


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_a_400_naming_n(client: openai.OpenAI, n: int) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(messages=USER, n=n, **GREEDY)
    assert info.value.body["param"] == "n" and "1..16" in info.value.body["message"]


# ---------------------------------------------------------------------------- best_of

SAMPLED_TEXT: dict[str, Any] = {
    "model": "auto",
    "prompt": "The best thing about summer is",
    "temperature": 1.0,
    "max_tokens": 10,
    "seed": 11,
}


def test_local_best_of_returns_the_most_likely_candidate(client: openai.OpenAI) -> None:
    plain = client.completions.create(prompt="The sky is", **GREEDY)
    greedy = client.completions.create(prompt="The sky is", best_of=3, **GREEDY)
    assert [c.text for c in greedy.choices] == [plain.choices[0].text]
    assert greedy.usage.completion_tokens == 3 * plain.usage.completion_tokens
    # the candidates, as choices: candidate i uses seed + i like choice i
    as_choices = client.completions.create(n=3, logprobs=0, **SAMPLED_TEXT)
    candidates = as_choices.choices
    best = max(candidates, key=lambda c: sum(c.logprobs.token_logprobs))
    assert best.index != 0 and len({c.text for c in candidates}) == 3  # the pick shows
    reply = client.completions.create(best_of=3, n=1, **SAMPLED_TEXT)
    assert [c.text for c in reply.choices] == [best.text]
    assert reply.choices[0].logprobs is None  # ranked with logprobs the client did not ask
    assert reply.usage.completion_tokens == as_choices.usage.completion_tokens  # all of them


def test_local_best_of_shares_the_prompt_pages(app: FastAPI, client: openai.OpenAI) -> None:
    engine = app.state.gateway.engines.get(MODEL)
    prompt = "A long and careful introduction to the subject at hand. " * 12
    before = wait_idle(engine)
    reply = client.completions.create(prompt=prompt, best_of=3, **GREEDY)
    after = wait_idle(engine)
    full_pages = reply.usage.prompt_tokens // PAGE_SIZE * PAGE_SIZE
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 2 * full_pages > 0
    assert after.prompt_tokens - before.prompt_tokens == 3 * reply.usage.prompt_tokens


def test_best_of_bypasses_the_cache(client: openai.OpenAI) -> None:
    ask = client.completions.with_raw_response.create
    prompt = "The capital city of Kenya is"
    assert ask(prompt=prompt, best_of=2, **GREEDY).headers["x-tiergate-cache"] == "bypass"
    time.sleep(0.3)  # a store would run after the answer went out
    assert ask(prompt=prompt, **GREEDY).headers["x-tiergate-cache"] == "miss"  # not stored
    time.sleep(0.3)
    assert ask(prompt=prompt, **GREEDY).headers["x-tiergate-cache"] == "hit"
    assert ask(prompt=prompt, best_of=2, **GREEDY).headers["x-tiergate-cache"] == "bypass"


@pytest.mark.parametrize("fields", [{"best_of": 2, "n": 3}, {"best_of": 3, "stream": True}])
def test_bad_best_of_is_a_400_naming_it(client: openai.OpenAI, fields: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(prompt="The sky is", **GREEDY, **fields)
    assert info.value.body["param"] == "best_of"


def test_best_of_is_forwarded_on_completions_only() -> None:
    text = CompletionRequest(model="m", prompt="a", best_of=3, n=2)
    assert sampling_fields(GenerationRequest("r", text, "t"), vllm=False)["best_of"] == 3
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, "best_of": 3})
    assert "best_of" not in sampling_fields(GenerationRequest("r", chat, "t"), vllm=True)
