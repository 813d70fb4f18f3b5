"""Wrong-hit reports exported as labelled pairs (GET /admin/cache/reports/export), through
the live gateway with the openai client and httpx over loopback, and read back by
calibrate-cache. The tier is the paid-API stand-in; embedder and verifier are real."""

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app
from tests.servers import eventually, run_uvicorn
from training.cache.calibrate import read_pairs

KEYS = {"acme": "sk-reports-acme-0001", "other": "sk-reports-other-0001"}
ADMIN = "sk-reports-admin-0001"
STORED, REWORDED = "How do I make a budget?", "How can I create a budget?"


def policy_text(paid: str, path: Path | None = None, redis_url: str | None = None) -> str:
    keys = ", ".join(f"{{key: {k}, tenant: {t}}}" for t, k in KEYS.items())
    store = f'store: redis, redis_url: "{redis_url}"' if redis_url else f"path: {path}"
    return f"""
auth: {{keys: [{keys}], admin_key: {ADMIN}}}
cache: {{enabled: true, {store}, min_similarity: 0.5, verifier_threshold: 0.05}}
tiers:
  paid: {{deployments: [{{model: openai/gpt-4o, api_base: "{paid}"}}]}}
routes:
  auto: {{default: paid}}
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("reports") / "cache.sqlite3"
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", path), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


def ask(url: str, text: str, tenant: str = "acme"):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=3, temperature=0
    )


def stored_then_asked(url: str, stored: str, asked: str, tenant: str = "acme") -> str:
    assert ask(url, stored, tenant).headers["x-tiergate-cache"] == "miss"
    time.sleep(0.5)  # stores run after the answer went out
    hit = ask(url, asked, tenant)
    assert hit.headers["x-tiergate-cache"] == "hit"
    return hit.headers["x-tiergate-cache-entry"]


def admin(method: str, url: str, path: str, key: str = ADMIN, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.request(method, f"{url}{path}", headers=headers, timeout=30, **kw)


def export(url: str, tenant: str, fmt: str = "jsonl") -> httpx.Response:
    return admin("GET", url, f"/admin/cache/reports/export?tenant={tenant}&format={fmt}")


def test_reports_become_labelled_pairs_calibration_reads(url: str, tmp_path: Path) -> None:
    entry = stored_then_asked(url, STORED, REWORDED)
    report = {"entry_id": entry, "reason": "wanted a monthly one"}
    done = admin("POST", url, "/admin/cache/report", json=report)
    assert done.json() == {"reported": entry, "removed": True, "pair": True}
    # the client names the question itself (e.g. the hit went through another replica)
    other = stored_then_asked(url, "Who wrote Hamlet?", "who was the author of Hamlet")
    asked = "Who wrote the play Hamlet, and when?"
    done = admin("POST", url, "/admin/cache/report", json={"entry_id": other, "query": asked})
    assert done.json()["pair"] is True
    # an exact hit's report is about the answer, not the match: no pair
    exact = stored_then_asked(url, "Name a prime number", "Name a prime number")
    done = admin("POST", url, "/admin/cache/report", json={"entry_id": exact})
    assert done.json()["pair"] is False

    response = export(url, "acme")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    path = tmp_path / "wrong-hits.jsonl"
    path.write_text(response.text)
    pairs = read_pairs(path)
    assert [(p["a"], p["b"], p["should_hit"]) for p in pairs] == [
        (REWORDED, STORED, False),
        (asked, "Who wrote Hamlet?", False),
    ]
    assert pairs[0]["detail"] == "wanted a monthly one" and pairs[0]["route"] == "auto"
    assert {p["category"] for p in pairs} == {"reported"}
    assert export(url, "acme", "json").json()["data"] == pairs


def test_reports_stay_with_their_tenant(url: str) -> None:
    entry = stored_then_asked(url, STORED, REWORDED, tenant="other")
    admin("POST", url, "/admin/cache/report", json={"entry_id": entry})
    theirs = export(url, "other").text.splitlines()
    assert len(theirs) == 1 and json.loads(theirs[0])["a"] == REWORDED
    assert export(url, "nobody").text == ""  # a tenant with no reports: an empty file


@pytest.mark.parametrize(
    ("query", "status", "param"),
    [("format=jsonl", 400, "tenant"), ("tenant=acme&format=csv", 400, "format")],
)
def test_bad_export_requests_get_openai_errors(
    url: str, query: str, status: int, param: str
) -> None:
    response = admin("GET", url, f"/admin/cache/reports/export?{query}")
    assert response.status_code == status
    assert response.json()["error"]["param"] == param


def test_export_needs_the_admin_key(url: str) -> None:
    path = "/admin/cache/reports/export?tenant=acme"
    tenant = admin("GET", url, path, key=KEYS["acme"])
    assert tenant.status_code == 403 and "admin key" in tenant.json()["error"]["message"]
    assert admin("GET", url, path, key="sk-wrong").status_code == 401


def test_a_report_with_a_bad_query_field_is_a_400(url: str) -> None:
    response = admin("POST", url, "/admin/cache/report", json={"entry_id": "x", "query": ""})
    assert response.status_code == 400 and "error" in response.json()


def test_replicas_on_one_redis_share_the_reports(redis_url: str) -> None:
    """A hit through one replica reported through another: that one never saw the question,
    so the report names it (`query`); the pair is then in every replica's export."""
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", redis_url=redis_url), env={})
        with run_uvicorn(create_app(policy)) as a, run_uvicorn(create_app(policy)) as b:
            assert ask(a, STORED).headers["x-tiergate-cache"] == "miss"
            assert eventually(lambda: ask(a, REWORDED).headers["x-tiergate-cache"] == "hit", 2)
            entry = ask(a, REWORDED).headers["x-tiergate-cache-entry"]
            assert eventually(lambda: ask(b, STORED).headers["x-tiergate-cache"] == "hit", 2)
            unnamed = admin("POST", b, "/admin/cache/report", json={"entry_id": entry})
            assert unnamed.json() == {"reported": entry, "removed": True, "pair": False}
            assert ask(a, STORED).headers["x-tiergate-cache"] == "miss"  # gone everywhere
            assert eventually(lambda: ask(a, REWORDED).headers["x-tiergate-cache"] == "hit", 2)
            entry = ask(a, REWORDED).headers["x-tiergate-cache-entry"]
            assert eventually(lambda: ask(b, STORED).headers["x-tiergate-cache"] == "hit", 2)
            named = {"entry_id": entry, "query": REWORDED}
            assert admin("POST", b, "/admin/cache/report", json=named).json()["pair"] is True
            lines = export(a, "acme").text.splitlines()
            assert [(p["a"], p["b"]) for p in map(json.loads, lines)] == [(REWORDED, STORED)]
