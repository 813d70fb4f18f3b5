"""Admin access to the traffic samples `tiergate router learn` reads: list or export them
(JSON, or JSONL for `router learn --samples FILE`), and purge them by tenant and/or route.

The query names the tenant and the route; a purge of everything must say `all=true`, so a
forgotten parameter never empties the store. Every purge is audited.
"""

import json
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.entrypoints.openai.error_bodies import validation_error_message
from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.audit import audit
from gateway.api.deps import Admin, State
from gateway.api.samples_step import sample_store
from gateway.cache.samples import LIST_LIMIT
from gateway.cache.store import StoreUnavailable

router = APIRouter()


class Listing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(None, min_length=1)
    route: str | None = Field(None, min_length=1)
    limit: int = Field(LIST_LIMIT, ge=1, le=LIST_LIMIT)
    format: Literal["json", "jsonl"] = "json"


class Purge(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(None, min_length=1)
    route: str | None = Field(None, min_length=1)
    all: bool = False


def _query(request: Request, model: type[BaseModel]) -> Any:
    """The query string as `model`, or OpenAI's 400 naming the bad parameter."""
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise OpenAIError(400, message, param=param) from None


def _store_down() -> OpenAIError:
    return OpenAIError(503, "The sample store is unreachable; try again shortly.")


@router.get("/admin/router/samples")
async def list_samples(request: Request, state: State, _: Admin) -> Any:
    query: Listing = _query(request, Listing)
    try:
        samples = await sample_store(state).list(query.tenant, query.route, query.limit)
    except StoreUnavailable:
        raise _store_down() from None
    if query.format == "jsonl":
        text = "".join(s.to_json() + "\n" for s in samples)
        return Response(text, media_type="application/x-ndjson")
    return {"object": "list", "data": [json.loads(s.to_json()) for s in samples]}


@router.delete("/admin/router/samples")
async def purge_samples(request: Request, state: State, _: Admin) -> dict[str, Any]:
    query: Purge = _query(request, Purge)
    if query.tenant is None and query.route is None and not query.all:
        raise OpenAIError(
            400,
            "Name a tenant and/or a route, or purge every sample with all=true.",
            param="tenant",
        )
    try:
        removed = await sample_store(state).purge(query.tenant, query.route)
    except StoreUnavailable:
        raise _store_down() from None
    audit(request, "router samples purged", samples=removed, tenant=query.tenant, route=query.route)
    return {"purged": removed, "tenant": query.tenant, "route": query.route}
