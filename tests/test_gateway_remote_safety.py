"""Remote tiers as a hostile tenant would use them (issue 8, defects 5, 6, 8 and 9).

The upstream is tests/upstream_stub.py over real HTTP (it records what the gateway sent);
the gateway runs under uvicorn and is called with the openai client or raw httpx.
"""

import hashlib
import json
import os
from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI

from gateway.app import create_app
from gateway.backends.local import _engine_error
from gateway.policy import key_digest, parse_policy
from tests.servers import run_uvicorn
from tests.upstream_stub import LEAK, upstream_stub

KEY_A, KEY_B, ADMIN = "sk-tenant-a-key", "sk-tenant-b-key", "sk-remote-admin"
HELLO = [{"role": "user", "content": "Say hello."}]
STUB_KEY_ENV = "TIERGATE_TEST_STUB_KEY"


def policy_text(stub: str) -> str:
    def tier(model: str, client: str = "auto", extra: str = "", key: str = "") -> str:
        return (
            f"    deployments: [{{model: {model}, api_base: '{stub}', client: {client}{key}}}]\n"
            f"    retries: 0\n{extra}"
        )

    with_key = f", api_key_env: {STUB_KEY_ENV}"  # litellm's openai/ insists on a key

    slowbomb = tier(
        "hosted_vllm/slowbomb",
        extra="    timeout_s: 0.5\n    cooldown_s: 600\n    fallback: direct\n",
    )
    seedbomb = tier("hosted_vllm/seedbomb", extra="    cooldown_s: 600\n    fallback: direct\n")
    return f"""
auth:
  keys: [{{key: {KEY_A}, tenant: a}}, {{key_sha256: {key_digest(KEY_B.encode())}, tenant: b}}]
  admin_key: {ADMIN}
tiers:
  direct:
{tier("hosted_vllm/echo")}
  via_litellm:
{tier("hosted_vllm/echo", "litellm")}
  openai_api:
{tier("openai/echo")}
  openai_litellm:
{tier("openai/echo", "litellm", key=with_key)}
  badpiece:
{tier("hosted_vllm/badpiece")}
  nofinish:
{tier("hosted_vllm/nofinish")}
  nofinish_litellm:
{tier("openai/nofinish", "litellm", key=with_key)}
  leaky:
{tier("hosted_vllm/leaky500")}
  leaky_litellm:
{tier("hosted_vllm/leaky500", "litellm")}
  seedbomb:
{seedbomb}
  slowbomb:
{slowbomb}
  nokey:
    deployments: [{{model: openai/echo, api_base: '{stub}', api_key_env: TIERGATE_TEST_UNSET_VAR}}]
  rl_inf:
{tier("hosted_vllm/ratelimit-inf")}
  rl_nan:
{tier("hosted_vllm/ratelimit-nan", "litellm")}
  rl_inf_litellm:
{tier("hosted_vllm/ratelimit-inf", "litellm")}
  rl_huge:
{tier("hosted_vllm/ratelimit-1e400", "litellm")}
  rl_digits:
{tier("hosted_vllm/ratelimit-99999999999999999999999")}
  rl_superscript:
{tier("hosted_vllm/ratelimit-²")}
  rl_seven:
{tier("hosted_vllm/ratelimit-7")}
  rl_seven_litellm:
{tier("hosted_vllm/ratelimit-7", "litellm")}
"""


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[FastAPI, str]]:
    app = upstream_stub()
    with run_uvicorn(app) as base:
        yield app, f"{base}/v1"


@pytest.fixture(scope="module")
def url(stub: tuple[FastAPI, str]) -> Iterator[str]:
    app = create_app(parse_policy(policy_text(stub[1]), env={}))
    os.environ[STUB_KEY_ENV] = "sk-stub"
    try:
        with run_uvicorn(app) as base:
            yield base
    finally:
        os.environ.pop(STUB_KEY_ENV)


def client(url: str, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def last_body(stub: tuple[FastAPI, str]) -> dict:
    return stub[0].state.bodies[-1]


SALTED = pytest.mark.parametrize("tier", ["direct", "via_litellm"])


# ------------------------------------------------------------------ defect 5: cache_salt


@SALTED
def test_cache_salt_is_the_tenants_never_the_callers(
    url: str, stub: tuple[FastAPI, str], tier: str
) -> None:
    salts = {}
    for name, key in (("a", KEY_A), ("b", KEY_B), ("a2", KEY_A)):
        client(url, key).chat.completions.create(
            model=tier, messages=HELLO, extra_body={"cache_salt": "tenant-a-guess"}
        )
        salts[name] = last_body(stub).get("cache_salt")
    assert salts["a"] and salts["a"] != "tenant-a-guess"
    assert salts["a"] == salts["a2"]  # one tenant keeps its prefix cache
    assert salts["a"] != salts["b"]  # two tenants never share pages
    # Not guessable from the name alone (an HMAC with the gateway's secret).
    assert salts["a"] not in ("a", hashlib.sha256(b"a").hexdigest())


@pytest.mark.parametrize("tier", ["openai_api", "openai_litellm"])
def test_unsalted_remotes_get_no_salt_and_report_no_cached_tokens(
    url: str, stub: tuple[FastAPI, str], tier: str
) -> None:
    reply = client(url).chat.completions.create(
        model=tier, messages=HELLO, extra_body={"cache_salt": "x"}
    )
    assert "cache_salt" not in last_body(stub)
    # The upstream said 5 cached tokens; shared by every tenant, that would be a probe.
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_salted_remotes_report_cached_tokens(url: str) -> None:
    reply = client(url).chat.completions.create(model="direct", messages=HELLO)
    assert reply.usage.prompt_tokens_details.cached_tokens == 5


# --------------------------------------------------------------- defect 6: allow-list


HOSTILE = {
    "priority": -100,
    "best_of": 50,
    "prompt_logprobs": 20,
    "chat_template": "{{ raise_exception('x') }}",
    "logit_bias": {"1": 100},
}


@SALTED
def test_only_allowed_fields_are_forwarded(url: str, stub: tuple[FastAPI, str], tier: str) -> None:
    messages = [{"role": "user", "content": "hi", "refusal": None, "audio": {"id": "x"}}]
    client(url).chat.completions.create(
        model=tier,
        messages=messages,
        temperature=0.5,
        max_tokens=7,
        extra_body={**HOSTILE, "top_k": 3, "ignore_eos": True},
    )
    sent = last_body(stub)
    assert not HOSTILE.keys() & sent.keys()
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    assert (sent["temperature"], sent["max_tokens"], sent["top_k"]) == (0.5, 7, 3)
    assert sent["ignore_eos"] is True  # vLLM's own fields still reach a vLLM server


def test_vllm_fields_do_not_reach_other_providers(url: str, stub: tuple[FastAPI, str]) -> None:
    client(url).chat.completions.create(
        model="openai_api", messages=HELLO, extra_body={**HOSTILE, "top_k": 3}
    )
    sent = last_body(stub)
    assert not (HOSTILE.keys() | {"top_k", "ignore_eos"}) & sent.keys()


# ------------------------------------------------- defect 8: the request's own failures


def served_by(url: str, key: str, tier: str = "seedbomb", **extra: object) -> str:
    raw = client(url, key).chat.completions.with_raw_response.create(
        model=tier, messages=HELLO, **extra
    )
    return raw.headers["x-tiergate-model"]


def test_a_timeout_one_tenant_caused_does_not_cool_the_deployment_for_others(url: str) -> None:
    assert served_by(url, KEY_A, "slowbomb", max_tokens=5000) == "hosted_vllm/echo"
    assert served_by(url, KEY_B, "slowbomb", max_tokens=5) == "hosted_vllm/slowbomb"


def test_one_tenants_bad_request_does_not_cool_the_deployment_down_for_others(url: str) -> None:
    # Tenant a's seed makes the upstream fail: a falls back, the deployment cools for a.
    assert served_by(url, KEY_A, seed=666) == "hosted_vllm/echo"
    assert served_by(url, KEY_A) == "hosted_vllm/echo"
    # Tenant b never failed there: it is still served by the deployment itself.
    assert served_by(url, KEY_B) == "hosted_vllm/seedbomb"
    # Once a second tenant fails there too, the deployment is unwell for everyone.
    assert served_by(url, KEY_B, seed=666) == "hosted_vllm/echo"
    assert served_by(url, KEY_B) == "hosted_vllm/echo"


@pytest.mark.parametrize(
    "tier", ["rl_inf", "rl_nan", "rl_inf_litellm", "rl_huge", "rl_digits", "rl_superscript"]
)
def test_absurd_retry_after_is_a_429_not_a_500(url: str, tier: str) -> None:
    body = {"model": tier, "messages": HELLO}
    response = httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"}
    )
    assert response.status_code == 429, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    wait = response.headers.get("retry-after")
    assert wait is None or 1 <= int(wait) <= 3600


@pytest.mark.parametrize("tier", ["rl_seven", "rl_seven_litellm"])
def test_a_sane_retry_after_is_passed_on(url: str, tier: str) -> None:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": tier, "messages": HELLO},
        headers={"Authorization": f"Bearer {KEY_A}"},
    )
    assert response.status_code == 429 and response.headers["retry-after"] == "7"


def stream_events(url: str, tier: str) -> list[str]:
    body = {"model": tier, "messages": HELLO, "stream": True}
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("tier", ["badpiece", "nofinish", "nofinish_litellm"])
def test_a_broken_upstream_stream_ends_with_an_error_event(url: str, tier: str) -> None:
    events = stream_events(url, tier)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["type"] in ("server_error", "service_unavailable")
    # Not a clean "stop": no chunk claims the answer finished.
    finishes = [c["choices"][0].get("finish_reason") for c in map(json.loads, events[:-2])]
    assert "stop" not in finishes and json.loads(events[0])["choices"][0]["delta"]


def test_openai_client_sees_a_cut_stream_as_an_error(url: str) -> None:
    stream = client(url).chat.completions.create(model="nofinish", messages=HELLO, stream=True)
    with pytest.raises(openai.APIError):
        list(stream)


# ------------------------------------------------------- defect 9: what errors reveal


@pytest.mark.parametrize("tier", ["leaky", "leaky_litellm", "nokey"])
def test_error_bodies_name_what_failed_without_internals(url: str, tier: str) -> None:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": tier, "messages": HELLO},
        headers={"Authorization": f"Bearer {KEY_A}"},
    )
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert tier.startswith("nokey") or "hosted_vllm/leaky500" in message
    for secret in ("internal-db-7", "Traceback", "TIERGATE_", "127.0.0.1", "Error:", "Exception"):
        assert secret not in message, message
    assert LEAK not in response.text


def test_local_engine_errors_keep_their_text_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    error = _engine_error(RuntimeError("CUDA-less box /srv/secret/model.gguf exploded"), "small")
    assert (error.status, error.message) == (502, "small: the engine failed")
    assert "/srv/secret/model.gguf" in caplog.text
