"""GET /admin/stats and /metrics against a scripted workload, over real HTTP.

A local tier runs the real small model; the remote tiers are a stand-in for a paid API
(tests/paid_api.py) whose token counts follow from the request. Every count, token and
cost in /admin/stats must match what the clients saw, in every window.
"""

import hashlib
import importlib.util
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.cli import main
from gateway.policy import parse_policy
from tests.paid_api import paid_api_app
from tests.servers import free_port, run_uvicorn

ONE, TWO, ADMIN = "sk-stats-tenant-one", "sk-stats-tenant-two", "sk-stats-admin-key"
SMALL_PRICE = (0.5, 1.5)  # USD per 1M input / output tokens, from the policy
PREMIUM_PRICE = (30.0, 60.0)  # the most expensive tier: the router's baseline
HELLO = [{"role": "user", "content": "Say hello."}]
CODE = [{"role": "user", "content": "```python\nprint(1)\n```\nWhat does this print?"}]


def policy_text(paid: str, down: str) -> str:
    return f"""
auth:
  keys: [{{key: {ONE}, tenant: one}}, {{key: {TWO}, tenant: two}}]
  admin_key: {ADMIN}
engines:
  smollm2-135m: {{kv_cache_mb: 32, max_num_seqs: 8, max_model_len: 1024, num_threads: 1}}
tiers:
  small:
    deployments: [{{model: smollm2-135m}}]
    price: {{input: {SMALL_PRICE[0]}, output: {SMALL_PRICE[1]}}}
  large:  # no price: litellm's offline price map prices gpt-4o-mini
    deployments: [{{model: openai/gpt-4o-mini, api_base: "{paid}"}}]
  premium:
    deployments: [{{model: openai/gpt-4o, api_base: "{paid}"}}]
    price: {{input: {PREMIUM_PRICE[0]}, output: {PREMIUM_PRICE[1]}}}
  flaky:
    deployments: [{{model: openai/gone, api_base: "{down}"}}]
    retries: 0
    cooldown_s: 60
    fallback: large
routes:
  auto:
    rules: [{{tier: large, contains_code: true}}]
    default: small
"""


def litellm_map_price(model: str) -> tuple[float, float]:
    """Read straight from the installed litellm's file: the expectation, not the code."""
    spec = importlib.util.find_spec("litellm")
    path = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
    entry = json.loads(path.read_text())[model]
    return entry["input_cost_per_token"] * 1e6, entry["output_cost_per_token"] * 1e6


@pytest.fixture(scope="module")
def url(one_torch_thread: None) -> Iterator[str]:
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    with run_uvicorn(paid_api_app()) as paid:
        policy = parse_policy(policy_text(f"{paid}/v1", down), env={})
        with run_uvicorn(create_app(policy)) as base:
            yield base


def ask(url: str, key: str, model: str, messages: list[dict], max_tokens: int = 3):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0
    )


def admin_get(url: str, path: str, key: str | None = ADMIN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}{path}", headers=headers, timeout=30)


@pytest.fixture(scope="module")
def workload(url: str) -> dict:
    """Scripted requests; returns what the clients saw, per (tier, model)."""
    seen: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    script = [(ONE, "auto", HELLO)] * 3 + [(ONE, "auto", CODE)]
    script += [(TWO, "large", HELLO)] * 2 + [(TWO, "premium", CODE)] * 2
    script += [(TWO, "small", HELLO), (TWO, "flaky", HELLO)]
    for i, (key, model, messages) in enumerate(script):
        raw = ask(url, key, model, messages, max_tokens=2 + i % 3)
        usage = raw.parse().usage
        row = seen[raw.headers["x-tiergate-tier"], raw.headers["x-tiergate-model"]]
        row[0] += 1
        row[1] += usage.prompt_tokens
        row[2] += usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        ask(url, TWO, "no-such-model", HELLO)
    return dict(seen)


def expected_cost(tier: str, prompt: int, completion: int) -> float:
    prices = {
        "small": SMALL_PRICE,
        "large": litellm_map_price("gpt-4o-mini"),
        "premium": PREMIUM_PRICE,
    }
    price_in, price_out = prices[tier]
    return (prompt * price_in + completion * price_out) / 1e6


@pytest.mark.parametrize("window", ["1m", "1h", "all"])
def test_stats_match_the_workload(url: str, workload: dict, window: str) -> None:
    stats = admin_get(url, "/admin/stats").json()
    w = stats["windows"][window]
    assert set(workload) == {
        ("small", "smollm2-135m"),
        ("large", "openai/gpt-4o-mini"),
        ("premium", "openai/gpt-4o"),
    }
    assert workload["large", "openai/gpt-4o-mini"][0] == 4  # code, two direct, the fallback
    spent = 0.0
    for (tier, model), (requests, prompt, completion) in workload.items():
        row = w["tiers"][tier]["models"][model]
        cost = expected_cost(tier, prompt, completion)
        spent += cost
        assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
            requests,
            prompt,
            completion,
        )
        assert row["errors"] == 0
        assert row["cost_usd"] == pytest.approx(cost, rel=1e-9)
        assert w["tiers"][tier]["latency_s"]["p50"] > 0
        assert w["tiers"][tier]["ttft_s"]["p99"] > 0
    refused = w["tiers"]["-"]["models"]["-"]  # the unknown model: refused before any tier
    assert (refused["requests"], refused["errors"]) == (1, 1)
    # The flaky tier failed once, cooled down, and its request fell back to `large`.
    gone = w["tiers"]["flaky"]["models"]["openai/gone"]
    assert (gone["requests"], gone["failed_attempts"], gone["cooldowns"]) == (0, 1, 1)
    assert w["tiers"]["flaky"]["fallbacks_out"] == 1
    assert w["tiers"]["large"]["fallbacks_in"] == 1

    prompt = sum(v[1] for v in workload.values())
    completion = sum(v[2] for v in workload.values())
    baseline = (prompt * PREMIUM_PRICE[0] + completion * PREMIUM_PRICE[1]) / 1e6
    savings = w["savings"]
    assert savings["spent_usd"] == pytest.approx(spent, rel=1e-9)
    assert savings["router"]["baseline_tier"] == "premium"
    assert savings["router"]["baseline_cost_usd"] == pytest.approx(baseline, rel=1e-9)
    assert savings["router"]["cost_usd"] == pytest.approx(baseline - spent, rel=1e-9)
    assert savings["cache"] == {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}

    no_cache = dict.fromkeys(("exact_hits", "semantic_hits", "misses", "bypasses"), 0)
    no_cache |= {"verifier_refusals": 0, "hit_rate": None}
    assert w["route_tenants"] == [
        {"route": "-", "tenant": "two", "requests": 7, **no_cache},  # 6 answered, one 404
        {"route": "auto", "tenant": "one", "requests": 4, **no_cache},
    ]
    assert w["tenants"]["two"]["requests"] == 7 and w["routes"]["auto"]["requests"] == 4
    assert w["requests"] == 11


def test_stats_show_engines_and_series(url: str, workload: dict) -> None:
    stats = admin_get(url, "/admin/stats").json()
    engine = stats["engines"]["smollm2-135m"]
    assert engine["running"] == 0 and engine["waiting"] == 0
    assert 0 <= engine["kv_cache_usage_perc"] <= 1
    (counters,) = stats["windows"]["all"]["engines"].values()
    assert counters["prefix_cache_queries"] > 0 and counters["preemptions"] == 0
    assert counters["prefix_cache_hits"] > 0  # "Say hello." repeated shares its pages
    series = stats["series"]
    assert len(series["t"]) >= 1 and len(series["hit_rate"]) == len(series["t"])
    assert set(series["requests_per_s"]) >= {"small", "large", "premium"}
    assert series["cost_saved_usd"][-1] == pytest.approx(
        stats["windows"]["all"]["savings"]["router"]["cost_usd"], rel=1e-9
    )
    prices = {(p["tier"], p["model"]): (p["input"], p["output"]) for p in stats["prices"]}
    assert prices["large", "openai/gpt-4o-mini"] == pytest.approx(litellm_map_price("gpt-4o-mini"))


def test_metrics_parse_and_agree_with_stats(url: str, workload: dict) -> None:
    response = admin_get(url, "/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    requests: dict[tuple[str, str], float] = defaultdict(float)  # summed over routes
    for s in families["tiergate_requests"].samples:
        if s.name == "tiergate_requests_total" and s.labels["status"] == "200":
            requests[s.labels["tier"], s.labels["model"]] += s.value
    for (tier, model), (count, _, _) in workload.items():
        assert requests[tier, model] == count
    for name in (
        "tiergate_tenant_requests",
        "tiergate_fallbacks",
        "tiergate_cooldowns",
        "tiergate_cache_lookups",
        "tiergate_cache_saved_cost_usd",
        "tiergate_cache_wrong_hits_reported",
        "tiergate_request_duration_seconds",
        "tiergate_engine_kv_cache_usage_perc",
        "tiergate_engine_prefix_cache_hits",
    ):
        assert name in families, name


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/stats"),
        ("GET", "/admin/policy"),
        ("POST", "/admin/policy/reload"),
        ("POST", "/admin/cache/report"),
    ],
)
def test_admin_routes_need_the_admin_key(url: str, method: str, path: str) -> None:
    for key, status in [(None, 401), ("sk-wrong-key-entirely", 401), (ONE, 403)]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.request(method, f"{url}{path}", headers=headers, json={})
        assert response.status_code == status, (key, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert ONE not in error["message"]


def test_report_wrong_hit_without_a_cache_is_404(url: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    response = httpx.post(f"{url}/admin/cache/report", headers=headers, json={"entry_id": "e1"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "cache_off"
    bad = httpx.post(f"{url}/admin/cache/report", headers=headers, json={"entry": "e1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] is not None


def test_admin_actions_are_audited_with_a_fingerprint(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiergate.audit")
    headers = {"Authorization": f"Bearer {ADMIN}"}
    response = httpx.post(f"{url}/admin/policy/reload", headers=headers)
    assert response.status_code == 400  # loaded from text: nothing to reload, still audited
    records = [r.getMessage() for r in caplog.records if r.name == "tiergate.audit"]
    fingerprint = "key:" + hashlib.sha256(ADMIN.encode()).hexdigest()[:10]
    assert any("policy reload" in m and fingerprint in m for m in records), records
    assert not any(ADMIN in m for m in records)


def test_cli_prints_the_same_summary(
    url: str, workload: dict, capsys: pytest.CaptureFixture
) -> None:
    assert main(["stats", "--url", url, "--key", ADMIN, "--window", "all"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("since start (")
    assert "11 requests, cache hit rate -" in out and "(against all on premium)" in out
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines() if line}
    for (tier, model), (requests, prompt, completion) in workload.items():
        assert rows[tier, model][:3] == [str(requests), str(prompt), str(completion)]
    assert rows["auto", "one"][0] == "4" and rows["-", "two"][0] == "7"
    assert rows["smollm2-135m", "0"][:1] == ["0"]  # engine: running 0, waiting 0


def test_cli_reports_a_refusal_in_one_line(url: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["stats", "--url", url, "--key", ONE]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tiergate: 403: ") and err.count("\n") == 1
    assert main(["stats", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    assert capsys.readouterr().err.startswith("tiergate: cannot reach")
