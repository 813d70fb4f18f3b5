"""Admin actions on the semantic cache: purge (all, by tenant, by route), invalidate one.

A hit names its entry in `x-tiergate-cache-entry`; that id is what invalidation takes.
"""

import logging
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from engine.protocol import validation_error_message
from gateway.api.admin import Admin, State
from gateway.cache.semantic import SemanticCache
from gateway.cache.store import StoreUnavailable
from gateway.errors import ApiError

router = APIRouter()
audit = logging.getLogger("tiergate.audit")


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = None
    route: str | None = None


def _cache(state: Any) -> SemanticCache:
    if state.cache is None:
        raise ApiError(404, "The semantic cache is off in the running policy.", code="cache_off")
    return state.cache


def _store_down() -> ApiError:
    return ApiError(503, "The cache store is unreachable; nothing was removed. Try again.")


@router.post("/admin/cache/purge")
async def purge(request: Request, state: State, _: Admin) -> dict[str, Any]:
    """Body `{}` purges everything; `tenant` and/or `route` narrow it."""
    raw = await request.body()
    try:
        body = PurgeRequest.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise ApiError(400, message, param=param) from None
    removed = await _cache(state).purge(tenant=body.tenant, route=body.route)
    audit.info(
        "admin purged %d cache entries (tenant=%s route=%s)", removed, body.tenant, body.route
    )
    return {"purged": removed, "tenant": body.tenant, "route": body.route}


@router.delete("/admin/cache/entries/{entry_id}")
async def invalidate(entry_id: str, state: State, _: Admin) -> dict[str, Any]:
    try:
        found = await _cache(state).invalidate(entry_id)
    except StoreUnavailable:
        raise _store_down() from None
    if not found:
        raise ApiError(404, f"No cache entry {entry_id!r}.", code="entry_not_found")
    audit.info("admin invalidated cache entry %s", entry_id)
    return {"invalidated": entry_id}


@router.get("/admin/cache")
async def info(state: State, _: Admin) -> dict[str, Any]:
    return _cache(state).info()
