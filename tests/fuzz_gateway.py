"""Schemathesis against a live gateway: the shared driver of the fuzz test and benchmark.

Cases come from the gateway's own OpenAPI document (valid and invalid bodies, headers and
keys). Half the generated bodies ask for the `auto` route, so valid ones reach the engine.
The gateway must never answer 5xx, every error must be an OpenAI error body, and the
service must still answer a plain request afterwards.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from gateway.policy import Policy, parse_policy
from tests.load_driver import is_openai_error

KEY = "sk-fuzz-0123456789"
# The semantic cache is on, so generated requests also go through its scope, lookup and
# store paths (the embedded store in `${FUZZ_CACHE}`, a temporary file).
POLICY = f"""
auth:
  keys: [{{key: {KEY}, tenant: fuzz}}]
  admin_key: sk-fuzz-admin-0123456789
cache: {{enabled: true, path: "${{FUZZ_CACHE}}"}}
engines:
  smollm2-135m: {{kv_cache_mb: 16, max_num_seqs: 8, max_model_len: 48, max_waiting: 64}}
tiers:
  small: {{deployments: [{{model: smollm2-135m}}], retries: 0, timeout_s: 30}}
routes:
  auto: {{default: small}}
"""


def fuzz_policy(cache_file: str) -> Policy:
    return parse_policy(POLICY, env={"FUZZ_CACHE": cache_file})


OPERATIONS = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models")


@dataclass
class FuzzReport:
    cases: int = 0
    unsendable: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def _check(response: httpx.Response, report: FuzzReport, case_text: str) -> None:
    report.cases += 1
    report.statuses[response.status_code] += 1
    if response.status_code >= 500:
        report.failures.append(f"{response.status_code} for {case_text}: {response.text[:300]}")
    elif response.status_code >= 400 and not is_openai_error(response):
        report.failures.append(f"non-OpenAI error body for {case_text}: {response.text[:300]}")


def _encode(body: Any) -> bytes:
    """Negative cases may be raw bytes, text or not set at all; JSON otherwise."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    try:
        return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    except TypeError:  # schemathesis' NotSet: the body is missing
        return b""


def _send(client: httpx.Client, case: Any, route_auto: bool) -> httpx.Response:
    body = case.body
    if route_auto and isinstance(body, dict) and "model" in body:
        body = {**body, "model": "auto"}
    headers = {"authorization": f"Bearer {KEY}", **(case.headers or {})}
    kwargs: dict[str, Any] = {"headers": headers}
    if case.method == "POST":
        kwargs["content"] = _encode(body)
        headers.setdefault("content-type", "application/json")
    return client.request(case.method, case.formatted_path, **kwargs)


def fuzz(url: str, examples_per_operation: int) -> FuzzReport:
    """Run the cases against the live gateway at `url`; never raises on findings."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    report = FuzzReport()
    with httpx.Client(base_url=url, timeout=60) as client:
        for label in OPERATIONS:
            operation = schema[label.split()[1]][label.split()[0]]
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_operation(client, operation, mode, examples_per_operation // 2, report)
        alive = client.get("/health")
        if alive.status_code != 200:
            report.failures.append(f"/health answered {alive.status_code} after the run")
    return report


def _fuzz_operation(
    client: httpx.Client, operation: Any, mode: Any, examples: int, report: FuzzReport
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode), route_auto=st.booleans())
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any, route_auto: bool) -> None:
        try:
            response = _send(client, case, route_auto)
        except httpx.LocalProtocolError:  # e.g. a header no HTTP client may send
            report.unsendable += 1
            return
        except httpx.HTTPError as exc:  # a dropped connection is a finding, not a crash here
            report.failures.append(f"{type(exc).__name__} for {case.method} {case.body!r:.200}")
            return
        _check(response, report, f"{case.method} {case.formatted_path} {case.body!r:.200}")

    run()
