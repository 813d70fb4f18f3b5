"""Keys, the admin and metrics keys, and what the admin API shows (issue 8, defects 7, 9).

The gateway runs under uvicorn with a remote tier on tests/upstream_stub.py (no model is
loaded); the engine server runs a real AsyncEngine over tests/fake_runner.py.
"""

import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from gateway.app import create_app
from gateway.cli import build_parser
from gateway.policy import PolicyError, load_policy, parse_policy
from tests.fake_runner import FakeRunner
from tests.servers import run_uvicorn, running_engine
from tests.upstream_stub import upstream_stub

KEY, HASHED_KEY, ADMIN, METRICS = "sk-plain-key-1", "sk-hashed-key-2", "sk-adm-key", "sk-prom"
HASH = hashlib.sha256(HASHED_KEY.encode()).hexdigest()
NON_ASCII = "Bearer sk-\u00e9\u00ff".encode("latin-1")  # bytes as a client may send them
HELLO = [{"role": "user", "content": "hi"}]


def policy_text(stub: str) -> str:
    return textwrap.dedent(f"""
        server: {{reload_interval_s: 0}}
        auth:
          keys: [{{key: {KEY}, tenant: plain}}, {{key_sha256: {HASH}, tenant: hashed}}]
          admin_key: {ADMIN}
          metrics_key: {METRICS}
          cache_salt_secret: do-not-show-me
        cache: {{redis_url: "redis://cacheuser:hunter2@redis-internal:6379/0"}}
        tiers:
          echo:
            deployments: [{{model: hosted_vllm/echo, api_base: "{stub}"}}]
          never_called:
            deployments:
              - {{model: hosted_vllm/x, api_base: "http://svc:pa55word@gpu-box:8000/v1?sig=s3cr3t"}}
        router_learning:
          judge: {{model: hosted_vllm/j, api_base: "http://judge:j5ecret@judge-box/v1"}}
        """)


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    with run_uvicorn(upstream_stub()) as base:
        yield f"{base}/v1"


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory, stub: str) -> Path:
    path = tmp_path_factory.mktemp("auth") / "policy.yaml"
    path.write_text(policy_text(stub))
    return path


@pytest.fixture(scope="module")
def url(policy_file: Path) -> Iterator[str]:
    with run_uvicorn(create_app(load_policy(policy_file), policy_path=policy_file)) as base:
        yield base


def bearer(key: str | bytes) -> dict[str, str | bytes]:
    return {"Authorization": key if isinstance(key, bytes) else f"Bearer {key}"}


# -------------------------------------------------------------------- policy rules


def policy_issues(auth: str, env: dict[str, str] | None = None) -> list[str]:
    text = f"{auth}\ntiers:\n  a: {{deployments: [{{model: smollm2-135m}}]}}\n"
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, env=env or {})
    return [str(i) for i in caught.value.issues]


def test_no_keys_is_refused_unless_auth_is_off_explicitly() -> None:
    no_keys = "auth: {keys: [], admin_key: sk-a}"
    assert policy_issues(no_keys)[0].startswith("auth: no keys: list at least one")
    assert policy_issues("")[0].startswith("auth: required: list keys under auth.keys")
    off = "auth: {mode: none}\ntiers:\n  a: {deployments: [{model: smollm2-135m}]}\n"
    assert parse_policy(off, env={}).auth.mode == "none"
    both = "auth: {mode: none, keys: [{key: sk-1, tenant: t}]}"
    assert policy_issues(both) == ["auth: mode none takes no keys: remove them or the mode"]


def test_empty_admin_key_is_refused() -> None:
    keys = "keys: [{key: sk-1, tenant: t}]"
    for admin in ('""', "' '", "'${TIERGATE_TEST_ADMIN}'"):
        issues = policy_issues(f"auth: {{{keys}, admin_key: {admin}}}", {"TIERGATE_TEST_ADMIN": ""})
        assert issues == [
            "auth.admin_key: must not be empty (leave the key out to disable what it guards)"
        ]


def test_env_default_applies_when_the_variable_is_empty_like_the_shell() -> None:
    text = (
        "auth: {keys: [{key: sk-1, tenant: t}], admin_key: '${TIERGATE_TEST_ADMIN:-sk-default}'}\n"
        "tiers:\n  a: {deployments: [{model: smollm2-135m}]}\n"
    )
    assert parse_policy(text, env={"TIERGATE_TEST_ADMIN": ""}).auth.admin_key == "sk-default"
    assert parse_policy(text, env={"TIERGATE_TEST_ADMIN": "sk-x"}).auth.admin_key == "sk-x"


def test_hashed_keys_are_checked() -> None:
    assert policy_issues("auth: {keys: [{key_sha256: abc, tenant: t}]}") == [
        "auth.keys[0].key_sha256: must be 64 hex digits (the output of `tiergate hash-key`)"
    ]
    both = f"auth: {{keys: [{{key: sk-1, key_sha256: {HASH}, tenant: t}}]}}"
    assert policy_issues(both) == ["auth.keys[0]: set exactly one of key and key_sha256"]


def test_hash_key_command() -> None:
    command = [sys.executable, "-m", "gateway.cli", "hash-key"]
    piped = subprocess.run(command, input=HASHED_KEY + "\n", capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stdout == HASH + "\n"
    given = subprocess.run([*command, HASHED_KEY], capture_output=True, text=True)
    assert given.stdout == HASH + "\n"
    empty = subprocess.run(command, input="\n", capture_output=True, text=True)
    assert empty.returncode == 1 and "non-empty" in empty.stderr


# --------------------------------------------------------------------------- gateway


def test_plain_and_hashed_keys_authenticate(url: str) -> None:
    for key in (KEY, HASHED_KEY):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(model="echo", messages=HELLO).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key=HASH, max_retries=0).models.list()


@pytest.mark.parametrize("path", ["/v1/models", "/admin/stats", "/admin/policy", "/metrics"])
def test_non_ascii_token_is_a_401_with_an_openai_body(url: str, path: str) -> None:
    response = httpx.get(f"{url}{path}", headers=bearer(NON_ASCII))
    assert response.status_code == 401, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics_need_the_metrics_or_admin_key(url: str) -> None:
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/metrics", headers=bearer(KEY)).status_code == 401
    for key in (METRICS, ADMIN):
        response = httpx.get(f"{url}/metrics", headers=bearer(key))
        assert response.status_code == 200 and "tiergate_" in response.text
    assert httpx.get(f"{url}/admin/stats", headers=bearer(METRICS)).status_code == 401


def test_admin_policy_redacts_credentials(url: str) -> None:
    response = httpx.get(f"{url}/admin/policy", headers=bearer(ADMIN))
    assert response.status_code == 200
    shown = response.json()["policy"]
    secrets = ("pa55word", "svc:", "s3cr3t", "hunter2", "cacheuser", "do-not-show-me", "j5ecret")
    for secret in secrets:
        assert secret not in response.text
    assert shown["tiers"]["never_called"]["deployments"][0]["api_base"] == (
        "http://***@gpu-box:8000/v1?sig=***"
    )
    assert shown["cache"]["redis_url"] == "redis://***@redis-internal:6379/0"
    assert shown["router_learning"]["judge"]["api_base"] == "http://***@judge-box/v1"
    assert shown["auth"]["keys"][1]["key_sha256"] == HASH[:8] + "..."
    assert METRICS not in response.text and KEY not in response.text


def test_reload_that_empties_the_keys_is_refused(url: str, policy_file: Path) -> None:
    good = policy_file.read_text()
    try:
        emptied = good.replace(
            f"keys: [{{key: {KEY}, tenant: plain}}, {{key_sha256: {HASH}, tenant: hashed}}]",
            "keys: []",
        )
        assert emptied != good
        policy_file.write_text(emptied)
        response = httpx.post(f"{url}/admin/policy/reload", headers=bearer(ADMIN))
        assert response.status_code == 400 and "auth: no keys" in response.text
        # Auth is still on.
        assert httpx.get(f"{url}/v1/models").status_code == 401
    finally:
        policy_file.write_text(good)


# --------------------------------------------------------------------- engine server


@pytest.fixture(scope="module")
def engine() -> Iterator[AsyncEngine]:
    with running_engine(EngineConfig(model="fake"), FakeRunner()) as engine:
        yield engine


def test_engine_server_can_require_a_key(engine: AsyncEngine) -> None:
    with run_uvicorn(create_engine_app(engine, "fake", api_key="sk-engine")) as base:
        assert httpx.get(f"{base}/health").status_code == 200  # probes need no key
        for path in ("/v1/models", "/metrics"):
            response = httpx.get(f"{base}{path}")
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{base}{path}", headers=bearer(NON_ASCII)).status_code == 401
        assert httpx.get(f"{base}/v1/models", headers=bearer("sk-engine")).status_code == 200
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-engine", max_retries=0)
        assert client.completions.create(model="fake", prompt="ab", max_tokens=3).choices
        wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="fake", prompt="ab", max_tokens=3)


def test_engine_api_key_flag_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_ENGINE_API_KEY", "sk-from-env")
    assert build_parser().parse_args(["engine", "--model", "m"]).api_key == "sk-from-env"
    args = build_parser().parse_args(["engine", "--model", "m", "--api-key", "sk-flag"])
    assert args.api_key == "sk-flag"


def test_gateway_sends_the_engine_key(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_TEST_ENGINE_KEY", "sk-engine")
    with run_uvicorn(create_engine_app(engine, "fake", api_key="sk-engine")) as base:
        text = (
            "auth: {mode: none}\ntiers:\n  t:\n    deployments:\n"
            f"      - {{model: hosted_vllm/fake, api_base: '{base}/v1', "
            "api_key_env: TIERGATE_TEST_ENGINE_KEY}\n"
        )
        app: FastAPI = create_app(parse_policy(text, env={}))
        with run_uvicorn(app) as gateway:
            client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="none", max_retries=0)
            assert client.completions.create(model="t", prompt="ab", max_tokens=3).choices
