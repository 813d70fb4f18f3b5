"""The cache's in-memory tables: what a lookup needs to decide without reading the store.

Per entry: its question and a few answer facts (`Held`), the exact-match table (scope +
normalised question -> id), an expiry heap, and the vector in its scope's FAISS index. The
tables are also the listener a shared store feeds with other replicas' inserts and deletes.
Every index call runs on one worker thread: FAISS indexes are not thread-safe, and a big
search or an IVF rebuild must not stall the event loop.
"""

import asyncio
import hashlib
import heapq
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from gateway.cache.entry import Entry, answer_serves, normalise
from gateway.cache.index import CacheIndex, Hit, use_one_thread

T = TypeVar("T")
HELD_BYTES = 400  # a Held with its question (~100 characters) and its exact-table item


@dataclass(slots=True)
class Held:
    scope: str
    tenant: str
    route: str
    question: str
    exact_key: bytes
    finish_reason: str
    completion_tokens: int
    max_tokens: int | None
    expires_at: float | None

    def serves(self, wanted: int | None) -> bool:
        return answer_serves(self.finish_reason, self.completion_tokens, self.max_tokens, wanted)

    def live(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


def exact_key(scope: str, text: str) -> bytes:
    return hashlib.blake2b(f"{scope}\0{normalise(text)}".encode(), digest_size=16).digest()


class EntryTables:
    def __init__(self, dim: int, approximate_above: int) -> None:
        # IVF training has its own thread, so a scope that grows never stalls lookups.
        self._trainer = ThreadPoolExecutor(
            1, thread_name_prefix="cache-index-train", initializer=use_one_thread
        )
        self._index = CacheIndex(dim, approximate_above, self._trainer)
        self._held: dict[str, Held] = {}
        self._exact: dict[bytes, str] = {}
        self._expiry: list[tuple[float, str]] = []  # heap; items of dropped entries linger
        self._index_thread = ThreadPoolExecutor(
            1, thread_name_prefix="cache-index", initializer=use_one_thread
        )

    def __len__(self) -> int:
        return len(self._held)

    def get(self, entry_id: str | None) -> Held | None:
        return self._held.get(entry_id) if entry_id is not None else None

    def exact(self, scope: str, text: str) -> str | None:
        return self._exact.get(exact_key(scope, text))

    async def search(self, scope: str, vector: np.ndarray, k: int) -> list[Hit]:
        return await self._in_index_thread(self._index.search, scope, vector, k)

    def matching(self, tenant: str | None, route: str | None) -> list[str]:
        return [
            entry_id
            for entry_id, held in self._held.items()
            if tenant in (None, held.tenant) and route in (None, held.route)
        ]

    def expired(self, now: float) -> list[str]:
        ids = []
        while self._expiry and self._expiry[0][0] <= now:
            _, entry_id = heapq.heappop(self._expiry)
            held = self._held.get(entry_id)
            if held is not None and not held.live(now):
                ids.append(entry_id)
        return ids

    def stats(self) -> dict:
        index = self._index.stats()
        return {
            "entries": len(self._held),
            **index,
            "memory_bytes_per_entry": index["index_bytes_per_entry"] + HELD_BYTES,
        }

    # --- changes (the StoreListener interface) -----------------------------------------

    async def replace_all(self, entries: list[Entry]) -> None:
        now = time.time()
        entries = [e for e in entries if e.expires_at is None or e.expires_at > now]
        self._held.clear()
        self._exact.clear()
        self._expiry.clear()
        for entry in sorted(entries, key=lambda e: e.created_at):
            self._hold(entry)  # of two entries for one question, the newer is kept
        by_scope: dict[str, list[Entry]] = {}
        for entry in entries:
            if entry.id in self._held:
                by_scope.setdefault(entry.scope, []).append(entry)
        await self._in_index_thread(self._rebuild_index, by_scope)

    async def put(self, entry: Entry) -> str | None:
        """Hold an entry; returns the id of an entry it replaced (same scope and question)."""
        if entry.expires_at is not None and entry.expires_at <= time.time():
            return None
        replaced = self._hold(entry)
        await self._in_index_thread(
            self._index.add, entry.scope, [entry.id], entry.vector.reshape(1, -1)
        )
        if replaced is not None:
            await self._in_index_thread(self._remove_from_index, {entry.scope: [replaced]})
        return replaced

    async def delete(self, ids: list[str]) -> None:
        by_scope: dict[str, list[str]] = {}
        for entry_id in ids:
            held = self._forget(entry_id)
            if held is not None:
                by_scope.setdefault(held.scope, []).append(entry_id)
        if by_scope:
            await self._in_index_thread(self._remove_from_index, by_scope)

    def close(self) -> None:
        self._index_thread.shutdown(wait=True)
        self._trainer.shutdown(wait=False, cancel_futures=True)

    # --- internals -----------------------------------------------------------------------

    def _hold(self, entry: Entry) -> str | None:
        """Keep an entry; returns the id it replaced for the same question, whose vector the
        caller removes."""
        key = exact_key(entry.scope, entry.question)
        previous = self._exact.get(key)
        replaced = previous if previous != entry.id and self._forget(previous) else None
        self._held[entry.id] = Held(
            scope=sys.intern(entry.scope),
            tenant=sys.intern(entry.tenant),
            route=sys.intern(entry.route),
            question=entry.question,
            exact_key=key,
            finish_reason=entry.answer.finish_reason,
            completion_tokens=entry.answer.completion_tokens,
            max_tokens=entry.answer.max_tokens,
            expires_at=entry.expires_at,
        )
        self._exact[key] = entry.id
        if entry.expires_at is not None:
            heapq.heappush(self._expiry, (entry.expires_at, entry.id))
        return replaced

    def _forget(self, entry_id: str | None) -> Held | None:
        held = self._held.pop(entry_id, None) if entry_id is not None else None
        if held is not None and self._exact.get(held.exact_key) == entry_id:
            del self._exact[held.exact_key]
        return held

    def _rebuild_index(self, by_scope: dict[str, list[Entry]]) -> None:
        self._index.clear()
        for scope, entries in by_scope.items():
            vectors = np.stack([e.vector for e in entries])
            self._index.add(scope, [e.id for e in entries], vectors)

    def _remove_from_index(self, by_scope: dict[str, list[str]]) -> None:
        for scope, ids in by_scope.items():
            self._index.remove(scope, ids)

    async def _in_index_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._index_thread, fn, *args)
