"""Managed keys over /admin/keys: created (the key shown once, its hash stored), used with
the openai client, listed without secrets, revoked (at once on another replica sharing the
Redis), expired; their allowed models, limits and budget enforced; bad input refused."""

import sqlite3
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.policy import key_digest, parse_policy
from tests.limits_helpers import fake_engine
from tests.servers import free_port, run_uvicorn
from tests.spend_helpers import ADMIN, ALICE, admin, client, complete, gateway, spend_samples


def sqlite_gateway(tmp_path: Path, extra: str = "", delay: float = 0.0):
    """The spend gateway with managed keys in an SQLite file of the test's own."""
    return gateway(extra, delay, managed_keys_path=str(tmp_path / "keys.sqlite3"))


def create(url: str, **body: object) -> dict:
    reply = admin(url).post("/admin/keys", json={"tenant": "three", "name": "ci", **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    body = reply.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


def test_create_use_list_show_revoke(tmp_path: Path) -> None:
    with sqlite_gateway(tmp_path) as url:
        made = create(url, name="ci-bot")
        key = made["key"]
        assert key.startswith("tg-") and len(key) > 40
        assert made["id"].startswith("key_") and made["tenant"] == "three"
        cost = complete(url, key, "chat")
        listed = admin(url).get("/admin/keys").json()
        shown = admin(url).get(f"/admin/keys/{made['id']}").json()
        gone = admin(url).delete(f"/admin/keys/{made['id']}")
        with pytest.raises(openai.AuthenticationError):
            complete(url, key)
        again = admin(url).delete(f"/admin/keys/{made['id']}")
        samples = spend_samples(url)
    assert [k["id"] for k in listed["data"]] == [made["id"]]
    for entry in (listed["data"][0], shown):  # never the key, nor its hash
        assert "key" not in entry and "digest" not in entry and key not in str(entry)
        assert entry["name"] == "ci-bot" and entry["expired"] is False
    assert gone.json() == {"object": "api_key.deleted", "id": made["id"], "deleted": True}
    assert error_of(again, 404)["code"] == "key_not_found"
    assert samples == {("three", made["id"], "chat"): pytest.approx(cost)}  # its id labels it
    stored = sqlite3.connect(tmp_path / "keys.sqlite3").execute("SELECT * FROM keys").fetchall()
    assert stored == []  # revoked: nothing left
    assert key not in (tmp_path / "keys.sqlite3").read_bytes().decode("latin-1")


def test_only_the_hash_is_stored(tmp_path: Path) -> None:
    with sqlite_gateway(tmp_path) as url:
        made = create(url)
    raw = (tmp_path / "keys.sqlite3").read_bytes().decode("latin-1")
    assert made["key"] not in raw and key_digest(made["key"].encode()) in raw


def test_expired_key_is_refused(tmp_path: Path) -> None:
    with sqlite_gateway(tmp_path) as url:
        made = create(url, expires_at=time.time() + 1.5)
        complete(url, made["key"])
        time.sleep(max(0.0, made["expires_at"] - time.time()) + 0.1)
        with pytest.raises(openai.AuthenticationError) as caught:
            complete(url, made["key"])
        listed = admin(url).get("/admin/keys").json()["data"]
    assert "expired" in caught.value.message
    assert caught.value.response.json()["error"]["code"] == "invalid_api_key"
    assert listed[0]["expired"] is True


def test_allowed_models_limits_and_budget_of_a_key(tmp_path: Path) -> None:
    with sqlite_gateway(tmp_path) as url:
        narrow = create(url, allowed_models=["small"], limits={"requests_per_minute": 2})
        complete(url, narrow["key"], "small")
        with pytest.raises(openai.NotFoundError) as denied:
            complete(url, narrow["key"], "chat")
        models = {m.id for m in client(url, narrow["key"]).models.list().data}
        complete(url, narrow["key"], "small")
        with pytest.raises(openai.RateLimitError) as limited:
            complete(url, narrow["key"], "small")
        capped = create(url, budget={"usd_per_day": 5})
        complete(url, capped["key"])  # $5 or more: the budget is spent
        with pytest.raises(openai.RateLimitError) as broke:
            complete(url, capped["key"])
        shown = admin(url).get(f"/admin/keys/{capped['id']}").json()
    assert denied.value.response.json()["error"]["code"] == "model_not_found"
    assert models == {"small"}
    assert limited.value.response.json()["error"]["code"] == "requests_per_minute"
    error = broke.value.response.json()["error"]
    assert error["code"] == "budget_exceeded" and f"API key '{capped['id']}'" in error["message"]
    assert shown["spent_usd"]["day"] >= 5


def test_bad_input_and_who_may_manage_keys(tmp_path: Path) -> None:
    with sqlite_gateway(tmp_path) as url:
        bad = {
            "missing tenant": {"name": "x"},
            "blank name": {"tenant": "t", "name": "  "},
            "unknown field": {"tenant": "t", "name": "x", "owner": "me"},
            "past expiry": {"tenant": "t", "name": "x", "expires_at": time.time() - 10},
            "unknown model": {"tenant": "t", "name": "x", "allowed_models": ["gpt-9"]},
            "bad limit": {"tenant": "t", "name": "x", "limits": {"requests_per_minute": 0}},
            "bad budget": {"tenant": "t", "name": "x", "budget": {"usd_per_day": -1}},
        }
        answers = {why: admin(url).post("/admin/keys", json=body) for why, body in bad.items()}
        not_json = admin(url).post("/admin/keys", content=b"{not json")
        as_tenant = httpx.post(
            f"{url}/admin/keys",
            json={"tenant": "t", "name": "x"},
            headers={"Authorization": f"Bearer {ALICE}"},
        )
        anonymous = httpx.get(f"{url}/admin/keys")
        made = create(url)
        manages = httpx.get(f"{url}/admin/keys", headers={"Authorization": f"Bearer {made['key']}"})
        unknown = admin(url).delete("/admin/keys/key_nope")
        listed = admin(url).get("/admin/keys").json()["data"]
    for why, reply in answers.items():
        assert error_of(reply, 400)["message"], why
    assert error_of(answers["unknown model"], 400)["param"] == "allowed_models"
    error_of(not_json, 400)
    error_of(as_tenant, 403)
    error_of(anonymous, 401)
    error_of(manages, 403)  # a managed key is a tenant's key, not an admin's
    error_of(unknown, 404)
    assert [k["id"] for k in listed] == [made["id"]]  # nothing made by the bad requests


def test_revoked_on_one_replica_is_refused_on_another_at_once(redis_url: str) -> None:
    extra = f"limits: {{redis_url: '{redis_url}'}}\n"
    with gateway(extra) as a, gateway(extra) as b:
        made = create(a, tenant="shared")
        complete(b, made["key"])  # made on a, used on b
        assert made["id"] in {k["id"] for k in admin(b).get("/admin/keys").json()["data"]}
        admin(a).delete(f"/admin/keys/{made['id']}").raise_for_status()
        with pytest.raises(openai.AuthenticationError):
            complete(b, made["key"])
        complete(b, ALICE)  # the policy's keys keep working


def test_key_store_down_refuses_managed_keys_but_not_the_policys() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with gateway(f"limits: {{redis_url: '{dead}'}}\n") as url:
        reply = httpx.post(
            f"{url}/v1/completions",
            json={"model": "small", "prompt": "hi", "max_tokens": 2},
            headers={"Authorization": "Bearer tg-shaped-like-a-managed-key"},
        )
        made = admin(url).post("/admin/keys", json={"tenant": "t", "name": "x"})
        with pytest.raises(openai.AuthenticationError):  # no managed key looks like this
            complete(url, "sk-some-other-key")
        complete(url, ALICE)
    assert error_of(reply, 503)["type"] == "server_error"
    assert error_of(made, 503)["message"].startswith("The key store is unavailable")
    assert "127.0.0.1" not in reply.text + made.text  # where the store is stays in the log


def test_no_keys_can_be_made_when_auth_is_off() -> None:
    policy = parse_policy(
        f"auth: {{mode: none, admin_key: {ADMIN}}}\nengines: {{fake: {{}}}}\n"
        "tiers: {small: {deployments: [{model: fake}]}}\n",
        env={},
    )
    with run_uvicorn(create_app(policy, engine_factory=fake_engine())) as url:
        reply = admin(url).post("/admin/keys", json={"tenant": "t", "name": "x"})
    assert "auth.mode is none" in error_of(reply, 400)["message"]
