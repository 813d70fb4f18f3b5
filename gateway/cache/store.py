"""Where cache entries live: the interface both stores (SQLite, Redis) implement.

The cache keeps every entry's question, vector and a few answer facts in memory (the index
and the exact-match table need them); the store keeps the whole entry, survives restarts and,
for Redis, is shared by replicas. Answer texts are read from the store only on a hit.
"""

import asyncio
import contextlib
import json
from dataclasses import asdict
from typing import Protocol

from gateway.cache.entry import CachedAnswer, Entry


class StoreUnavailable(Exception):
    """The store cannot be reached or used right now; the cache bypasses itself."""


class StoreListener(Protocol):
    """What a shared store tells the cache about changes other replicas made."""

    async def replace_all(self, entries: list[Entry]) -> None: ...
    async def put(self, entry: Entry) -> None: ...
    async def delete(self, ids: list[str]) -> None: ...


class Store(Protocol):
    kind: str

    @property
    def healthy(self) -> bool: ...

    async def load(self) -> list[Entry]:
        """Every live entry, for the cache's in-memory tables at start."""
        ...

    async def put(self, entry: Entry, max_entries: int) -> list[str]:
        """Store (or replace) an entry; returns the least recently used ids it evicted."""
        ...

    async def get(self, entry_id: str) -> CachedAnswer | None: ...

    async def touch(self, entry_id: str, now: float) -> None:
        """Mark an entry used (LRU recency)."""
        ...

    async def delete(self, ids: list[str]) -> list[str]:
        """Remove entries everywhere (replicas too); returns the ids that existed."""
        ...

    async def purge(self, tenant: str | None, route: str | None) -> list[str]:
        """Remove every entry of a tenant and/or route (None: any); returns their ids."""
        ...

    async def missing(self, ids: list[str]) -> list[str]:
        """Those of `ids` the store no longer holds: removed behind the cache's back (a Redis
        FLUSHALL or eviction announces nothing)."""
        ...

    async def forget_expired(self, ids: list[str]) -> None:
        """Drop entries whose TTL has passed (every replica sees the same expiry)."""
        ...

    async def put_record(self, key: str, value: str, ttl_s: float) -> None:
        """A small value kept beside the entries (stored API responses) for `ttl_s`;
        the store keeps at most MAX_RECORDS, dropping the soonest to expire."""
        ...

    async def get_record(self, key: str) -> str | None: ...

    async def delete_record(self, key: str) -> bool:
        """Remove a record; whether it existed."""
        ...

    def info(self) -> dict: ...

    async def close(self) -> None: ...


def answer_to_json(answer: CachedAnswer) -> str:
    return json.dumps(asdict(answer), ensure_ascii=False)


def answer_from_json(text: str | bytes) -> CachedAnswer:
    return CachedAnswer(**json.loads(text))


MAX_RECORDS = 100_000  # records (not entries) an embedded store keeps; Redis: TTLs bound them
CLOSE_WAIT_S = 5.0  # longest a close waits for background work


async def stop_task(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait for it, CLOSE_WAIT_S at most."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await task
