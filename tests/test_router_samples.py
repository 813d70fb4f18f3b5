"""Traffic samples for `tiergate router learn`: kept per tenant and route in the cache's
store (embedded SQLite and a real redis-server), bounded in count and time, purged by
tenant or route; and, through the live gateway and the openai client, the opt-in
`routes.<name>.learn.sample_rate`, the admin listing, export and purge, and bad input.

The tiers are the paid-API stand-in (tests/paid_api.py): answers at once, known text.
"""

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.cache.samples import Sample, SampleStore
from gateway.cache.samples_redis import RedisSamples
from gateway.cache.samples_sqlite import SqliteSamples
from gateway.cache.store import StoreUnavailable
from gateway.policy import PolicyError, parse_policy
from tests.paid_api import paid_api_app
from tests.servers import eventually, free_port, run_uvicorn

KEY_A, KEY_B, ADMIN = "sk-samples-tenant-a", "sk-samples-tenant-b", "sk-samples-admin"
DAY = 86400.0


def sample(tenant: str, route: str = "auto", age_s: float = 0.0, keep_s: float = DAY) -> Sample:
    created = time.time() - age_s
    messages = [{"role": "user", "content": f"question {uuid.uuid4().hex[:6]}"}]
    return Sample(tenant, route, messages, "small", "m", "an answer", 16, 3, 2, created,
                  created + keep_s)  # fmt: skip


@pytest.fixture(params=["embedded", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
) -> AsyncIterator[SampleStore]:
    if request.param == "embedded":
        opened: SampleStore = SqliteSamples(tmp_path / "store.sqlite3")
    else:
        opened = RedisSamples(redis_url, f"test:{uuid.uuid4().hex}")  # keys of its own
    yield opened
    await opened.close()


async def test_samples_are_kept_per_tenant(store: SampleStore) -> None:
    a, b = sample("a"), sample("b")
    await store.add(a, 10)
    await store.add(b, 10)
    assert [s.id for s in await store.list("a", None)] == [a.id]
    assert [s.id for s in await store.list("b", "auto")] == [b.id]
    assert {s.id for s in await store.list(None, None)} == {a.id, b.id}
    kept = (await store.list("a", "auto"))[0]
    assert kept.messages == a.messages and kept.answer == "an answer" and kept.tier == "small"


async def test_count_is_bounded_oldest_first(store: SampleStore) -> None:
    made = [sample("a", age_s=100 - i) for i in range(5)]
    for one in made:
        await store.add(one, 3)
    await store.add(sample("a", route="other"), 3)  # another route's bound is its own
    assert [s.id for s in await store.list("a", "auto")] == [s.id for s in made[2:]]
    assert len(await store.list("a", "other")) == 1


async def test_expired_samples_are_not_listed_and_are_dropped(store: SampleStore) -> None:
    old = sample("a", age_s=2 * DAY, keep_s=DAY)
    await store.add(old, 10)
    assert await store.list("a", None) == []
    fresh = sample("a")
    await store.add(fresh, 10)
    assert [s.id for s in await store.list("a", None)] == [fresh.id]
    assert await store.purge("a", None) == 1  # the expired one is gone from the store too


async def test_purge_by_tenant_route_or_all(store: SampleStore) -> None:
    for tenant, route in [("a", "auto"), ("a", "other"), ("b", "auto"), ("b", "other")]:
        await store.add(sample(tenant, route), 10)
    assert await store.purge("a", None) == 2
    assert {(s.tenant, s.route) for s in await store.list(None, None)} == {
        ("b", "auto"),
        ("b", "other"),
    }
    assert await store.purge(None, "other") == 1
    assert await store.purge(None, None) == 1
    assert await store.list(None, None) == []


async def test_redis_keys_carry_the_retention(redis_url: str) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    store = RedisSamples(redis_url, prefix)
    try:
        await store.add(sample("a", keep_s=60), 10)
        client = Redis.from_url(redis_url)
        keys = [k async for k in client.scan_iter(f"{prefix}:samples:*")]
        assert len(keys) == 1 and 0 < await client.pttl(keys[0]) <= 60_000
        await client.aclose()
    finally:
        await store.close()


async def test_an_unreachable_redis_is_store_unavailable() -> None:
    store = RedisSamples(f"redis://127.0.0.1:{free_port()}/0", "test:down")
    try:
        for call in (store.add(sample("a"), 3), store.list("a", None), store.purge("a", None)):
            with pytest.raises(StoreUnavailable):
                await call
    finally:
        await store.close()


def test_learn_settings_are_checked() -> None:
    base = "auth: {mode: none}\ntiers: {t: {deployments: [{model: openai/x}]}}\n"
    for bad in ("sample_rate: 1.5", "max_samples: 0", "retention_days: -1", "rate: 1"):
        text = base + f"routes: {{auto: {{default: t, learn: {{{bad}}}}}}}\n"
        with pytest.raises(PolicyError, match="learn"):
            parse_policy(text, env={})
    for bad in ("max_usd: -1", "max_tokens: 0", "judge: {api_base: x}", "judges: []"):
        with pytest.raises(PolicyError, match="router_learning"):
            parse_policy(base + f"router_learning: {{{bad}}}\n", env={})
    good = parse_policy(base + "router_learning: {judge: {model: openai/gpt-4o}}\n", env={})
    assert good.router_learning.judge.model == "openai/gpt-4o"


def policy_text(paid: str, store: Path, redis_url: str | None = None) -> str:
    tier = f'{{deployments: [{{model: openai/paid, api_base: "{paid}"}}]}}'
    cache = f"{{enabled: false, path: '{store}'}}"
    if redis_url is not None:  # keys of its own on the shared server
        prefix = f"test:{uuid.uuid4().hex}"
        cache = f"{{enabled: false, store: redis, redis_url: '{redis_url}', redis_prefix: {prefix}"
        cache += "}"
    return f"""
auth:
  keys: [{{key: {KEY_A}, tenant: a}}, {{key: {KEY_B}, tenant: b}}]
  admin_key: {ADMIN}
cache: {cache}
tiers: {{small: {tier}, large: {tier}}}
routes:
  auto: {{default: small, learn: {{sample_rate: 1.0, max_samples: 3}}}}
  quiet: {{default: small}}
"""


@pytest.fixture(scope="module", params=["embedded", "redis"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[str]:
    store = tmp_path_factory.mktemp("samples") / "store.sqlite3"
    redis = redis_url if request.param == "redis" else None
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", store, redis), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


def admin(base: str, method: str, **params: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, f"{base}/admin/router/samples", params=params, headers=headers)


def ask(base: str, key: str, text: str, route: str = "auto") -> None:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    client.chat.completions.create(model=route, messages=messages, max_tokens=4)


def test_gateway_samples_a_route_lists_exports_and_purges(gateway: str) -> None:
    for i in range(4):
        ask(gateway, KEY_A, f"What is {i} + {i}?")
    ask(gateway, KEY_B, "Say hi.")
    ask(gateway, KEY_B, "Not sampled: this route has no learn section.", route="quiet")

    def kept() -> bool:
        data = admin(gateway, "GET").json()["data"]
        return len(data) == 4  # three of a's (max_samples), one of b's

    assert eventually(kept, 10)
    a = admin(gateway, "GET", tenant="a").json()["data"]
    assert [s["messages"][-1]["content"] for s in a] == [f"What is {i} + {i}?" for i in (1, 2, 3)]
    assert a[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert {s["tier"] for s in a} == {"small"} and all(s["answer"] for s in a)
    assert all(s["max_tokens"] == 4 and s["route"] == "auto" for s in a)
    export = admin(gateway, "GET", tenant="b", format="jsonl")
    assert export.headers["content-type"].startswith("application/x-ndjson")
    assert Sample.from_json(export.text.splitlines()[0]).last_user_text == "Say hi."
    purged = admin(gateway, "DELETE", tenant="a")
    assert purged.status_code == 200 and purged.json()["purged"] == 3
    assert admin(gateway, "GET", tenant="a").json()["data"] == []
    assert len(admin(gateway, "GET", tenant="b").json()["data"]) == 1


@pytest.mark.parametrize(
    ("method", "params", "param"),
    [
        ("DELETE", {}, "tenant"),  # a purge of everything must say all=true
        ("GET", {"limit": "0"}, "limit"),
        ("GET", {"limit": "many"}, "limit"),
        ("GET", {"format": "xml"}, "format"),
        ("GET", {"tenantt": "a"}, "tenantt"),
        ("DELETE", {"tenant": ""}, "tenant"),
    ],
)
def test_bad_admin_queries_are_openai_400s(
    gateway: str, method: str, params: dict, param: str
) -> None:
    answer = admin(gateway, method, **params)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_samples_need_the_admin_key(gateway: str) -> None:
    headers = {"authorization": f"Bearer {KEY_A}"}
    answer = httpx.get(f"{gateway}/admin/router/samples", headers=headers)
    assert answer.status_code in (401, 403) and "error" in answer.json()
    purge_all = admin(gateway, "DELETE", all="true")
    assert purge_all.status_code == 200


def test_a_store_that_fails_loses_samples_never_answers(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the store's folder would have to be this file
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", blocked / "store.sqlite3"), env={})
        with run_uvicorn(create_app(policy)) as base:
            ask(base, KEY_A, "Still answered?")
            listed = admin(base, "GET")
            assert listed.status_code == 503 and "error" in listed.json()
            assert admin(base, "DELETE", tenant="a").status_code == 503
