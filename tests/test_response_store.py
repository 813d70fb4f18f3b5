"""Stored responses live in the cache's store: records with a TTL and a bound in SQLite,
shared through Redis by replicas (two live gateways on one real Redis: a response stored
through one is read and continued through the other), and a Redis outage degrades."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.app import create_app
from gateway.cache import store_sqlite
from gateway.cache.store_redis import RedisStore
from gateway.cache.store_sqlite import SqliteStore
from gateway.policy import parse_policy
from tests.servers import redis_server, run_uvicorn

KEY = "sk-response-store"


async def test_sqlite_records_expire_and_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "cache.sqlite3")
    await store.load()
    try:
        await store.put_record("a", "one", 3600)
        assert await store.get_record("a") == "one"
        await store.put_record("gone", "two", 0)  # already past its TTL
        assert await store.get_record("gone") is None
        monkeypatch.setattr(store_sqlite, "MAX_RECORDS", 2)
        for key, ttl in (("b", 10.0), ("c", 7200.0), ("d", 9000.0)):
            await store.put_record(key, key, ttl)
        # the bound keeps the two that live longest
        assert [await store.get_record(k) for k in "abcd"] == [None, None, "c", "d"]
        assert await store.delete_record("c") and not await store.delete_record("c")
    finally:
        await store.close()


async def test_redis_records_are_shared_and_expire(redis_url: str) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    one, two = RedisStore(redis_url, prefix), RedisStore(redis_url, prefix)
    try:
        await one.put_record("r", "value", 3600)
        assert await two.get_record("r") == "value"
        assert await two.delete_record("r") and await one.get_record("r") is None
        assert await RedisStore(redis_url, "test:other").get_record("r") is None
    finally:
        await one.close()
        await two.close()


def policy_text(redis_url: str) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
cache: {{enabled: true, store: redis, redis_url: "{redis_url}"}}
engines:
  smollm2-135m: {{kv_cache_mb: 32, max_num_seqs: 4, max_model_len: 1024, num_threads: 1}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
routes:
  auto: {{default: small}}
"""


@pytest.fixture(scope="module")
def redis_and_replicas(one_torch_thread: None) -> Iterator[tuple[object, str, str]]:
    with redis_server() as redis:
        policy = parse_policy(policy_text(redis.url), env={})
        with run_uvicorn(create_app(policy)) as a, run_uvicorn(create_app(policy)) as b:
            yield redis, a, b


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_a_response_stored_on_one_replica_continues_on_the_other(
    redis_and_replicas: tuple[object, str, str],
) -> None:
    _, a, b = redis_and_replicas
    first = client(a).responses.create(
        model="auto", input="Say hello.", max_output_tokens=4, temperature=0
    )
    assert client(b).responses.retrieve(first.id).output_text == first.output_text
    follow = client(b).responses.create(
        model="auto", input="Again.", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.previous_response_id == first.id and follow.output_text


def test_redis_down_answers_but_stores_nothing(
    redis_and_replicas: tuple[object, str, str],
) -> None:
    redis, a, _ = redis_and_replicas
    redis.stop()  # type: ignore[attr-defined]
    try:
        reply = client(a).responses.create(model="auto", input="Hi.", max_output_tokens=4)
        assert reply.output_text  # the answer is not refused for the store
        with pytest.raises(openai.InternalServerError) as down:
            client(a).responses.retrieve(reply.id)
        assert down.value.status_code == 503
    finally:
        redis.start()  # type: ignore[attr-defined]
