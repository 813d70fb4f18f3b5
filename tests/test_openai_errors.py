"""The HTTP kit's errors, which the engine server and the gateway both install: every error
leaves as OpenAI's body with its status, a bug's text never reaches the client, and each
engine error has one status and code."""

from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from engine.entrypoints.openai.errors import (
    OpenAIError,
    engine_error,
    engine_error_status,
    install_error_handlers,
)
from engine.errors import (
    EngineDeadError,
    EngineError,
    InvalidParamError,
    PromptTooLongError,
    QueueFullError,
    RequestFailedError,
    TenantQueueFullError,
)
from tests.servers import run_uvicorn


class Body(BaseModel):
    n: int


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError("secret: /srv/keys.txt")

    @app.get("/refused")
    async def refused() -> None:
        raise OpenAIError(429, "slow down", code="queue_full", headers={"Retry-After": "1"})

    @app.post("/typed")
    async def typed(body: Body) -> dict:
        return {"n": body.n}

    with run_uvicorn(app) as base:
        yield base


def test_a_bug_is_a_500_body_without_its_text(url: str) -> None:
    response = httpx.get(f"{url}/bug")
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "Internal server error.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "secret" not in response.text


def test_raised_error_keeps_status_code_and_headers(url: str) -> None:
    response = httpx.get(f"{url}/refused")
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["type"], error["code"], error["message"]) == (
        "rate_limit_error",
        "queue_full",
        "slow down",
    )


def test_bad_body_is_400_naming_the_field_and_unknown_routes_keep_their_status(
    url: str,
) -> None:
    bad = httpx.post(f"{url}/typed", json={"n": "many"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    assert httpx.post(f"{url}/typed", json={"n": 3}).json() == {"n": 3}
    missing = httpx.get(f"{url}/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "Not Found"
    wrong = httpx.get(f"{url}/typed")
    assert wrong.status_code == 405 and "allow" in wrong.headers
    assert wrong.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (PromptTooLongError("too long"), 400, "context_length_exceeded"),
        (QueueFullError(), 429, "queue_full"),
        (TenantQueueFullError("tenant t"), 429, "queue_full"),
        (EngineDeadError(), 503, "engine_dead"),
        (RequestFailedError("boom"), 500, "request_failed"),
    ],
)
def test_each_engine_error_has_one_status_and_code(
    exc: EngineError, status: int, code: str
) -> None:
    assert engine_error_status(exc) == (status, code)
    error = engine_error(exc, "prompt")
    assert (error.status, error.code) == (status, code)
    assert "boom" not in error.message  # a failed request's cause stays in the log
    assert ("Retry-After" in error.headers) == (status == 429)


def test_the_request_s_own_faults_are_400_on_the_field() -> None:
    assert engine_error_status(EngineError("new kind")) is None
    assert engine_error(EngineError("new kind")).status == 500
    bad_id = engine_error(InvalidParamError("prompt[3]", "token id 99999 out of range"))
    assert (bad_id.status, bad_id.param) == (400, "prompt[3]")
    empty = engine_error(ValueError("empty prompt"), "prompt")
    assert (empty.status, empty.param, empty.message) == (400, "prompt", "empty prompt")
