"""Spend per tenant, per key and per route: /metrics and /admin/stats from one registry,
keys named by their label (never the key), costs from the tier's price and real usage."""

import time
from pathlib import Path

import pytest

from engine.entrypoints.openai.protocol import Usage
from gateway.app import create_app
from gateway.policy import Price, PricingSettings, parse_policy
from gateway.pricing import spend_usd
from tests.paid_api import paid_api_app
from tests.servers import run_uvicorn
from tests.spend_helpers import (
    ADMIN,
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


def test_spend_per_tenant_key_and_route_in_metrics_and_admin_stats() -> None:
    bob = f"sha256:{BOB_DIGEST[:8]}"  # a key without a name: a short prefix of its hash
    with gateway() as url:
        paid = {
            ("one", "alice", "chat"): complete(url, ALICE, "chat") + complete(url, ALICE, "chat"),
            ("one", "alice", "-"): complete(url, ALICE, "small", "hi there"),
            ("one", bob, "chat"): complete(url, BOB, "chat", "hey"),
        }
        carol = complete(url, CAROL, "small", "a longer prompt here")
        metrics = admin(url).get("/metrics").text
        samples = spend_samples(url)
        stats = admin(url).get("/admin/stats").json()["windows"]["all"]["spend"]
    carol_key = next(k for (t, k, _) in samples if t == "two")
    paid[("two", carol_key, "-")] = carol
    assert samples == pytest.approx(paid)
    for key in (ALICE, BOB, CAROL):  # no key, nor a prefix long enough to look one up
        assert key not in metrics and key[:12] not in metrics
    assert carol_key.startswith("sha256:") and len(carol_key) == len("sha256:") + 8
    one = sum(v for (t, _, _), v in paid.items() if t == "one")
    assert stats["tenants"] == pytest.approx({"one": one, "two": carol})
    assert stats["usd"] == pytest.approx(one + carol)
    chat = paid[("one", "alice", "chat")] + paid[("one", bob, "chat")]
    direct = paid[("one", "alice", "-")] + carol
    assert stats["routes"] == pytest.approx({"chat": chat, "-": direct})
    keys = {(r["tenant"], r["key"]): r["usd"] for r in stats["keys"]}
    alice = paid[("one", "alice", "chat")] + paid[("one", "alice", "-")]
    assert keys == pytest.approx(
        {
            ("one", "alice"): alice,
            ("one", bob): paid[("one", bob, "chat")],
            ("two", carol_key): carol,
        }
    )


def test_spend_prices_cached_prompt_tokens_and_cache_hits_as_the_policy_says() -> None:
    """Unit figures on made-up usage (the integration above prices real usage)."""
    price = Price(input=2.0, output=10.0)  # per 1M
    usage = Usage.of(1000, 100, cached_tokens=400)
    full = (1000 * 2.0 + 100 * 10.0) / 1e6
    assert spend_usd(usage, price, PricingSettings()) == pytest.approx(full)
    half = PricingSettings(cached_prompt_factor=0.5)
    assert spend_usd(usage, price, half) == pytest.approx(full - 400 * 2.0 * 0.5 / 1e6)
    assert spend_usd(usage, price, PricingSettings(), cached=True) == 0.0  # default: free
    tenth = PricingSettings(cache_hit_factor=0.1)
    assert spend_usd(usage, price, tenth, cached=True) == pytest.approx(full * 0.1)
    # more cached tokens than prompt tokens (a confused upstream) never makes a cost negative
    odd = Usage.of(10, 0, cached_tokens=50)
    assert spend_usd(odd, price, half) == pytest.approx(10 * 2.0 * 0.5 / 1e6)


def test_a_cache_hit_costs_its_tenant_the_policys_share(tmp_path: Path) -> None:
    """Through the live gateway with the semantic cache on and a paid-API stand-in: the hit
    costs `pricing.cache_hit_factor` of the answer's price, the tier is not paid again."""
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(
            f"""
auth: {{keys: [{{key: {ALICE}, tenant: acme, name: alice}}], admin_key: {ADMIN}}}
cache: {{enabled: true, store: embedded, path: {tmp_path / "cache.sqlite3"}}}
pricing: {{cache_hit_factor: 0.25}}
tiers:
  cheap:
    deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}/v1"}}]
    price: {{input: 1000000, output: 1000000}}
routes:
  auto: {{default: cheap}}
""",
            env={},
        )
        with run_uvicorn(create_app(policy)) as url:
            chat = client(url, ALICE).chat.completions.with_raw_response
            ask = {"model": "auto", "max_tokens": 4, "temperature": 0}
            ask["messages"] = [{"role": "user", "content": "What does a cache hit cost?"}]
            first = chat.create(**ask)
            outcomes = [first.headers["x-tiergate-cache"]]
            deadline = time.monotonic() + 10
            while outcomes[-1] != "hit" and time.monotonic() < deadline:
                time.sleep(0.1)  # the store runs after the answer went out
                outcomes.append(chat.create(**ask).headers["x-tiergate-cache"])
            samples = spend_samples(url)
            tier_cost = admin(url).get("/admin/stats").json()["windows"]["all"]["tiers"]
    usage = first.parse().usage
    assert usage is not None and outcomes[-1] == "hit"
    cost = usage.total_tokens * 1.0  # $1 a token; every miss has the same usage
    misses = outcomes.count("miss")
    assert samples[("acme", "alice", "auto")] == pytest.approx(misses * cost + 0.25 * cost)
    assert tier_cost["cheap"]["cost_usd"] == pytest.approx(misses * cost)  # a hit pays no tier
