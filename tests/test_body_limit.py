"""Request-body limit on the gateway and the engine server: 413 with an OpenAI error body,
whether the size is declared or the body comes chunked; bodies under the limit are served."""

from collections.abc import Iterator

import httpx
import pytest

from engine.config import EngineConfig
from engine.engine import AsyncEngine
from engine.entrypoints.server import create_engine_app
from gateway.app import create_app
from gateway.policy import PolicyError, parse_policy
from tests.fake_runner import FakeRunner
from tests.servers import run_uvicorn

LIMIT = 64 * 1024
POLICY = f"""
auth: {{mode: none}}
server: {{max_body_bytes: {LIMIT}}}
engines:
  fake: {{kv_cache_mb: 1}}
tiers:
  small: {{deployments: [{{model: fake}}]}}
"""


def fake_engine(config: EngineConfig) -> AsyncEngine:
    return AsyncEngine(config, FakeRunner())


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    app = create_app(parse_policy(POLICY, env={}), engine_factory=fake_engine)
    with run_uvicorn(app) as url:
        yield url


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    engine = fake_engine(EngineConfig(model="fake"))
    with run_uvicorn(create_engine_app(engine, "fake", max_body_bytes=LIMIT)) as url:
        yield url
    engine.shutdown()


def body(padding: int, model: str) -> bytes:
    # An unknown field carries the padding: clients may send vendor extras.
    return b'{"model": "%s", "prompt": "abc", "max_tokens": 2, "vendor_extra": "%s"}' % (
        model.encode(),
        b"x" * padding,
    )


def chunked(data: bytes, size: int = 8192) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("where", "model"), [("gateway", "small"), ("engine", "fake")])
def test_body_over_the_limit_is_413_and_the_server_goes_on(
    where: str, model: str, gateway_url: str, engine_url: str
) -> None:
    # Regression: there was no limit at all; a 200 MB body was read whole into memory.
    url = {"gateway": gateway_url, "engine": engine_url}[where] + "/v1/completions"
    big, json_type = body(LIMIT, model), {"content-type": "application/json"}
    assert_413(httpx.post(url, content=big, headers=json_type))
    streamed = httpx.post(url, content=chunked(big), headers=json_type)
    assert "content-length" not in streamed.request.headers  # sent chunked, size unknown
    assert_413(streamed)
    fits = httpx.post(url, content=chunked(body(LIMIT - 200, model)), headers=json_type)
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["completion_tokens"] == 2


def test_policy_refuses_a_limit_that_is_not_positive() -> None:
    with pytest.raises(PolicyError, match="max_body_bytes"):
        parse_policy(POLICY.replace(str(LIMIT), "0"), env={})
