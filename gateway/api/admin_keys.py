"""Managed API keys over the admin API: create (the key is in that answer only), list,
show, revoke. Each has a tenant, optionally the model names it may use, its own limits and
budget, and an expiry. The store (gateway/keys) keeps only the key's SHA-256; every action
is audited with the admin key's fingerprint.
"""

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.entrypoints.openai.errors import OpenAIError
from gateway.api.audit import audit
from gateway.api.deps import Admin, State, managed_keys, parse_body
from gateway.keys import KeyStoreError, ManagedKey, new_key
from gateway.keys.store import KeyStore
from gateway.limits.budget import budget_scopes
from gateway.policy import Budget, LimitSet
from gateway.state import GatewayState

router = APIRouter()
logger = logging.getLogger("tiergate.keys")
_NAME = Field(min_length=1, max_length=200)


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = _NAME
    name: str = _NAME
    allowed_models: list[str] | None = Field(default=None, min_length=1)
    limits: LimitSet = LimitSet()
    budget: Budget = Budget()
    expires_at: float | None = None  # Unix seconds

    @field_validator("tenant", "name")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("expires_at")
    @classmethod
    def _future(cls, value: float | None) -> float | None:
        if value is not None and value <= time.time():
            raise ValueError("must be in the future (Unix seconds)")
        return value


async def _store(request: Request, state: GatewayState) -> KeyStore:
    return await managed_keys(request).store(state.runtime.policy)


def _unavailable(exc: KeyStoreError) -> OpenAIError:
    logger.warning("managed keys: the store failed: %s", exc)  # its address stays in the log
    return OpenAIError(503, "The key store is unavailable; retry shortly.", type="server_error")


def _check_models(state: GatewayState, names: list[str] | None) -> None:
    served = set(state.runtime.router.model_names())
    unknown = sorted(set(names or ()) - served)
    if unknown:
        raise OpenAIError(
            400,
            f"allowed_models names models this gateway does not serve: {', '.join(unknown)}.",
            param="allowed_models",
        )


@router.post("/admin/keys")
async def create_key(request: Request, state: State, _: Admin) -> dict[str, Any]:
    if state.runtime.policy.auth.mode == "none":
        raise OpenAIError(400, "auth.mode is none: no key is checked, so none can be made.")
    body = await parse_body(request, NewKey)
    _check_models(state, body.allowed_models)
    key, key_id, digest = new_key()
    record = ManagedKey(id=key_id, digest=digest, created_at=time.time(), **body.model_dump())
    try:
        await (await _store(request, state)).add(record)
    except KeyStoreError as exc:
        raise _unavailable(exc) from None
    audit(request, "key create", id=key_id, tenant=body.tenant, name=body.name)
    return {**record.public(), "key": key}  # the only time the key is shown


async def _all(request: Request, state: GatewayState) -> list[ManagedKey]:
    try:
        return await (await _store(request, state)).all()
    except KeyStoreError as exc:
        raise _unavailable(exc) from None


@router.get("/admin/keys")
async def list_keys(
    request: Request, state: State, _: Admin, tenant: str | None = None
) -> dict[str, Any]:
    records = [r for r in await _all(request, state) if tenant is None or r.tenant == tenant]
    records.sort(key=lambda r: r.created_at)
    return {"object": "list", "data": [r.public() for r in records]}


@router.get("/admin/keys/{key_id}")
async def show_key(key_id: str, request: Request, state: State, _: Admin) -> dict[str, Any]:
    """One key, and what it has spent of its own budget this period."""
    record = next((r for r in await _all(request, state) if r.id == key_id), None)
    if record is None:
        raise OpenAIError(404, f"No managed key {key_id!r}.", code="key_not_found")
    policy, limiter = state.runtime.policy, request.app.state.limiter
    spent = {}
    for scope in budget_scopes(policy, record.tenant, record.terms(), time.time()):
        if scope.kind == "key":
            spent[scope.period] = await limiter.spent_usd(policy, scope)
    return {**record.public(), "spent_usd": spent}


@router.delete("/admin/keys/{key_id}")
async def revoke_key(key_id: str, request: Request, state: State, _: Admin) -> dict[str, Any]:
    try:
        deleted = await (await _store(request, state)).delete(key_id)
    except KeyStoreError as exc:
        raise _unavailable(exc) from None
    if not deleted:
        raise OpenAIError(404, f"No managed key {key_id!r}.", code="key_not_found")
    audit(request, "key revoke", id=key_id)
    return {"object": "api_key.deleted", "id": key_id, "deleted": True}
