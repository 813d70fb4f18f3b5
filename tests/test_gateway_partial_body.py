"""A client that leaves while its request body is still arriving (found by the soak): the
gateway counts a 499 and goes on serving; no unhandled exception reaches the ASGI server.
The tier is the paid-API stand-in, so nothing loads a model."""

import logging
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app
from tests.servers import eventually, run_uvicorn

KEY, ADMIN = "sk-partial-body", "sk-partial-admin"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(
            f"""
auth: {{keys: [{{key: {KEY}, tenant: acme}}], admin_key: {ADMIN}}}
cache: {{enabled: false}}
tiers:
  cheap: {{deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}/v1"}}]}}
routes:
  auto: {{default: cheap}}
""",
            env={},
        )
        with run_uvicorn(create_app(policy)) as base:
            yield base


def _leave_mid_body(url: str) -> None:
    """Headers that promise 1,000 bytes, a few of them, then the connection closed."""
    parts = urlsplit(url)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: {parts.hostname}\r\n"
        f"Authorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(head.encode() + b'{"model": "auto", "messages": [')


def _closed_requests(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tiergate_requests_total{") and 'status="499"' in line
    )


def test_a_client_gone_mid_body_is_a_499_and_the_gateway_serves_on(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        _leave_mid_body(url)
        assert eventually(lambda: _closed_requests(url) >= 1, 10), "no 499 counted"
    crashes = [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    assert crashes == [], "a client gone mid-body reached the ASGI server as an exception"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "still there?"}], max_tokens=4
    )
    assert reply.choices[0].message.content
