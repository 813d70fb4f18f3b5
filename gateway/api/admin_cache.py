"""Admin actions on the semantic cache: purge (all, by tenant, by route), invalidate one
entry, report a wrong hit (removed, counted, kept as a labelled pair), export a tenant's
reported pairs for `tiergate calibrate-cache`, and the cache's own figures.

A hit names its entry in `x-tiergate-cache-entry`; that id is what invalidation and
reports take. Every action is audited with the admin key's fingerprint.
"""

import contextlib
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.audit import audit
from gateway.api.deps import Admin, State, parse_body
from gateway.cache import reports
from gateway.cache.semantic import SemanticCache
from gateway.cache.store import StoreUnavailable
from gateway.state import GatewayState

router = APIRouter()


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = None
    route: str | None = None


class WrongHitReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entry_id: str = Field(min_length=1, max_length=256)
    reason: str | None = Field(default=None, max_length=1000)  # kept in the audit log
    # the question the wrong answer was given to; default: the entry's latest semantic hit
    query: str | None = Field(default=None, min_length=1, max_length=100_000)


def _cache(state: GatewayState) -> SemanticCache:
    if state.cache is None:
        raise OpenAIError(404, "The semantic cache is off in the running policy.", code="cache_off")
    return state.cache


async def _remove(state: GatewayState, entry_id: str) -> None:
    try:
        found = await _cache(state).invalidate(entry_id)
    except StoreUnavailable:
        raise _store_down() from None
    if not found:
        raise OpenAIError(404, f"No cache entry {entry_id!r}.", code="entry_not_found")


def _store_down() -> OpenAIError:
    return OpenAIError(503, "The cache store is unreachable; nothing was removed. Try again.")


@router.post("/admin/cache/purge")
async def purge(request: Request, state: State, _: Admin) -> dict[str, Any]:
    """Body `{}` purges everything; `tenant` and/or `route` narrow it."""
    body = await parse_body(request, PurgeRequest, empty=b"{}")
    try:
        removed = await _cache(state).purge(tenant=body.tenant, route=body.route)
    except StoreUnavailable:
        raise _store_down() from None
    audit(request, "cache purged", entries=removed, tenant=body.tenant, route=body.route)
    return {"purged": removed, "tenant": body.tenant, "route": body.route}


@router.delete("/admin/cache/entries/{entry_id}")
async def invalidate(request: Request, entry_id: str, state: State, _: Admin) -> dict[str, Any]:
    await _remove(state, entry_id)
    audit(request, "cache entry invalidated", entry_id=entry_id)
    return {"invalidated": entry_id}


@router.post("/admin/cache/report")
async def report_wrong_hit(request: Request, state: State, _: Admin) -> dict[str, Any]:
    """A hit an operator found wrong: removed, and counted next to the hit rate."""
    body = await parse_body(request, WrongHitReport, empty=b"{}")
    cache = _cache(state)
    held = cache.tables.get(body.entry_id)  # read before it goes
    asked = body.query or cache.hit_query(body.entry_id)
    pair = reports.pair_of(held, asked, body.reason) if held is not None else None
    await _remove(state, body.entry_id)
    state.stats.wrong_hit_reported()
    if pair is not None:
        try:
            await reports.append(cache, held.tenant, pair)
        except StoreUnavailable:  # removed and counted; only the pair is lost
            pair = None
    audit(request, "cache wrong hit reported", entry_id=body.entry_id, reason=body.reason)
    return {"reported": body.entry_id, "removed": True, "pair": pair is not None}


@router.get("/admin/cache/reports/export")
async def export_reports(
    state: State, _: Admin, tenant: str | None = None, format: str = "jsonl"
) -> Response:
    """One tenant's wrong-hit reports as labelled pairs, the file calibrate-cache reads."""
    if not tenant:
        raise OpenAIError(400, "tenant is required: reports are kept per tenant.", param="tenant")
    if format not in ("jsonl", "json"):
        raise OpenAIError(400, "format must be jsonl or json.", param="format")
    try:
        pairs = await reports.read(_cache(state), tenant)
    except StoreUnavailable:
        raise OpenAIError(503, "The cache store is unreachable. Try again.") from None
    if format == "json":
        return JSONResponse({"object": "list", "tenant": tenant, "data": pairs})
    body = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    headers = {"content-disposition": 'attachment; filename="wrong-hits.jsonl"'}
    return Response(body, media_type="application/x-ndjson", headers=headers)


@router.get("/admin/cache")
async def info(state: State, _: Admin) -> dict[str, Any]:
    """The cache's figures, counted against the store: entries it lost are dropped first. A
    store that is down leaves the figures as held, and `store.healthy` says so."""
    cache = _cache(state)
    with contextlib.suppress(StoreUnavailable):
        await cache.reconcile()
    return cache.info()
