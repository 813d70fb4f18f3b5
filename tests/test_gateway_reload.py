"""Hot reload: a good file takes effect, a bad one leaves the running policy and is reported."""

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.policy import load_policy
from tests.servers import run_uvicorn, wait_for

KEY, NEW_KEY, ADMIN = "sk-reload-key-1", "sk-reload-key-2", "sk-reload-admin"
POLICY = f"""
server: {{reload_interval_s: 0.1}}
auth:
  keys: [{{key: {KEY}, tenant: one}}]
  admin_key: {ADMIN}
engines:
  smollm2-135m: {{kv_cache_mb: 16, max_model_len: 512}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}]}}
  large: {{deployments: [{{model: smollm2-135m}}], fallback: small}}
routes:
  auto: {{default: small}}
"""
HELLO = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture(scope="module")
def served(policy_file: Path) -> Iterator[tuple[FastAPI, str]]:
    # No grace: a retired engine stops as soon as nothing holds it, so no test waits 5 s.
    app = create_app(load_policy(policy_file), policy_path=policy_file, retire_grace_s=0)
    with run_uvicorn(app) as base:
        yield app, base


@pytest.fixture
def url(served: tuple[FastAPI, str], policy_file: Path) -> Iterator[str]:
    yield served[1]
    write(policy_file, POLICY)  # every test starts from the original policy
    wait_for(lambda: served[0].state.gateway.runtime.policy.routes["auto"].default == "small")


# a reload that changes engine settings starts the new engine before it answers: on an
# AVX2-only 2-core CPU that took over httpx's default 5 s
CALL_TIMEOUT_S = 120.0


def write(path: Path, text: str) -> None:
    path.write_text(text)
    stamp = time.time_ns() + 1_000_000_000  # a visibly newer mtime, whatever the fs resolution
    os.utime(path, ns=(stamp, stamp))


def tier_of(url: str, key: str = KEY) -> str:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "auto", **HELLO},
        headers={"Authorization": f"Bearer {key}"},
        timeout=CALL_TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-tiergate-tier"]


def admin(url: str, method: str, path: str, key: str = ADMIN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.request(method, f"{url}{path}", headers=headers, timeout=CALL_TIMEOUT_S)


def test_file_change_is_picked_up(url: str, policy_file: Path) -> None:
    assert tier_of(url) == "small"
    changed = POLICY.replace("auto: {default: small}", "auto: {default: large}")
    changed = changed.replace("tenant: one}]", f"tenant: one}}, {{key: {NEW_KEY}, tenant: two}}]")
    write(policy_file, changed)
    wait_for(lambda: tier_of(url) == "large")
    assert tier_of(url, NEW_KEY) == "large"  # the new key works at once
    assert admin(url, "GET", "/admin/policy").json()["last_error"] is None


def test_bad_file_keeps_the_running_policy(url: str, policy_file: Path) -> None:
    bad = POLICY.replace("fallback: small", "fallback: huge").replace(
        "default: small", "default: large"
    )
    write(policy_file, bad)
    wait_for(lambda: admin(url, "GET", "/admin/policy").json()["last_error"] is not None)
    shown = admin(url, "GET", "/admin/policy").json()
    assert shown["last_error"]["issues"] == ["tiers.large.fallback: unknown tier 'huge'"]
    assert shown["policy"]["routes"]["auto"]["default"] == "small"
    assert shown["policy"]["auth"]["admin_key"] == "***"
    assert tier_of(url) == "small"
    write(policy_file, "tiers: [oops\n")
    response = admin(url, "POST", "/admin/policy/reload")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_policy"
    assert "invalid YAML at line 2, column 1" in error["message"]
    assert tier_of(url) == "small"


def test_reload_endpoint(url: str, policy_file: Path, served: tuple[FastAPI, str]) -> None:
    assert admin(url, "POST", "/admin/policy/reload", key=KEY).status_code == 403  # a tenant key
    assert httpx.post(f"{url}/admin/policy/reload").status_code == 401
    policy_file.write_text(POLICY.replace("auto: {default: small}", "auto: {default: large}"))
    response = admin(url, "POST", "/admin/policy/reload")
    assert response.status_code == 200 and response.json()["status"] == "reloaded"
    assert tier_of(url) == "large"


def test_reload_with_a_missing_model_is_refused(url: str, policy_file: Path) -> None:
    missing = POLICY.replace(
        "smollm2-135m: {kv_cache_mb", "smollm2-135m: {model: /nowhere/x.gguf, kv_cache_mb"
    ).replace("default: small", "default: large")
    policy_file.write_text(missing)
    response = admin(url, "POST", "/admin/policy/reload")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "preparing the policy failed: unknown model '/nowhere/x.gguf'" in message
    assert tier_of(url) == "small"


def reloads(url: str) -> dict[str, float]:
    """tiergate_policy_reloads_total by result (a result not seen yet has no series)."""
    metrics = admin(url, "GET", "/metrics").text
    found = re.findall(r'^tiergate_policy_reloads_total\{result="(\w+)"\} (\S+)$', metrics, re.M)
    return {"ok": 0.0, "error": 0.0} | {result: float(count) for result, count in found}


def test_reload_metrics(url: str, policy_file: Path) -> None:
    before = reloads(url)
    policy_file.write_text(POLICY.replace("auto: {default: small}", "auto: {default: large}"))
    assert admin(url, "POST", "/admin/policy/reload").status_code == 200
    assert reloads(url)["ok"] > before["ok"]
    write(policy_file, "tiers: [oops\n")
    assert admin(url, "POST", "/admin/policy/reload").status_code == 400
    assert reloads(url)["error"] > before["error"]


def test_changed_engine_settings_start_a_new_engine_and_retire_the_old(
    url: str, policy_file: Path, served: tuple[FastAPI, str]
) -> None:
    engines = served[0].state.gateway.engines
    old = engines.get("smollm2-135m")
    policy_file.write_text(POLICY.replace("kv_cache_mb: 16", "kv_cache_mb: 24"))
    assert admin(url, "POST", "/admin/policy/reload").status_code == 200
    new = engines.get("smollm2-135m")
    assert new is not old and new.is_running
    assert tier_of(url) == "small"  # served by the new engine
    wait_for(lambda: not old.is_running, 30)  # stopped once idle after the grace
