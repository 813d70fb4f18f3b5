"""Budgets per tenant and per key: a 429 in OpenAI's shape that names the budget, spend
past it under concurrency overshooting by one request's cost at most, in process and
shared by two gateways on one real Redis, and a Redis that is down failing open."""

import concurrent.futures
import logging
import time

import openai
import pytest
import redis
import redis.asyncio

from gateway.limits.budget import period_end, period_id
from tests.servers import free_port
from tests.spend_helpers import (
    ALICE,
    BOB,
    BOB_DIGEST,
    CAROL,
    admin,
    client,
    complete,
    gateway,
    spend_samples,
)

# A completion of "hello" costs 5 prompt + at most 4 completion tokens: $9 at most. It
# reserves one token per prompt character plus 64 (the template's allowance) plus its 4.


def refused(url: str, key: str) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as caught:
        complete(url, key)
    return caught.value


def spent(urls: list[str], tenant: str) -> float:
    return sum(v for url in urls for (t, _, _), v in spend_samples(url).items() if t == tenant)


def storm(urls: list[str], key: str, n: int) -> tuple[list[float], int]:
    """n requests at once, spread over the gateways: what the answered ones cost, and how
    many were refused for the budget."""

    def one(i: int) -> float | None:
        try:
            return complete(urls[i % len(urls)], key)
        except openai.RateLimitError as exc:
            assert exc.response.json()["error"]["code"] == "budget_exceeded"
            return None

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(n)))
    return [r for r in results if r is not None], results.count(None)


def assert_budget_held(urls: list[str], key: str, tenant: str, limit: float) -> None:
    """Spend past `limit` with concurrent requests (while they hold reservations some are
    refused before the limit is reached), then once more alone: refused."""
    costs: list[float] = []
    refusals = storms = 0
    while spent(urls, tenant) < limit:
        paid, no = storm(urls, key, 48)
        costs += paid
        refusals += no
        storms += 1
        assert storms < 40, "the budget never filled: reservations are not given back"
    assert refusals > 0  # the storms did meet the budget
    total = spent(urls, tenant)
    assert total == pytest.approx(sum(costs))
    assert total <= limit + max(costs)  # overspend: one request's cost at most
    assert refused(urls[0], key).response.json()["error"]["code"] == "budget_exceeded"


def test_tenant_budget_refuses_with_a_named_429() -> None:
    extra = "budgets:\n  tenants: {one: {usd_per_day: 20}}\n"
    with gateway(extra) as url:
        while spent([url], "one") < 20:
            complete(url, ALICE)
        exc = refused(url, BOB)  # another key of the same tenant: the tenant's budget
        complete(url, CAROL)  # another tenant is not held up
    assert exc.status_code == 429
    body = exc.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "insufficient_quota" and body["code"] == "budget_exceeded"
    now = time.time()
    for part in ("tenant 'one'", "$20 budget per day", period_id("day", now), " spent"):
        assert part in body["message"]
    retry_after = int(exc.response.headers["retry-after"])
    assert 0 < retry_after <= period_end("day", now) - now + 5


def test_key_budgets_per_day_and_month_apply_to_that_key_only() -> None:
    extra = f"budgets:\n  keys: {{{BOB_DIGEST}: {{usd_per_month: 15}}}}\n"
    with gateway(extra) as url:
        while spent([url], "one") < 15:
            complete(url, BOB)
        message = refused(url, BOB).response.json()["error"]["message"]
        complete(url, ALICE)  # the tenant's other key has no budget
    assert f"API key 'sha256:{BOB_DIGEST[:8]}'" in message and "per month" in message


def test_budget_holds_under_concurrency_in_process() -> None:
    with gateway("budgets:\n  default: {usd_per_day: 300}\n", step_delay_s=0.01) as url:
        assert_budget_held([url], ALICE, "one", 300)


def test_budget_shared_by_two_gateways_on_one_redis(redis_url: str) -> None:
    """Each gateway alone would let its half of the storm spend up to the limit."""
    redis.Redis.from_url(redis_url).delete(*_budget_keys(redis_url, "two") or ["-"])
    extra = f"limits: {{redis_url: '{redis_url}'}}\n"
    extra += "budgets:\n  tenants: {two: {usd_per_day: 250}}\n"
    with gateway(extra, 0.01) as a, gateway(extra, 0.01) as b:
        assert_budget_held([a, b], CAROL, "two", 250)
        assert _budget_keys(redis_url, "two")  # counted in Redis, not in each process


def _budget_keys(redis_url: str, tenant: str) -> list[bytes]:
    return list(redis.Redis.from_url(redis_url).scan_iter(f"tiergate:budget:tenant:{tenant}:*"))


def test_budget_fails_open_in_process_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    extra = f"limits: {{redis_url: '{dead}'}}\nbudgets:\n  tenants: {{one: {{usd_per_day: 20}}}}\n"
    with caplog.at_level(logging.WARNING, logger="tiergate.limits"), gateway(extra) as url:
        while spent([url], "one") < 20:
            complete(url, ALICE)  # answered: Redis being down fails no request
        exc = refused(url, ALICE)  # and the budget still holds, counted in this process
        fallbacks = admin(url).get("/metrics").text
    assert exc.response.json()["error"]["code"] == "budget_exceeded"
    assert "counting in process" in caplog.text
    assert "tiergate_limits_redis_fallbacks_total" in fallbacks


def test_budget_policy_errors_are_reported() -> None:
    from gateway.policy import PolicyError, parse_policy
    from tests.spend_helpers import policy_text

    bad = {
        "budgets:\n  default: {usd_per_day: 0}\n": "budgets.default.usd_per_day",
        "budgets:\n  default: {usd_per_week: 1}\n": "budgets.default.usd_per_week",
        f"budgets:\n  keys: {{{'ab' * 32}: {{usd_per_day: 1}}}}\n": "budgets.keys.",
        "pricing: {cache_hit_factor: 1.5}\n": "pricing.cache_hit_factor",
    }
    for extra, path in bad.items():
        with pytest.raises(PolicyError) as caught:
            parse_policy(policy_text(extra), env={})
        assert any(str(i).startswith(path) for i in caught.value.issues), caught.value


def test_unlimited_client_never_sees_a_budget_error() -> None:
    with gateway() as url:  # no budgets: nothing reserved, nothing refused
        for _ in range(5):
            complete(url, ALICE)
        reply = client(url, ALICE).models.list()
    assert {m.id for m in reply.data} >= {"small", "chat"}


def test_redis_reservations_settle_once_and_lapse_with_their_lease(redis_url: str) -> None:
    """A settle sent again (its first reply lost) adds nothing; a reservation never settled
    (its replica died) stops holding the budget when its lease ends."""
    import asyncio
    import uuid

    from gateway.limits.budget import NANO, BudgetScope, RedisBudgets

    async def run() -> tuple[int, bool, bool]:
        client = redis.asyncio.Redis.from_url(redis_url)
        name = uuid.uuid4().hex  # a scope of its own in the shared Redis
        scope = BudgetScope("tenant", name, name, "day", period_id("day", time.time()), 10.0)
        budgets = RedisBudgets(client, lease_s=0.3)
        assert await budgets.reserve([scope], 8 * NANO, "a") is None
        await budgets.settle([scope], "a", 3 * NANO)
        await budgets.settle([scope], "a", 3 * NANO)  # a resend: not counted twice
        assert await budgets.reserve([scope], 7 * NANO, "b") is None  # 3 spent < 10
        held = await budgets.reserve([scope], NANO, "c")  # 3 + 7 held: the next one waits
        await asyncio.sleep(0.4)  # "b" is never settled: its lease ends
        lapsed = await budgets.reserve([scope], NANO, "d") is None
        spent_now = await budgets.spent(scope)
        await client.aclose()
        return spent_now, held is not None, lapsed

    spent_now, refused_while_held, admitted_after_lease = asyncio.run(run())
    assert spent_now == 3 * 1_000_000_000
    assert refused_while_held and admitted_after_lease
