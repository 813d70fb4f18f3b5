"""What a cache hit may be, through the live gateway: its scope (tier-choosing headers), its
lifetime (a client's TTL under the policy's), the usage it reports, and the counts
/admin/cache gives once the store lost entries. The tiers are the paid-API stand-in, so
every answer is instant and its usage known.
"""

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from redis import Redis

from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.routing.features import extract_features
from tests.paid_api import paid_api_app
from tests.servers import eventually, redis_server, run_uvicorn

KEY, PLAIN_KEY, ADMIN = "sk-hits-override", "sk-hits-plain", "sk-hits-admin"
ROUTE_TTL_S = 600
PRICE = "{input: 1.0, output: 2.0}"


def policy_text(paid: str, cache: str) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: acme, tier_override: true}}, {{key: {PLAIN_KEY}, tenant: acme}}]
  admin_key: {ADMIN}
cache: {cache}
tiers:
  cheap: {{deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}"}}], price: {PRICE}}}
  dear: {{deployments: [{{model: openai/gpt-4o, api_base: "{paid}"}}], price: {PRICE}}}
routes:
  auto:
    default: cheap
    rules: [{{headers: {{x-team: premium}}, tier: dear}}]
    cache: {{ttl_s: {ROUTE_TTL_S}}}
"""


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache") / "cache.sqlite3"


@pytest.fixture(scope="module")
def url(cache_path: Path) -> Iterator[str]:
    with run_uvicorn(paid_api_app()) as paid:
        cache = f"{{enabled: true, store: embedded, path: {cache_path}, ttl_s: 3600}}"
        policy = parse_policy(policy_text(f"{paid}/v1", cache), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


def ask(url: str, text: str, key: str = KEY, **headers: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": text}],
        max_tokens=4,
        temperature=0,
        extra_headers={k.replace("_", "-"): v for k, v in headers.items()},
    )


def cached(raw) -> str:
    return raw.headers["x-tiergate-cache"]


def test_a_client_ttl_never_outlives_the_route_ttl(url: str, cache_path: Path) -> None:
    text = "How long do cached answers live?"
    ask(url, text, x_tiergate_cache_ttl="31536000")
    ask(url, "And a short one?", x_tiergate_cache_ttl="5")
    time.sleep(0.5)  # stores run after the answers went out
    with sqlite3.connect(cache_path) as db:
        rows = dict(db.execute("SELECT question, expires_at - created_at FROM entries"))
    assert rows[text] == pytest.approx(ROUTE_TTL_S)
    assert rows["And a short one?"] == pytest.approx(5)


def test_the_tier_override_is_part_of_the_scope(url: str) -> None:
    text = "Which tier answered this?"
    dear = ask(url, text, x_tiergate_tier="dear")
    assert (cached(dear), dear.headers["x-tiergate-tier"]) == ("miss", "dear")
    time.sleep(0.3)
    assert cached(ask(url, text, x_tiergate_tier="dear")) == "hit"
    cheap = ask(url, text, x_tiergate_tier="cheap")
    assert (cached(cheap), cheap.headers["x-tiergate-tier"]) == ("miss", "cheap")
    # A key that may not choose the tier is refused, as without the cache, not served a hit.
    with pytest.raises(openai.PermissionDeniedError):
        ask(url, text, key=PLAIN_KEY, x_tiergate_tier="dear")


def test_headers_the_rules_read_are_part_of_the_scope(url: str) -> None:
    text = "Is this answer for the premium team?"
    premium = ask(url, text, key=PLAIN_KEY, x_team="premium")
    assert premium.headers["x-tiergate-tier"] == "dear"
    time.sleep(0.3)
    assert cached(ask(url, text, key=PLAIN_KEY, x_team="premium")) == "hit"
    plain = ask(url, text, key=PLAIN_KEY)
    assert (cached(plain), plain.headers["x-tiergate-tier"]) == ("miss", "cheap")


def spent_usd(url: str) -> float:
    stats = httpx.get(f"{url}/admin/stats", headers={"Authorization": f"Bearer {ADMIN}"})
    return stats.json()["windows"]["all"]["savings"]["spent_usd"]


def test_a_semantic_hit_reports_its_own_prompt_and_costs_nothing(url: str) -> None:
    stored = "What is the capital of France?"
    first = ask(url, stored).parse().usage
    assert first.prompt_tokens == len(stored.split())  # what the paid API counts
    time.sleep(0.3)
    spent = spent_usd(url)
    asked = "hey, what is the capital of France? thanks"
    raw = ask(url, asked)
    assert raw.headers["x-tiergate-cache"] == "hit"
    assert float(raw.headers["x-tiergate-similarity"]) < 1.0  # semantic, not exact
    usage = raw.parse().usage
    estimate = extract_features([{"role": "user", "content": asked}], None).approx_tokens
    assert (usage.prompt_tokens, usage.completion_tokens) == (estimate, first.completion_tokens)
    assert usage.total_tokens == estimate + first.completion_tokens
    exact = ask(url, f"  {stored}").parse().usage  # the same prompt: its own count stands
    assert (exact.prompt_tokens, exact.completion_tokens) == (first.prompt_tokens, 4)
    assert spent_usd(url) == spent > 0  # the policy has no price for hits: they cost nothing


def test_admin_cache_counts_what_the_store_still_holds() -> None:
    with run_uvicorn(paid_api_app()) as paid, redis_server() as redis:
        cache = f'{{enabled: true, store: redis, redis_url: "{redis.url}"}}'
        policy = parse_policy(policy_text(f"{paid}/v1", cache), env={})
        with run_uvicorn(create_app(policy)) as url:
            for text in ("Name a red fruit.", "Name a green fruit.", "Name a blue fruit."):
                ask(url, text)
            assert eventually(lambda: entries(url) == 3, 2.0)
            store = Redis.from_url(redis.url)
            store.delete(next(store.scan_iter("tiergate:cache:e:*")))  # as an eviction would
            assert entries(url) == 2
            store.flushall()  # announces nothing to the gateway
            assert entries(url) == 0 and admin_cache(url)["store"]["healthy"]
            ask(url, "Name a yellow fruit.")
            assert eventually(lambda: entries(url) == 1, 2.0)
            assert cached(ask(url, "Name a yellow fruit.")) == "hit"


def admin_cache(url: str) -> dict:
    return httpx.get(f"{url}/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"}).json()


def entries(url: str) -> int:
    return admin_cache(url)["entries"]
