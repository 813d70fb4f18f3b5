"""Two live gateways on one real Redis share the cache; Redis dying degrades, never fails."""

from collections.abc import Iterator

import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import eventually, redis_server, run_uvicorn

KEY = "sk-cache-redis-1"


def policy_text(redis_url: str) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: one}}]
cache: {{enabled: true, store: redis, redis_url: "{redis_url}"}}
engines:
  smollm2-135m: {{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
routes:
  auto: {{default: small}}
"""


def ask(url: str, text: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
    )
    assert raw.parse().choices[0].message.content is not None
    return raw.headers["x-tiergate-cache"]


@pytest.fixture
def replicas(redis_url: str) -> Iterator[tuple[str, str]]:
    policy = parse_policy(policy_text(redis_url), env={})
    with run_uvicorn(create_app(policy)) as a, run_uvicorn(create_app(policy)) as b:
        yield a, b


def test_answer_stored_through_one_replica_hits_through_the_other(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    text = "Which planet is known as the red planet?"
    assert ask(a, text) == "miss"
    assert eventually(lambda: ask(b, text) == "hit", 1.5)


def test_redis_down_bypasses_then_recovers() -> None:
    with redis_server() as redis:
        policy = parse_policy(policy_text(redis.url), env={})
        with run_uvicorn(create_app(policy)) as url:
            assert ask(url, "What is the largest ocean?") == "miss"
            redis.stop()
            assert ask(url, "What is the largest ocean?") == "bypass"  # answered all the same
            redis.start()  # empty again: nothing was saved
            # Back by itself: lookups stop bypassing, and answers are stored and hit again.
            assert eventually(lambda: ask(url, "Name a mammal that flies.") != "bypass", 5.0)
            assert eventually(lambda: ask(url, "Name a mammal that flies.") == "hit", 2.0)
