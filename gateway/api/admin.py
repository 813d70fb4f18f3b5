"""Operator endpoints: the running policy, its reload, stats, and /metrics for Prometheus."""

from typing import Annotated, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from engine.entrypoints.api_key import bearer_token, same_key
from gateway.api.audit import audit, key_fingerprint
from gateway.api.openai import authenticate
from gateway.errors import ApiError
from gateway.policy import PolicyError
from gateway.pricing import most_expensive, policy_prices
from gateway.state import GatewayState
from gateway.stats_view import stats_view

router = APIRouter()


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI runs a plain-def dependency in its thread pool, a hop per request.
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]


def _bearer_matches(request: Request, *keys: str | None) -> bool:
    token = bearer_token(request.headers.get("authorization", ""))
    # Constant-time compare on bytes: these keys guard policy reloads and the stats.
    return token is not None and any(k is not None and same_key(token, k) for k in keys)


def _is_tenant_key(request: Request, state: GatewayState) -> bool:
    if state.runtime.policy.auth.mode == "none":  # auth off: no key is a tenant's
        return False
    try:
        authenticate(request, state.runtime)  # the API's own check: one source of truth
    except ApiError:
        return False
    return True


async def require_admin(request: Request, state: State) -> None:
    admin_key = state.runtime.policy.auth.admin_key
    if admin_key is None:
        raise ApiError(403, "The admin API is disabled: set auth.admin_key in the policy.")
    if not _bearer_matches(request, admin_key):
        if _is_tenant_key(request, state):  # a valid key, just not an admin's
            raise ApiError(403, "This endpoint needs the admin key; a tenant key cannot use it.")
        message = "This endpoint needs the admin key as a bearer token."
        raise ApiError(401, message, code="invalid_api_key")
    request.state.admin = key_fingerprint(admin_key)


async def require_metrics(request: Request, state: State) -> None:
    auth = state.runtime.policy.auth
    if auth.metrics_key is None and auth.admin_key is None:
        raise ApiError(403, "/metrics is disabled: set auth.metrics_key in the policy.")
    if not _bearer_matches(request, auth.metrics_key, auth.admin_key):
        message = "/metrics needs the metrics key (auth.metrics_key) or the admin key."
        raise ApiError(401, message, code="invalid_api_key")


Admin = Annotated[None, Depends(require_admin)]
Metrics = Annotated[None, Depends(require_metrics)]


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
    cache = policy_json.get("cache", {})
    if "redis_url" in cache:
        cache["redis_url"] = redact_url(cache["redis_url"])
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
        raise ApiError(400, "The policy was not loaded from a file; there is nothing to reload.")
    if await state.watcher.reload() is None:
        error = state.watcher.last_error
        issues = [str(i) for i in error.issues] if error else []
        raise ApiError(
            400,
            "Invalid policy, the running one stays in force: " + "; ".join(issues),
            code="invalid_policy",
        )
    return {"status": "reloaded", "loaded_at": state.runtime.loaded_at}


@router.get("/admin/stats")
async def show_stats(state: State, _: Admin) -> dict[str, Any]:
    """Windows (last minute, last hour, since start), engines and chart series: README."""
    prices = policy_prices(state.runtime.policy)
    engines = state.engines.all()
    return stats_view(state.history, prices, most_expensive(prices), engines)


@router.get("/metrics")
async def metrics(state: State, _: Metrics) -> Response:
    engine_registries = [
        e.metrics.registry for e in state.engines.all().values() if hasattr(e, "metrics")
    ]
    body = state.stats.exposition(*engine_registries)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
