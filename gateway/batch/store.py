"""Files, batches and line results in the semantic cache's store (embedded SQLite or
Redis), so a batch outlives the gateway that started it and replicas on one Redis see the
same objects.

Every key carries the owner's hash: a tenant can never read, list, cancel or delete
another's file or batch, even knowing its id. Each tenant has an index of its files and of
its batches (for the lists), and one index holds the batches not yet ended (resumed at
start). Index updates are read-modify-write under one lock per process: two replicas
creating at the same instant may drop an entry from a list (never the object itself).
"""

import asyncio
import hashlib
import json
from typing import Any

from engine.entrypoints.openai.errors import OpenAIError
from gateway.cache.semantic import SemanticCache
from gateway.cache.store import StoreUnavailable

TTL_S = 30 * 24 * 3600.0  # files, batches and results are kept 30 days
MAX_INDEX = 10_000  # ids a tenant's list keeps, newest last
_ACTIVE = "batch:active"


def _owner(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


def _no_store() -> OpenAIError:
    message = (
        "The Batch API keeps files and batches in the cache's store, and this gateway runs "
        "without one (cache.enabled: false)."
    )
    return OpenAIError(400, message, code="batch_store_missing")


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "The batch store is unavailable; retry shortly.")


class BatchStore:
    """The Batch API's records, over the store of the cache open now."""

    def __init__(self, cache: SemanticCache | None, lock: asyncio.Lock) -> None:
        if cache is None:
            raise _no_store()
        self._records = cache.records
        self._lock = lock  # the process's one lock over index updates

    async def _put(self, key: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        try:
            await self._records.put_record(key, text, TTL_S)
        except StoreUnavailable:
            raise _unavailable() from None

    async def _get(self, key: str) -> str | None:
        try:
            return await self._records.get_record(key)
        except StoreUnavailable:
            raise _unavailable() from None

    async def _get_json(self, key: str) -> Any:
        text = await self._get(key)
        return None if text is None else json.loads(text)

    async def _delete(self, key: str) -> bool:
        try:
            return await self._records.delete_record(key)
        except StoreUnavailable:
            raise _unavailable() from None

    # -- files ---------------------------------------------------------------------------

    async def put_file(self, tenant: str, meta: dict, content: str) -> None:
        await self._put(f"bfile:{_owner(tenant)}:{meta['id']}:content", content)
        await self._put(f"bfile:{_owner(tenant)}:{meta['id']}", meta)
        await self._index_add(f"bindex:{_owner(tenant)}:files", meta["id"])

    async def file(self, tenant: str, file_id: str) -> dict | None:
        return await self._get_json(f"bfile:{_owner(tenant)}:{file_id}")

    async def file_content(self, tenant: str, file_id: str) -> str | None:
        return await self._get(f"bfile:{_owner(tenant)}:{file_id}:content")

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        await self._delete(f"bfile:{_owner(tenant)}:{file_id}:content")
        return await self._delete(f"bfile:{_owner(tenant)}:{file_id}")

    async def file_ids(self, tenant: str) -> list[str]:
        return await self._get_json(f"bindex:{_owner(tenant)}:files") or []

    # -- batches -------------------------------------------------------------------------

    async def put_batch(self, tenant: str, batch: dict, new: bool = False) -> None:
        await self._put(f"batch:{_owner(tenant)}:{batch['id']}", batch)
        if new:
            await self._index_add(f"bindex:{_owner(tenant)}:batches", batch["id"])
            await self._index_add(_ACTIVE, json.dumps([tenant, batch["id"]]))

    async def batch(self, tenant: str, batch_id: str) -> dict | None:
        return await self._get_json(f"batch:{_owner(tenant)}:{batch_id}")

    async def batch_ids(self, tenant: str) -> list[str]:
        return await self._get_json(f"bindex:{_owner(tenant)}:batches") or []

    async def active(self) -> list[tuple[str, str]]:
        """(tenant, batch id) of every batch not yet ended."""
        return [tuple(json.loads(item)) for item in await self._get_json(_ACTIVE) or []]

    async def ended(self, tenant: str, batch_id: str) -> None:
        await self._index_remove(_ACTIVE, json.dumps([tenant, batch_id]))

    # -- line results --------------------------------------------------------------------

    async def put_result(self, batch_id: str, index: int, result: dict) -> None:
        await self._put(f"bresult:{batch_id}:{index}", result)

    async def results(self, batch_id: str, count: int) -> dict[int, dict]:
        """The results stored so far, by line index."""
        found = {}
        for index in range(count):
            result = await self._get_json(f"bresult:{batch_id}:{index}")
            if result is not None:
                found[index] = result
        return found

    async def drop_results(self, batch_id: str, count: int) -> None:
        for index in range(count):
            await self._delete(f"bresult:{batch_id}:{index}")

    # -- indexes -------------------------------------------------------------------------

    async def _index_add(self, key: str, item: str) -> None:
        async with self._lock:
            items = [i for i in await self._get_json(key) or [] if i != item]
            await self._put(key, [*items, item][-MAX_INDEX:])

    async def _index_remove(self, key: str, item: str) -> None:
        async with self._lock:
            items = await self._get_json(key) or []
            if item in items:
                await self._put(key, [i for i in items if i != item])
