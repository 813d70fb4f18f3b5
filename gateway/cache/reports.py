"""Wrong-hit reports kept as labelled pairs, per tenant, for `tiergate calibrate-cache`.

A report names an entry; the pair is (the question the wrong hit answered, the entry's
question), labelled must-not, in the pair file format calibration reads
(training/data/cache_pairs_real/README.md): `a` the new question, `b` the stored one. The
question asked comes from the report itself or, failing that, from the entry's latest
semantic hit on this replica (SemanticCache.hit_query). An exact hit's report is about the
answer, not the match (the same words), so it makes no pair.

The log is one record per tenant in the cache store (shared by replicas on one Redis), the
newest MAX_REPORTS kept for REPORTS_TTL_S after the latest report. Appends in one gateway
are serialised; two replicas appending in the same instant can lose one report's pair.
"""

import asyncio
import hashlib
import json
import time
import weakref
from typing import Any

from gateway.cache.entry import normalise
from gateway.cache.semantic import SemanticCache
from gateway.cache.tables import Held

MAX_REPORTS = 10_000  # per tenant
REPORTS_TTL_S = 90 * 24 * 3600.0
_appending: "weakref.WeakKeyDictionary[SemanticCache, asyncio.Lock]" = weakref.WeakKeyDictionary()


def _key(tenant: str) -> str:
    owner = hashlib.sha256(tenant.encode()).hexdigest()[:32]
    return f"reports:{owner}"


def pair_of(held: Held, asked: str | None, reason: str | None) -> dict[str, Any] | None:
    """The labelled pair a report makes, or None (no question known, or an exact hit)."""
    if asked is None or normalise(asked) == normalise(held.question):
        return None
    digest = hashlib.sha256(f"{asked}\0{held.question}".encode()).hexdigest()[:16]
    return {
        "id": digest,
        "a": asked,
        "b": held.question,
        "should_hit": False,
        "category": "reported",
        "source": "report",
        "route": held.route,
        "detail": reason,
        "reported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def append(cache: SemanticCache, tenant: str, pair: dict[str, Any]) -> None:
    """Add a pair to the tenant's log. Raises StoreUnavailable when the store is down."""
    async with _appending.setdefault(cache, asyncio.Lock()):
        pairs = await read(cache, tenant)
        pairs = [p for p in pairs if p["id"] != pair["id"]] + [pair]  # one line a pair
        value = json.dumps(pairs[-MAX_REPORTS:], ensure_ascii=False)
        await cache.records.put_record(_key(tenant), value, REPORTS_TTL_S)


async def read(cache: SemanticCache, tenant: str) -> list[dict[str, Any]]:
    """The tenant's reported pairs, oldest first. Raises StoreUnavailable when down."""
    record = await cache.records.get_record(_key(tenant))
    return json.loads(record) if record is not None else []
