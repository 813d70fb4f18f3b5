"""Gateway replicas on one real Redis share their stats and their policy reloads.

Two live gateways (real HTTP, the openai client) in front of an OpenAI-shaped stub; the
Redis is a real redis-server that the tests stop and start.
"""

import asyncio
import contextlib
import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.policy import PolicyError, load_policy
from gateway.replicas import Fleet
from gateway.replicas.fleet import policy_sha256
from gateway.replicas.signing import SECRET_ENV, sign
from gateway.stats.table import render
from tests.servers import RedisServer, eventually, free_port, redis_server, run_uvicorn
from tests.upstream_stub import upstream_stub

KEY, ADMIN = "sk-fleet-1", "sk-fleet-admin"
PREFIX = "fleet-test"
SECRET = "fleet-test-policy-secret"


def policy_text(redis_url: str, stub: str, extra_tier: str = "") -> str:
    return f"""
server: {{redis_url: "{redis_url}", reload_interval_s: 0}}
auth:
  keys: [{{key: {KEY}, tenant: acme}}]
  admin_key: {ADMIN}
cache: {{redis_prefix: {PREFIX}}}
tiers:
  stub: {{deployments: [{{model: hosted_vllm/echo, api_base: "{stub}/v1"}}]}}
{extra_tier}
"""


@dataclass
class Replica:
    name: str
    url: str
    policy_file: Path

    def ask(self, n: int = 1) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0)
        for i in range(n):
            reply = client.chat.completions.create(
                model="stub", messages=[{"role": "user", "content": f"q{i}"}]
            )
            assert reply.choices[0].message.content == "stub answer"

    def admin(self, method: str, path: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {ADMIN}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30)

    def stats(self) -> dict:
        response = self.admin("GET", "/admin/stats")
        assert response.status_code == 200, response.text
        return response.json()

    def models(self) -> set[str]:
        response = httpx.get(f"{self.url}/v1/models", headers={"authorization": f"Bearer {KEY}"})
        return {m["id"] for m in response.json()["data"]}

    def metric(self, name: str, **labels: str) -> float:
        text = self.admin("GET", "/metrics").text
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        )


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def stub() -> Iterator[str]:
    with run_uvicorn(upstream_stub()) as url:
        yield url


@contextlib.contextmanager
def replica(name: str, tmp_path: Path, text: str) -> Iterator[Replica]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    with run_uvicorn(create_app(load_policy(path), policy_path=path, replica=name)) as url:
        yield Replica(name, url, path)


@pytest.fixture
def pair(
    redis: RedisServer, stub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Replica, Replica]]:
    monkeypatch.setenv(SECRET_ENV, SECRET)  # each replica reads it at start
    text = policy_text(redis.url, stub)
    with replica("a", tmp_path, text) as a, replica("b", tmp_path, text) as b:
        yield a, b


def requests_by_replica(stats: dict) -> dict[str, int]:
    return {rid: r["windows"]["all"]["requests"] for rid, r in stats["replicas"].items()}


def test_admin_stats_on_any_replica_sums_the_fleet_and_shows_each(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    a.ask(3)
    b.ask(2)

    def fleet_seen(r: Replica) -> bool:
        return requests_by_replica(r.stats()) == {"a": 3, "b": 2}

    assert eventually(lambda: fleet_seen(a) and fleet_seen(b), 10)
    for r in pair:
        stats = r.stats()
        assert stats["replica"] == r.name
        assert stats["fleet"] == {"shared": True, "error": None, "replicas": 2}
        for name in ("1m", "1h", "all"):
            window = stats["windows"][name]
            assert window["requests"] == 5
            assert window["tiers"]["stub"]["requests"] == 5
            assert window["tiers"]["stub"]["prompt_tokens"] == 5 * 7  # the stub's usage
    shown = render(a.stats(), "all")  # what `tiergate stats` prints
    assert [line.split()[:2] for line in shown.splitlines()[-2:]] == [["a", "3"], ["b", "2"]]
    # /metrics stays this process's own: Prometheus adds the replicas up.
    assert a.metric("tiergate_tenant_requests_total", tenant="acme") == 3
    assert b.metric("tiergate_tenant_requests_total", tenant="acme") == 2


def test_redis_down_leaves_each_replica_its_own_stats_flagged(
    pair: tuple[Replica, Replica], redis: RedisServer
) -> None:
    a, b = pair
    a.ask(2)
    b.ask(1)
    assert eventually(lambda: a.stats()["windows"]["all"]["requests"] == 3, 10)
    redis.stop()
    stats = a.stats()  # still a 200, this replica's figures, flagged
    assert stats["fleet"]["shared"] is False and "unreachable" in stats["fleet"]["error"]
    assert stats["windows"]["all"]["requests"] == 2
    assert requests_by_replica(stats) == {"a": 2}
    a.ask(1)  # requests are unaffected
    reloaded = a.admin("POST", "/admin/policy/reload")  # applies here, shared with no one
    assert reloaded.status_code == 200 and reloaded.json()["shared"] is False
    # A report nobody can read (another version, a stray write) is skipped, not a 500.
    redis.start()
    fleet = Fleet(redis.url, f"{PREFIX}:replicas")

    async def garble() -> None:
        await fleet._redis.set(fleet._stats_key("z"), b"not json", ex=60)
        await fleet._redis.zadd(fleet._members, {"z": 1.0})
        await fleet.close()

    asyncio.run(garble())
    assert a.stats()["fleet"]["shared"] is True
    # The Redis came back empty: each replica publishes again by itself.
    assert eventually(lambda: requests_by_replica(a.stats()) == {"a": 3, "b": 1}, 10)
    assert a.stats()["fleet"]["shared"] is True


def test_a_replica_that_stops_leaves_the_fleet_figures(
    redis: RedisServer, stub: str, tmp_path: Path
) -> None:
    text = policy_text(redis.url, stub)
    with replica("a", tmp_path, text) as a:
        with replica("b", tmp_path, text) as b:
            b.ask(2)
            assert eventually(lambda: a.stats()["fleet"]["replicas"] == 2, 10)
        assert requests_by_replica(a.stats()) == {"a": 0}


def test_a_reload_on_one_replica_reaches_the_others(
    pair: tuple[Replica, Replica], redis: RedisServer, stub: str
) -> None:
    a, b = pair
    assert "extra" not in b.models()
    extra = f'  extra: {{deployments: [{{model: hosted_vllm/echo, api_base: "{stub}/v1"}}]}}'
    a.policy_file.write_text(policy_text(redis.url, stub, extra))
    reloaded = a.admin("POST", "/admin/policy/reload")
    assert reloaded.status_code == 200 and reloaded.json()["shared"] is True
    assert "extra" in a.models()
    assert eventually(lambda: "extra" in b.models(), 10)  # b's own file never changed
    assert b.metric("tiergate_policy_reloads_total", result="ok") == 1

    # An invalid edit is refused where it is made, so it never reaches the others.
    a.policy_file.write_text(policy_text(redis.url, stub, "  broken: {deployments: []}"))
    refused = a.admin("POST", "/admin/policy/reload")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_policy"
    assert "extra" in a.models() and "extra" in b.models()
    assert b.admin("GET", "/admin/policy").json()["last_error"] is None


def test_a_shared_policy_this_replica_cannot_use_is_refused_and_the_old_one_serves(
    pair: tuple[Replica, Replica], redis: RedisServer, stub: str
) -> None:
    """Shared text goes through the same checks as the file: e.g. a replica whose
    environment lacks a variable the policy reads refuses it and keeps serving."""
    needs_env = policy_text(redis.url, stub).replace(KEY, '"${FLEET_TEST_UNSET_KEY}"')
    fleet = Fleet(redis.url, f"{PREFIX}:replicas")

    async def publish() -> None:
        await fleet.publish_policy(needs_env, "c", sign(SECRET.encode(), needs_env))
        await fleet.close()

    asyncio.run(publish())
    for r in pair:
        assert eventually(lambda r=r: r.metric("tiergate_policy_reloads_total", result="error"), 10)
        error = r.admin("GET", "/admin/policy").json()["last_error"]
        assert "FLEET_TEST_UNSET_KEY is not set" in " ".join(error["issues"])
        r.ask(1)  # the running policy, key and all, still serves


def test_a_redis_down_at_start_is_no_error_and_its_password_is_never_shown(
    stub: str, tmp_path: Path
) -> None:
    unreachable = f"redis://fleet:hunter2@127.0.0.1:{free_port()}/0"
    with replica("a", tmp_path, policy_text(unreachable, stub)) as a:
        a.ask(2)
        stats = a.stats()
        assert stats["fleet"]["shared"] is False and stats["fleet"]["error"]
        assert requests_by_replica(stats) == {"a": 2}
        shown = a.admin("GET", "/admin/policy").json()["policy"]["server"]["redis_url"]
        assert "hunter2" not in shown and shown.startswith("redis://***@127.0.0.1:")
        reloaded = a.admin("POST", "/admin/policy/reload")
        assert reloaded.status_code == 200 and reloaded.json()["shared"] is False


def test_server_redis_url_must_name_a_redis(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(policy_text("http://127.0.0.1:6379", "http://127.0.0.1:9"))
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert "server.redis_url: must start with redis://" in str(error.value)


def refusals(r: Replica) -> float:
    return r.metric("tiergate_policy_reloads_total", result="error")


def write_shared_policy(redis: RedisServer, text: str, signature: str | None) -> None:
    """What anyone with write access to the Redis can do, without going through a replica."""
    fields = {"sha256": policy_sha256(text), "origin": "mallory", "text": text}
    if signature is not None:
        fields["signature"] = signature

    async def write() -> None:
        client = Redis.from_url(redis.url)
        await client.hincrby(f"{PREFIX}:replicas:policy", "version", 1)
        await client.hset(f"{PREFIX}:replicas:policy", mapping=fields)
        await client.aclose()

    asyncio.run(write())


def test_a_forged_policy_written_into_redis_is_refused_and_a_signed_one_applied(
    pair: tuple[Replica, Replica], redis: RedisServer, stub: str
) -> None:
    """Issue 29.13: a shared policy is applied only with the fleet secret's signature."""
    open_door = policy_text(redis.url, stub).replace(
        f"keys: [{{key: {KEY}, tenant: acme}}]", "mode: none"
    )
    assert "mode: none" in open_door
    for attempt, signature in enumerate([None, "0" * 64, sign(b"another secret", open_door)]):
        write_shared_policy(redis, open_door, signature)
        for r in pair:
            assert eventually(lambda r=r, n=attempt + 1: refusals(r) == n, 10)
            error = r.admin("GET", "/admin/policy").json()["last_error"]
            assert "signature is missing or not made with" in " ".join(error["issues"])
            assert httpx.get(f"{r.url}/v1/models").status_code == 401  # keys still required

    extra = f'  extra: {{deployments: [{{model: hosted_vllm/echo, api_base: "{stub}/v1"}}]}}'
    signed = policy_text(redis.url, stub, extra)
    digest = hmac.new(SECRET.encode(), signed.encode(), hashlib.sha256).hexdigest()
    write_shared_policy(redis, signed, digest)
    for r in pair:
        assert eventually(lambda r=r: "extra" in r.models(), 10)
        assert r.admin("GET", "/admin/policy").json()["last_error"] is None


def test_without_the_secret_reloads_are_neither_shared_nor_applied(
    redis: RedisServer, stub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    text = policy_text(redis.url, stub)
    with replica("a", tmp_path, text) as a, replica("b", tmp_path, text) as b:
        extra = f'  extra: {{deployments: [{{model: hosted_vllm/echo, api_base: "{stub}/v1"}}]}}'
        a.policy_file.write_text(policy_text(redis.url, stub, extra))
        reloaded = a.admin("POST", "/admin/policy/reload")
        assert reloaded.status_code == 200 and reloaded.json()["shared"] is False
        assert "extra" in a.models()
        signed = policy_text(redis.url, stub, extra)
        write_shared_policy(redis, signed, sign(SECRET.encode(), signed))
        assert eventually(lambda: refusals(b) == 1, 10)
        error = b.admin("GET", "/admin/policy").json()["last_error"]
        assert f"has no {SECRET_ENV}" in " ".join(error["issues"])
        assert "extra" not in b.models()
