"""What the routes depend on: the gateway state, who is calling (tenant, admin, metrics
scraper), the caller's place under its rate limits, the shutdown drain, and the request body
parsed with OpenAI's error shape. The only module that knows where the app keeps these.

One module for every router, so a key is checked one way everywhere: tenants by their
key's SHA-256 (the policy's keys, then the managed keys' store), the admin and metrics keys
compared in constant time on bytes.
"""

import logging
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from engine.entrypoints.api_key import bearer_token, same_key
from engine.entrypoints.openai.error_bodies import validation_error_message
from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.streaming import CLIENT_CLOSED_REQUEST
from gateway.api.audit import key_fingerprint
from gateway.drain import Drain
from gateway.keys import KeyStoreError, ManagedKey, ManagedKeys
from gateway.keys.record import KEY_PREFIX
from gateway.limits import Admission
from gateway.limits.terms import KeyTerms
from gateway.policy import key_digest
from gateway.state import GatewayState, Runtime

logger = logging.getLogger("tiergate.auth")


async def get_state(request: Request) -> GatewayState:
    # async: FastAPI runs a plain-def dependency in its thread pool, a hop per request.
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(get_state)]


def drain_of(request: Request) -> Drain:
    """The graceful-shutdown drain every answer from a tier goes through."""
    return request.app.state.drain


async def admit(
    request: Request,
    runtime: Runtime,
    tenant: str,
    approx_tokens: int,
    completion_tokens: int = 0,
    prompt_bound: int | None = None,
) -> Admission:
    """The request's place under its tenant's and key's limits and budgets, or a 429.
    `completion_tokens`: the most its answer may generate, reserved until it ends;
    `prompt_bound`: the most prompt tokens it can have, what a budget reserves."""
    limiter, policy, terms = request.app.state.limiter, runtime.policy, key_terms(request)
    return await limiter.admit(
        policy, tenant, terms, approx_tokens, completion_tokens, prompt_bound
    )


def key_terms(request: Request) -> KeyTerms | None:
    """The caller's key's terms (set by `authenticate`; None with `auth: {mode: none}`)."""
    return getattr(request.state, "key_terms", None)


def check_model_allowed(request: Request, model: str) -> None:
    """A managed key limited to some models gets OpenAI's 404 for any other name (as an
    OpenAI project key does for a model its project cannot use)."""
    terms = key_terms(request)
    if terms is not None and terms.allowed_models is not None and model not in terms.allowed_models:
        raise OpenAIError(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )


def managed_keys(request: Request) -> ManagedKeys:
    return request.app.state.managed_keys


def _mask(key: str) -> str:
    return f"{key[:6]}...{key[-4:]}" if len(key) > 12 else "***"


def _presented_key(request: Request, x_api_key: bool) -> bytes | None:
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None and x_api_key and (header := request.headers.get("x-api-key")):
        token = header.strip().encode("latin-1")  # where Anthropic's SDKs send it
    return token or None


async def authenticate(request: Request, runtime: Runtime, x_api_key: bool = False) -> str:
    """The caller's tenant; with `auth: {mode: none}` everyone is tenant "default".
    `x_api_key`: the key may also come as `x-api-key` (/v1/messages, as Anthropic's API)."""
    if runtime.policy.auth.mode == "none":
        return "default"
    token = _presented_key(request, x_api_key)
    if token is None:
        where = "'x-api-key: YOUR_KEY' or " if x_api_key else ""
        raise OpenAIError(
            401,
            f"You didn't provide an API key. Send it as {where}'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    # Keys are looked up by their SHA-256, so policies may store hashes instead of keys.
    digest = key_digest(token)
    managed = token.startswith(KEY_PREFIX.encode())  # no other token is looked up
    found = await key_of_digest(request, runtime, digest, managed)
    if found is None:
        shown = _mask(token.decode("latin-1"))
        raise OpenAIError(401, f"Incorrect API key provided: {shown}.", code="invalid_api_key")
    tenant, terms = found
    request.state.key_digest = digest  # the router's tier_override check
    request.state.key_terms = terms  # per-key limits, budget, allowed models, spend label
    return tenant


async def key_of_digest(
    request: Request, runtime: Runtime, digest: str, managed: bool = True
) -> tuple[str, KeyTerms] | None:
    """The tenant and terms of the key with this digest: a policy key, else (`managed`) a
    live managed key; None for no such key. A batch's lines look their key up again here,
    so a key revoked while its batch runs stops spending."""
    tenant = runtime.tenants.get(digest)
    if tenant is not None:
        return tenant, KeyTerms(digest, runtime.key_labels.get(digest, digest[:8]))
    record = await _managed_key(request, runtime, digest) if managed else None
    return None if record is None else (record.tenant, record.terms())


async def _managed_key(request: Request, runtime: Runtime, digest: str) -> ManagedKey | None:
    """The live managed key with this digest: read from the store on every request, so a
    revoke holds at once on every replica; an expired key is refused like a revoked one."""
    try:
        store = await managed_keys(request).store(runtime.policy)
        record = await store.by_digest(digest)
    except KeyStoreError as exc:  # fail closed: a key nobody can check is not let in
        logger.warning("managed keys: the store failed (%s); their requests get 503", exc)
        raise OpenAIError(
            503, "The key store is unavailable; retry shortly.", type="server_error"
        ) from None
    if record is not None and record.expired():
        raise OpenAIError(401, f"API key {record.id} has expired.", code="invalid_api_key")
    return record


Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body], empty: bytes = b"") -> Body:
    """The JSON body as `model`, or OpenAI's 400 naming the bad field. `empty`: what an
    empty body means (the admin actions read none as `{}`)."""
    try:
        return model.model_validate_json(await request.body() or empty)
    except ClientDisconnect:  # gone before its body arrived: counted, never a crash
        raise OpenAIError(
            CLIENT_CLOSED_REQUEST, "The client left before its body arrived."
        ) from None
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise OpenAIError(400, message, param=param) from None


def _bearer_matches(request: Request, *keys: str | None) -> bool:
    token = bearer_token(request.headers.get("authorization", ""))
    # Constant-time compare on bytes: these keys guard policy reloads and the stats.
    return token is not None and any(k is not None and same_key(token, k) for k in keys)


async def _is_tenant_key(request: Request, state: GatewayState) -> bool:
    if state.runtime.policy.auth.mode == "none":  # auth off: no key is a tenant's
        return False
    try:
        await authenticate(request, state.runtime)  # the API's own check: one source of truth
    except OpenAIError:
        return False
    return True


async def require_admin(request: Request, state: State) -> None:
    admin_key = state.runtime.policy.auth.admin_key
    if admin_key is None:
        raise OpenAIError(403, "The admin API is disabled: set auth.admin_key in the policy.")
    if not _bearer_matches(request, admin_key):
        if await _is_tenant_key(request, state):  # a valid key, just not an admin's
            raise OpenAIError(403, "This endpoint needs the admin key; a tenant key cannot use it.")
        message = "This endpoint needs the admin key as a bearer token."
        raise OpenAIError(401, message, code="invalid_api_key")
    request.state.admin = key_fingerprint(admin_key)


async def require_metrics(request: Request, state: State) -> None:
    auth = state.runtime.policy.auth
    if auth.metrics_key is None and auth.admin_key is None:
        raise OpenAIError(403, "/metrics is disabled: set auth.metrics_key in the policy.")
    if not _bearer_matches(request, auth.metrics_key, auth.admin_key):
        message = "/metrics needs the metrics key (auth.metrics_key) or the admin key."
        raise OpenAIError(401, message, code="invalid_api_key")


Admin = Annotated[None, Depends(require_admin)]
Metrics = Annotated[None, Depends(require_metrics)]
