"""Cache figures in /admin/stats, and reporting a wrong hit, through the live gateway.

Skipped only while the semantic cache (gateway/cache/semantic.py) is not in the tree.
The tier is the paid-API stand-in, so every answer's tokens and cost are known.
"""

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app, usage_of
from tests.servers import run_uvicorn

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gateway.cache.semantic") is None,
    reason="the semantic cache (gateway.cache.semantic) is not built yet",
)

KEY, ADMIN = "sk-cachestats-tenant", "sk-cachestats-admin"
PRICE = (2.0, 4.0)
MAX_TOKENS = 5
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Who wrote Hamlet?",
    "What colour is the sky on a clear day?",
    "What is the boiling point of water at sea level?",
    "Name the largest planet in the solar system.",
]


def policy_text(paid: str, path: Path) -> str:
    return f"""
auth:
  keys: [{{key: {KEY}, tenant: acme}}]
  admin_key: {ADMIN}
cache: {{enabled: true, store: embedded, path: {path}}}
tiers:
  paid:
    deployments: [{{model: openai/gpt-4o, api_base: "{paid}"}}]
    price: {{input: {PRICE[0]}, output: {PRICE[1]}}}
routes:
  auto: {{default: paid}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    path = tmp_path_factory.mktemp("cache") / "cache.sqlite3"
    paid_app = paid_api_app()
    with run_uvicorn(paid_app) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", path), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base, paid_app


def ask(url: str, text: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": text}]
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )


def admin(method: str, url: str, path: str, **kwargs: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, f"{url}{path}", headers=headers, timeout=30, **kwargs)


def cost(text: str) -> float:
    prompt, completion = usage_of([{"content": text}], MAX_TOKENS)
    return (prompt * PRICE[0] + completion * PRICE[1]) / 1e6


def test_ten_requests_with_four_repeats(gateway: tuple[str, object]) -> None:
    url, paid_app = gateway
    for text in QUESTIONS:
        assert ask(url, text).headers["x-tiergate-cache"] == "miss"
    time.sleep(0.5)  # stores run after the answers went out
    for text in QUESTIONS[:4]:
        assert ask(url, text).headers["x-tiergate-cache"] == "hit"
    assert paid_app.state.calls == 6

    w = admin("GET", url, "/admin/stats").json()["windows"]["all"]
    row = w["routes"]["auto"]
    assert (row["requests"], row["exact_hits"], row["misses"]) == (10, 4, 6)
    assert row["hit_rate"] == pytest.approx(0.4)
    assert w["tenants"]["acme"]["hit_rate"] == pytest.approx(0.4)
    saved = w["savings"]["cache"]
    assert saved["cost_usd"] == pytest.approx(sum(cost(t) for t in QUESTIONS[:4]), rel=1e-9)
    assert saved["completion_tokens"] == 4 * MAX_TOKENS
    assert w["savings"]["spent_usd"] == pytest.approx(sum(cost(t) for t in QUESTIONS), rel=1e-9)


def test_reporting_a_wrong_hit_removes_and_counts_it(gateway: tuple[str, object]) -> None:
    url, _ = gateway
    text = "What is the tallest mountain on Earth?"
    ask(url, text)
    time.sleep(0.5)
    hit = ask(url, text)
    assert hit.headers["x-tiergate-cache"] == "hit"
    entry = hit.headers["x-tiergate-cache-entry"]
    response = admin("POST", url, "/admin/cache/report", json={"entry_id": entry, "reason": "x"})
    assert response.status_code == 200
    # an exact hit: the answer was wrong, not the match, so no labelled pair is kept
    assert response.json() == {"reported": entry, "removed": True, "pair": False}
    assert ask(url, text).headers["x-tiergate-cache"] == "miss"
    again = admin("POST", url, "/admin/cache/report", json={"entry_id": entry})
    assert again.status_code == 404 and again.json()["error"]["code"] == "entry_not_found"
    w = admin("GET", url, "/admin/stats").json()["windows"]["all"]
    assert w["cache"]["wrong_hits_reported"] == 1
