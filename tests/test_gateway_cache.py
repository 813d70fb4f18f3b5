"""The semantic cache through the live gateway: real engine, real embedder, openai client."""

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn

KEY, OTHER_KEY, ADMIN = "sk-cache-test-1", "sk-cache-test-2", "sk-cache-admin"


def cache_policy(store: str) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}, {{key: {OTHER_KEY}, tenant: two}}]
  admin_key: {ADMIN}
cache:
  {store}
engines:
  smollm2-135m: {{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}], price: {{input: 1.0, output: 2.0}}}}
routes:
  auto: {{default: small}}
  nocache: {{default: small, cache: {{enabled: false}}}}
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def url(cache_dir: Path) -> Iterator[str]:
    store = f"{{enabled: true, store: embedded, path: {cache_dir / 'cache.sqlite3'}}}"
    policy = parse_policy(cache_policy(store), env={})
    with run_uvicorn(create_app(policy)) as base:
        yield base


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def ask(url: str, text: str, key: str = KEY, **kwargs: object):
    params = {"model": "auto", "max_tokens": 12, "temperature": 0} | kwargs
    messages = kwargs.pop("messages", None) or [{"role": "user", "content": text}]
    params["messages"] = messages
    return client(url, key).chat.completions.with_raw_response.create(**params)


def test_repeat_is_an_exact_hit_with_the_same_answer(url: str) -> None:
    first = ask(url, "What is the boiling point of water at sea level?")
    assert first.headers["x-tiergate-cache"] == "miss"
    time.sleep(0.3)  # the store runs after the answer went out
    again = ask(url, "  What is the boiling point\nof water at sea level? ")
    assert again.headers["x-tiergate-cache"] == "hit"
    assert float(again.headers["x-tiergate-similarity"]) == pytest.approx(1.0)
    assert again.headers["x-tiergate-tier"] == "small"
    a, b = first.parse(), again.parse()
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.usage.completion_tokens == a.usage.completion_tokens


def test_case_unicode_and_punctuation_are_no_exact_repeat(url: str) -> None:
    # NFKC makes "2³" 23; "10!" is not 10: only the verifier may judge such pairs.
    for stored, asked in (("What is 2³?", "What is 23?"), ("Compute 10!", "Compute 10")):
        ask(url, stored)
        time.sleep(0.3)
        assert ask(url, stored.replace(" ", "  ")).headers["x-tiergate-cache"] == "hit"
        assert ask(url, asked).headers["x-tiergate-cache"] == "miss"


def test_must_not_pairs_never_hit(url: str) -> None:
    ask(url, "How do I enable 2FA on my GitHub account?")
    time.sleep(0.3)
    assert (
        ask(url, "How do I disable 2FA on my GitHub account?").headers["x-tiergate-cache"] == "miss"
    )
    ask(url, "What is 2+2?")
    time.sleep(0.3)
    assert ask(url, "What is 2+3?").headers["x-tiergate-cache"] == "miss"


def test_scope_isolation(url: str) -> None:
    text = "Name three primary colors."
    ask(url, text)
    time.sleep(0.3)
    assert ask(url, text).headers["x-tiergate-cache"] == "hit"
    assert ask(url, text, key=OTHER_KEY).headers["x-tiergate-cache"] == "miss"  # tenant
    assert ask(url, text, temperature=0.5).headers["x-tiergate-cache"] == "miss"  # sampling
    system = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": text}]
    assert ask(url, text, messages=system).headers["x-tiergate-cache"] == "miss"  # system
    assert ask(url, text, model="small").headers["x-tiergate-cache"] == "miss"  # model asked


def test_streamed_hit_parses_with_usage(url: str) -> None:
    text = "Give one word that rhymes with cat."
    whole = ask(url, text).parse().choices[0].message.content
    time.sleep(0.3)
    stream = client(url).chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": text}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_no_cache_and_no_store(url: str) -> None:
    text = "List two prime numbers."
    ask(url, text)
    time.sleep(0.3)
    skip = ask(url, text, extra_headers={"Cache-Control": "no-cache"})
    assert skip.headers["x-tiergate-cache"] == "bypass"
    fresh = "List three even numbers."
    ask(url, fresh, extra_headers={"Cache-Control": "no-store"})
    time.sleep(0.3)
    assert ask(url, fresh).headers["x-tiergate-cache"] == "miss"


def test_cut_answer_never_serves_a_longer_limit(url: str) -> None:
    text = "Write a long story about a dragon."
    cut = ask(url, text, max_tokens=3)
    assert cut.parse().choices[0].finish_reason == "length"
    time.sleep(0.3)
    assert ask(url, text, max_tokens=3).headers["x-tiergate-cache"] == "hit"
    assert ask(url, text, max_tokens=20).headers["x-tiergate-cache"] == "miss"


def test_errors_and_cut_streams_are_never_stored(url: str) -> None:
    text = "Explain photosynthesis in one sentence."
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "auto",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        },
    ) as response:
        next(response.iter_lines())  # one piece, then hang up
    time.sleep(0.5)
    assert ask(url, text).headers["x-tiergate-cache"] == "miss"


def test_completion_logprobs_zero_is_never_answered_without_them(url: str) -> None:
    params = {"model": "auto", "prompt": "The capital of Italy is", "max_tokens": 4}
    for _ in range(2):  # `logprobs: 0` asks for the sampled tokens' logprobs: not cacheable
        raw = client(url).completions.with_raw_response.create(**params, temperature=0, logprobs=0)
        assert raw.headers["x-tiergate-cache"] == "bypass"
        assert raw.parse().choices[0].logprobs is not None
        time.sleep(0.3)


def test_route_with_cache_off_says_off(url: str) -> None:
    assert ask(url, "Hello there", model="nocache").headers["x-tiergate-cache"] == "off"


def test_bad_ttl_header_is_a_400(url: str) -> None:
    with pytest.raises(openai.BadRequestError):
        ask(url, "hi", extra_headers={"x-tiergate-cache-ttl": "nan"})


def test_embedded_store_survives_a_restart(cache_dir: Path) -> None:
    store = f"{{enabled: true, store: embedded, path: {cache_dir / 'restart.sqlite3'}}}"
    policy = parse_policy(cache_policy(store), env={})
    text = "What colour is the sky on a clear day?"
    with run_uvicorn(create_app(policy)) as base:
        ask(base, text)
        time.sleep(0.3)
    with run_uvicorn(create_app(policy)) as base:
        assert ask(base, text).headers["x-tiergate-cache"] == "hit"


def test_reload_turns_the_cache_on_and_applies_route_settings(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    off = cache_policy("{enabled: false}")
    path.write_text(off)
    app = create_app(parse_policy(off, env={}), policy_path=path)
    text = "What is the chemical symbol for gold?"
    with run_uvicorn(app) as base:
        assert ask(base, text).headers["x-tiergate-cache"] == "off"
        on = cache_policy(f"{{enabled: true, path: {tmp_path / 'reload.sqlite3'}}}")
        path.write_text(on)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        reload = httpx.post(f"{base}/admin/policy/reload", headers=admin, timeout=120)
        assert reload.status_code == 200, reload.text
        assert ask(base, text).headers["x-tiergate-cache"] == "miss"
        time.sleep(0.3)
        assert ask(base, text).headers["x-tiergate-cache"] == "hit"
        path.write_text(
            on.replace("auto: {default: small}", "auto: {default: small, cache: {enabled: false}}")
        )
        assert httpx.post(f"{base}/admin/policy/reload", headers=admin, timeout=120).is_success
        assert ask(base, text).headers["x-tiergate-cache"] == "off"
