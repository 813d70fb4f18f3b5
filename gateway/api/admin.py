"""Operator endpoints: the running policy, its reload, stats, and /metrics for Prometheus."""

from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from fastapi import APIRouter, Request

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.audit import audit
from gateway.api.deps import Admin, State
from gateway.policy import PolicyError
from gateway.pricing import most_expensive, policy_prices
from gateway.stats.view import stats_view

router = APIRouter()


def redact_url(url: str | None) -> str | None:
    """`scheme://user:password@host/path?token=x` -> `scheme://***@host/path?token=***`."""
    if not url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    # Any query value may be a credential (?key=, ?token=, ?sig=): none is shown.
    names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    query = "&".join(f"{name}=***" for name in names)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redacted(policy_json: dict[str, Any]) -> dict[str, Any]:
    auth = policy_json.get("auth", {})
    for entry in auth.get("keys", []):
        if entry.get("key"):
            entry["key"] = f"{entry['key'][:6]}..." if len(entry["key"]) > 12 else "***"
        if entry.get("key_sha256"):  # a hash of a weak key can be brute-forced
            entry["key_sha256"] = entry["key_sha256"][:8] + "..."
    for name in ("admin_key", "metrics_key", "cache_salt_secret"):
        if auth.get(name):
            auth[name] = "***"
    for tier in policy_json.get("tiers", {}).values():
        for deployment in tier.get("deployments", []):
            deployment["api_base"] = redact_url(deployment.get("api_base"))
    judge = policy_json.get("router_learning", {}).get("judge")
    if judge:  # a deployment like any tier's
        judge["api_base"] = redact_url(judge.get("api_base"))
    for section in ("cache", "limits", "server"):
        part = policy_json.get(section, {})
        if part.get("redis_url"):
            part["redis_url"] = redact_url(part["redis_url"])
    return policy_json


def _error_json(error: PolicyError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {
        "source": error.source,
        "issues": [str(i) for i in error.issues],
        "lines": [i.line for i in error.issues],  # where each issue is, when known
    }


@router.get("/admin/policy")
async def show_policy(state: State, _: Admin) -> dict[str, Any]:
    watcher = state.watcher
    return {
        "source": str(state.policy_path) if state.policy_path else None,
        "loaded_at": state.runtime.loaded_at,
        "policy": _redacted(state.runtime.policy.model_dump(mode="json")),
        "last_error": _error_json(watcher.last_error if watcher else None),
    }


@router.post("/admin/policy/reload")
async def reload_policy(request: Request, state: State, _: Admin) -> dict[str, Any]:
    audit(request, "policy reload", source=str(state.policy_path))
    if state.watcher is None:
        raise OpenAIError(400, "The policy was not loaded from a file; there is nothing to reload.")
    if await state.watcher.reload() is None:
        error = state.watcher.last_error
        issues = [str(i) for i in error.issues] if error else []
        raise OpenAIError(
            400,
            "Invalid policy, the running one stays in force: " + "; ".join(issues),
            code="invalid_policy",
        )
    # shared: whether the other replicas on the policy's Redis will apply it too
    shared = state.replicas.last_shared
    return {"status": "reloaded", "loaded_at": state.runtime.loaded_at, "shared": shared}


@router.get("/admin/stats")
async def show_stats(state: State, _: Admin) -> dict[str, Any]:
    """Windows (last minute, last hour, since start), engines, chart series: docs/operations.md."""
    prices = policy_prices(state.runtime.policy)
    engines = state.engines.all()
    fleet = await state.replicas.fleet_stats()
    return stats_view(state.history, prices, most_expensive(prices), engines, fleet)
