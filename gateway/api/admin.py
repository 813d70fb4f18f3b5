"""Operator endpoints: the running policy, its reload, stats, and /metrics for Prometheus."""

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

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


def _is_tenant_key(request: Request, state: GatewayState) -> bool:
    if not state.runtime.tenants:  # auth off: no key is a tenant's
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
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Constant-time compare: the admin key guards policy reloads.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), admin_key):
        if _is_tenant_key(request, state):  # a valid key, just not an admin's
            raise ApiError(403, "This endpoint needs the admin key; a tenant key cannot use it.")
        message = "This endpoint needs the admin key as a bearer token."
        raise ApiError(401, message, code="invalid_api_key")
    request.state.admin = key_fingerprint(admin_key)


Admin = Annotated[None, Depends(require_admin)]


def _redacted(policy_json: dict[str, Any]) -> dict[str, Any]:
    auth = policy_json.get("auth", {})
    for entry in auth.get("keys", []):
        entry["key"] = f"{entry['key'][:6]}..." if len(entry["key"]) > 12 else "***"
    if auth.get("admin_key"):
        auth["admin_key"] = "***"
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
async def metrics(state: State) -> Response:
    engine_registries = [
        e.metrics.registry for e in state.engines.all().values() if hasattr(e, "metrics")
    ]
    body = state.stats.exposition(*engine_registries)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
