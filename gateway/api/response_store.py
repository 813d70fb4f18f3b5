"""Stored responses (`store: true`), for `previous_response_id` and GET/DELETE
/v1/responses/{id}: kept in the semantic cache's store, so replicas on one Redis share them.

A record's key is the tenant's hash and the response id: one tenant can never read, chain
from or delete another's response, even knowing its id. Records are bounded: a response
over STORED_MAX_CHARS is not kept, each lives STORED_TTL_S, and the store caps their count.
A store that is down (or no cache) stores nothing: the answer itself is never refused for
it; reading a stored response then is a 503 (the store is down) or a 404 (no cache).
"""

import hashlib
import json
import logging
from typing import Any

from engine.entrypoints.openai.errors import OpenAIError
from gateway.cache.semantic import SemanticCache
from gateway.cache.store import StoreUnavailable

logger = logging.getLogger("tiergate")

STORED_TTL_S = 24 * 3600.0
STORED_MAX_CHARS = 1_000_000  # request history + answer, as JSON


def _key(tenant: str, response_id: str) -> str:
    owner = hashlib.sha256(tenant.encode()).hexdigest()[:32]
    return f"resp:{owner}:{response_id}"


async def save(
    cache: SemanticCache | None,
    tenant: str,
    response: dict[str, Any],
    messages: list[dict[str, Any]],
) -> bool:
    """Keep a response and the chat messages that led to it; whether it was kept."""
    if cache is None:
        return False
    record = json.dumps({"response": response, "messages": messages}, ensure_ascii=False)
    if len(record) > STORED_MAX_CHARS or not cache.records.healthy:  # down: no waiting on it
        return False
    try:
        await cache.records.put_record(_key(tenant, response["id"]), record, STORED_TTL_S)
    except StoreUnavailable as exc:
        logger.warning("responses: not stored, the cache store is down: %s", exc)
        return False
    return True


async def load(cache: SemanticCache | None, tenant: str, response_id: str) -> dict | None:
    """`{"response": ..., "messages": [...]}` of the tenant's stored response, or None."""
    if cache is None:
        return None
    try:
        record = await cache.records.get_record(_key(tenant, response_id))
    except StoreUnavailable:
        raise _unavailable() from None
    return json.loads(record) if record is not None else None


async def delete(cache: SemanticCache | None, tenant: str, response_id: str) -> bool:
    if cache is None:
        return False
    try:
        return await cache.records.delete_record(_key(tenant, response_id))
    except StoreUnavailable:
        raise _unavailable() from None


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "The response store is unavailable; retry shortly.")
