"""Per-key and per-tenant limits in one gateway process (no Redis): 429 bodies, Retry-After,
requests, tokens and concurrency, over HTTP with the openai client."""

import time

import openai
import pytest

from gateway.limits.window import Denial, MemoryStore, Scope, retry_after_s
from gateway.policy import LimitSet, PolicyError, parse_policy
from tests.limits_helpers import (
    HASH_A,
    KEY_A,
    KEY_A2,
    KEY_B,
    POLICY,
    assert_429,
    client,
    complete,
    gateway,
    metrics_text,
    refused,
)


def test_requests_per_minute_per_tenant() -> None:
    limits = """
    default: {requests_per_minute: 2}
    tenants: {two: {requests_per_minute: null}}
    """
    with gateway(limits) as url:
        complete(url, KEY_A)
        complete(url, KEY_A2)  # another key of the same tenant: same budget
        retry_after = assert_429(refused(url, KEY_A), "requests_per_minute")
        assert retry_after > 1  # the minute must slide: not "try again at once"
        for _ in range(4):  # tenant two overrides the default with "no limit"
            complete(url, KEY_B)
        metrics = metrics_text(url)
        assert 'tiergate_rate_limited_total{limit="requests_per_minute",scope="tenant"} 1.0' in (
            metrics
        )


def test_per_key_limit_leaves_the_tenants_other_keys_alone() -> None:
    with gateway(f"keys: {{{HASH_A}: {{requests_per_minute: 1}}}}") as url:
        complete(url, KEY_A)
        exc = refused(url, KEY_A)
        assert_429(exc, "requests_per_minute")
        assert "API key" in exc.response.json()["error"]["message"]
        for _ in range(3):
            complete(url, KEY_A2)


def test_tokens_per_minute_counts_the_real_usage() -> None:
    # The fake tokenizer is one token per byte; the admission estimate is chars / 4. An
    # 80-character prompt is admitted on its estimate (20) but settles at 80 + 8 tokens,
    # so the next one (20 more) no longer fits 100: only the real usage explains the 429.
    with gateway("default: {tokens_per_minute: 100}") as url:
        complete(url, KEY_A, "x" * 80, max_tokens=8)
        assert_429(refused(url, KEY_A, "x" * 80), "tokens_per_minute")
        too_big = refused(url, KEY_B, "y" * 500)  # 125 estimated tokens alone exceed 100
        assert_429(too_big, "tokens_per_minute")
        assert "too large" in too_big.response.json()["error"]["message"]
        complete(url, KEY_B, "short")  # the refusal cost tenant two nothing


def test_the_completion_budget_is_reserved_at_admission() -> None:
    """Regression (#29.11): admission counted the prompt only, so 15 concurrent requests of
    max_tokens 200 all fit tokens_per_minute 2000 and then used far more than it."""
    with gateway("default: {tokens_per_minute: 2000}", step_delay_s=0.02) as url:
        streams, refusals = [], 0
        for _ in range(15):  # each stays in flight: 200 steps of 20 ms
            try:
                stream = _long_stream(url, KEY_A, max_tokens=200)
                next(iter(stream))
                streams.append(stream)
            except openai.RateLimitError as exc:
                assert_429(exc, "tokens_per_minute")
                refusals += 1
        for stream in streams:
            stream.close()
        assert 1 <= len(streams) <= 2000 // 200  # 201+ tokens reserved per request
        assert refusals == 15 - len(streams)


def test_the_reservation_settles_to_the_real_usage() -> None:
    """A stream left after its first piece reserved 2 + 250 tokens and used a few: once it
    settles, a second request of 252 fits a budget of 400; unsettled, it would not."""
    with gateway("default: {tokens_per_minute: 400}", step_delay_s=0.02) as url:
        stream = _long_stream(url, KEY_A, max_tokens=250)
        next(iter(stream))
        stream.close()  # the gateway aborts it and settles to what it generated
        reply = None
        for _ in range(100):  # the abort reaches the limiter within moments
            try:
                reply = client(url, KEY_A).completions.create(
                    model="small", prompt="go", max_tokens=250, extra_body={"ignore_eos": True}
                )
                break
            except openai.RateLimitError:
                time.sleep(0.05)
        assert reply is not None, "the left stream's unused reservation was never given back"
        assert reply.usage is not None and reply.usage.completion_tokens == 250
        with pytest.raises(openai.RateLimitError) as too_big:  # a budget alone over the limit
            client(url, KEY_B).completions.create(model="small", prompt="go", max_tokens=5000)
        assert_429(too_big.value, "tokens_per_minute")
        assert "max_tokens" in too_big.value.response.json()["error"]["message"]


def _long_stream(url: str, key: str, max_tokens: int) -> openai.Stream:
    return client(url, key).completions.create(
        model="small",
        prompt="go",
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )


def test_max_concurrent_holds_a_slot_per_request_in_flight() -> None:
    with gateway("default: {max_concurrent: 1}", step_delay_s=0.02) as url:
        for _ in range(3):  # one after another: each releases its slot when it ends
            complete(url, KEY_A)
        stream = client(url, KEY_A).completions.create(
            model="small", prompt="go", max_tokens=200, stream=True
        )
        next(iter(stream))  # in flight now
        assert assert_429(refused(url, KEY_A2), "max_concurrent") == 1
        complete(url, KEY_B)  # another tenant has its own slot
        stream.close()  # the client leaves mid-stream: the slot comes back
        wait_until_admitted(url, KEY_A)


def test_a_failed_request_gives_its_slot_back() -> None:
    with gateway("default: {max_concurrent: 1}") as url:
        with pytest.raises(openai.BadRequestError):  # longer than the fake's 256-token context
            complete(url, KEY_A, "z" * 400)
        complete(url, KEY_A)
        with pytest.raises(openai.NotFoundError):
            client(url, KEY_A).completions.create(model="nope", prompt="x", max_tokens=1)
        complete(url, KEY_A)


def wait_until_admitted(url: str, key: str, deadline_s: float = 30.0) -> None:
    """A disconnect is noticed asynchronously; the slot must come back well within this."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            complete(url, key)
            return
        except openai.RateLimitError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


# -- the window arithmetic ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 6000.0  # the start of a minute

    def __call__(self) -> float:
        return self.now


def test_sliding_window_and_retry_after() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    scope = Scope("tenant", "t", LimitSet(requests_per_minute=2))
    assert store.admit([scope], 0) is None
    assert store.admit([scope], 0) is None
    denial = store.admit([scope], 0)
    assert denial is not None and denial.limit == "requests_per_minute"
    # Both requests slide out of the last minute at the same pace: one fits again once
    # half of them are out, 30 s into the next minute.
    assert retry_after_s(denial) == pytest.approx(90.0)
    clock.now += 89.0
    assert store.admit([scope], 0) is not None
    clock.now += 1.5
    assert store.admit([scope], 0) is None
    clock.now += 120.0  # two idle minutes: nothing left
    assert store.admit([scope], 0) is None
    assert store.admit([scope], 0) is None


def test_refusal_counts_nowhere() -> None:
    """All scopes or none: a request the tenant refuses does not use its key's budget."""
    store = MemoryStore(Clock())
    key = Scope("key", "k", LimitSet(requests_per_minute=5, max_concurrent=5))
    tenant = Scope("tenant", "t", LimitSet(requests_per_minute=1))
    assert store.admit([key, tenant], 3) is None
    for _ in range(3):
        assert store.admit([key, tenant], 3) == Denial(tenant, "requests_per_minute", 0, 1, 0.0)
    assert store.admit([key], 3) is None  # the key counted 2, not 5
    store.finish([key, tenant], 0)
    store.finish([key], 0)
    assert store._in_flight == {}


def test_retry_after_when_the_previous_minute_must_slide_out() -> None:
    scope = Scope("tenant", "t", LimitSet(tokens_per_minute=100))
    # 90 tokens last minute, 0 now, 20 s in: 60 weighted. 50 fit when 90 * (1 - f) <= 50.
    denial = Denial(scope, "tokens_per_minute", prev=90, cur=0, elapsed_s=20.0, cost=50)
    assert retry_after_s(denial) == pytest.approx(60 * (1 - 50 / 90) - 20)


# -- the policy section -------------------------------------------------------------------


def test_tenant_entries_override_the_default_field_by_field() -> None:
    text = POLICY + (
        "limits:\n  default: {requests_per_minute: 10, max_concurrent: 2}\n"
        "  tenants: {one: {requests_per_minute: 50}, two: {max_concurrent: null}}\n"
    )
    limits = parse_policy(text, env={}).limits
    assert limits.for_tenant("one") == LimitSet(requests_per_minute=50, max_concurrent=2)
    assert limits.for_tenant("two") == LimitSet(requests_per_minute=10)
    assert limits.for_tenant("three") == LimitSet(requests_per_minute=10, max_concurrent=2)


def test_limits_section_errors_name_their_path() -> None:
    text = POLICY + (
        "limits:\n  default: {requests_per_minute: 0}\n  tenants: {nobody: {}}\n"
        f"  keys: {{{'ab' * 32}: {{max_concurrent: 1}}}}\n"
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env={})
    assert [str(i) for i in caught.value.issues] == [
        "limits.default.requests_per_minute: must be greater than 0"
    ]
    text = text.replace("requests_per_minute: 0", "requests_per_minute: 1")
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env={})
    issues = [str(i) for i in caught.value.issues]
    assert issues[0] == "limits.tenants.nobody: unknown tenant (known: one, two)"
    assert issues[1].startswith(f"limits.keys.{'ab' * 32}: no key in auth.keys has this SHA-256")
