"""The semantic cache: exact-then-semantic lookup per scope, over a store and FAISS indexes.

A lookup first tries the exact table (scope + normalised question: no embedding needed),
then embeds the question through the caller's memoised `embed` and searches the scope's
index. Candidates at or above the route's similarity floor go to the verifier best first;
the first it accepts is a semantic hit. The store holds answers; this object keeps what a
lookup needs to decide (questions, vectors, a few answer facts) in memory, and a shared
store keeps those tables in step across replicas. A store that is down makes lookups
`bypass` and stores no-ops: nothing here raises to a request.

The request pipeline's calls:

    cache = await SemanticCache.open(policy.cache, embedder, verifier)  # at start-up
    settings = policy.cache.for_route(policy.routes.get(route_name))
    query = CacheQuery(scope, tenant, route_name, last_user_text, max_tokens, temperature)
    found = await cache.lookup(query, embed, settings)  # embed: memoised, the router reuses it
    ...  # a miss: answer it, then with the complete answer
    await cache.store(query, embed, CachedAnswer(...), request_ttl_s, settings)
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gateway.cache.entry import STORABLE_FINISH_REASONS, CachedAnswer, Entry
from gateway.cache.store import CLOSE_WAIT_S, Store, StoreUnavailable, stop_task
from gateway.cache.tables import EntryTables
from gateway.cache.verdicts import Verifier, one_candidate_threshold, verdicts
from gateway.cache.verifier import Verdict
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings, RouteCacheSettings

__all__ = [
    "CacheQuery",
    "CachedAnswer",
    "Embed",
    "Lookup",
    "SemanticCache",
    "Verdict",
    "Verifier",
]

logger = logging.getLogger("tiergate.cache")

Embed = Callable[[], Awaitable[np.ndarray]]  # the request's embedding, memoised by the caller
SWEEP_INTERVAL_S = 1.0  # how often expired entries leave memory and the store
SEARCH_SLACK = 4  # search this many times `candidates`: some hits may not serve the request
HIT_QUERIES_KEPT = 10_000  # the latest semantic hits' questions, for wrong-hit reports


@dataclass(frozen=True)
class CacheQuery:
    scope: str  # opaque hash from the caller (tenant, route, system prompt, ...)
    tenant: str
    route: str
    text: str  # the last user message: what is matched
    max_tokens: int | None
    temperature: float | None = None  # answers sampled above cache.max_temperature: not stored


@dataclass
class Lookup:
    outcome: Literal["exact", "semantic", "miss", "bypass"]
    answer: CachedAnswer | None = None
    entry_id: str | None = None
    similarity: float | None = None  # 1.0 for an exact hit; a miss: the best candidate's
    refused: int = 0  # candidates the verifier refused
    reason: str | None = None  # why a bypass / the first refusal


class SemanticCache:
    def __init__(
        self, settings: CacheSettings, store: Store, dim: int, verifier: Verifier | None
    ) -> None:
        self.settings = settings
        self._store = store
        self._verifier = verifier
        self.tables = EntryTables(dim, settings.approximate_above)
        # Verifying has its own thread: it must not wait behind an index rebuild.
        self._verify_thread = ThreadPoolExecutor(1, thread_name_prefix="cache-verify")
        self._sweeper: asyncio.Task | None = None
        self._loaded = False
        self._touches: set[asyncio.Task] = set()
        self._in_flight = 0  # lookups under way (crowded)
        # entry id -> the question its latest semantic hit answered: a wrong-hit report on
        # the entry then becomes a labelled pair (gateway/cache/reports.py). This replica's.
        self._hit_queries: OrderedDict[str, str] = OrderedDict()

    @classmethod
    async def open(
        cls,
        settings: CacheSettings,
        embedder: Embedder,
        verifier: Verifier | None,
        store: Store | None = None,
    ) -> "SemanticCache":
        """Open the policy's store and load its entries; a store that is down is not fatal."""
        cache = cls(settings, store or _make_store(settings), embedder.dim, verifier)
        serve = getattr(verifier, "serve", None)
        if serve is not None:  # a verifier's own set-up for lookups (token_states, nli_scores)
            serve(embedder, cache.crowded)
        follow = getattr(cache._store, "follow", None)
        if not await cache._load() and follow is None:
            logger.warning("semantic cache bypassed until its store opens")
        if follow is not None:
            cache._loaded = True  # the follower loads and reloads by itself
            follow(cache.tables)  # replicas: apply other gateways' inserts and deletes
        cache._sweeper = asyncio.create_task(cache._sweep_forever())
        return cache

    # --- the request path --------------------------------------------------------------

    async def lookup(
        self, query: CacheQuery, embed: Embed, route_settings: RouteCacheSettings
    ) -> Lookup:
        if route_settings.enabled is False:
            return Lookup("bypass", reason="disabled")
        if not self._store.healthy:
            return Lookup("bypass", reason="store_unavailable")
        self._in_flight += 1
        try:
            return await self._lookup(query, embed, route_settings)
        except StoreUnavailable:
            return Lookup("bypass", reason="store_unavailable")
        finally:
            self._in_flight -= 1

    def crowded(self) -> bool:
        """Other lookups are under way: a verifier should not take a second core."""
        return self._in_flight > 1

    async def _lookup(self, query: CacheQuery, embed: Embed, rs: RouteCacheSettings) -> Lookup:
        now = time.time()
        entry_id = self.tables.exact(query.scope, query.text)
        held = self.tables.get(entry_id)
        if held and held.live(now) and held.serves(query.max_tokens):
            answer = await self._fetch(entry_id)
            if answer is not None:
                return Lookup("exact", answer, entry_id, 1.0)
        try:
            vector = await embed()
        except Exception as exc:  # the embedder failing degrades to a bypass
            logger.exception("embedding for the cache failed")
            return Lookup("bypass", reason=f"embed_failed: {type(exc).__name__}")
        return await self._semantic(query, vector, rs, now)

    async def _semantic(
        self, query: CacheQuery, vector: np.ndarray, rs: RouteCacheSettings, now: float
    ) -> Lookup:
        k = self.settings.candidates * SEARCH_SLACK
        hits = await self.tables.search(query.scope, vector, k)
        floor = _setting(rs.min_similarity, self.settings.min_similarity)
        strictness = _setting(rs.verifier, self.settings.verifier)
        threshold = _setting(rs.verifier_threshold, self.settings.verifier_threshold)
        above = [
            (hit, held)
            for hit in hits
            if hit.similarity >= floor
            and (held := self.tables.get(hit.entry_id)) is not None
            and held.live(now)
            and held.serves(query.max_tokens)
        ]
        candidates = above[: self.settings.candidates]
        if threshold is None and len(above) == 1 and self.settings.one_candidate_thresholds:
            threshold = one_candidate_threshold(self._verifier, strictness)
        refused, reason = 0, None
        found = verdicts(
            self._verifier,
            self._verify_thread,
            query.text,
            candidates,
            strictness,
            threshold,
            self.settings.model_reads,
        )
        try:
            for hit, _ in candidates:
                verdict = await anext(found)
                if verdict is not None and not verdict.accept:
                    refused += 1
                    reason = reason or verdict.reason
                    continue
                answer = await self._fetch(hit.entry_id)
                if answer is not None:
                    self._remember_hit(hit.entry_id, query.text)
                    return Lookup("semantic", answer, hit.entry_id, hit.similarity, refused, reason)
        finally:
            await found.aclose()
        best = hits[0].similarity if hits else None
        return Lookup("miss", similarity=best, refused=refused, reason=reason)

    async def store(
        self,
        query: CacheQuery,
        embed: Embed,
        answer: CachedAnswer,
        ttl_s: float | None,
        route_settings: RouteCacheSettings | None = None,
    ) -> str | None:
        """Store a complete answer; returns its entry id, or None when it was not stored.

        `ttl_s`: the request's own TTL, which may shorten the route's (else the policy's)
        but never lengthen it; None takes it. A TTL of 0 or less stores nothing.
        """
        if not self._storable(query, answer, route_settings) or not self._store.healthy:
            return None
        limit = route_settings.ttl_s if route_settings else self.settings.ttl_s
        if ttl_s is None or (limit is not None and ttl_s > limit):
            ttl_s = limit
        if ttl_s is not None and ttl_s <= 0:
            return None
        try:
            vector = await embed()
        except Exception:
            logger.exception("embedding for the cache failed; answer not stored")
            return None
        now = time.time()
        entry = Entry(
            id=uuid.uuid4().hex,
            scope=query.scope,
            tenant=query.tenant,
            route=query.route,
            question=query.text,
            vector=np.asarray(vector, dtype=np.float32).reshape(-1),
            answer=answer,
            created_at=now,
            expires_at=None if ttl_s is None else now + ttl_s,
        )
        try:
            replaced = self.tables.exact(query.scope, query.text)
            if replaced is not None:  # the newer answer to the same question wins
                await self._store.delete([replaced])
                await self.tables.delete([replaced])
            evicted = await self._store.put(entry, self.settings.max_entries)
        except StoreUnavailable:
            return None
        raced = await self.tables.put(entry)  # a concurrent store of the same question
        await self.tables.delete(evicted)
        if raced is not None:
            with contextlib.suppress(StoreUnavailable):
                await self._store.delete([raced])
        return entry.id

    def _storable(
        self, query: CacheQuery, answer: CachedAnswer, rs: RouteCacheSettings | None
    ) -> bool:
        return (
            (rs is None or rs.enabled is not False)
            and answer.finish_reason in STORABLE_FINISH_REASONS
            and self.settings.stores_temperature(query.temperature)
        )

    # --- admin ---------------------------------------------------------------------------

    def hit_query(self, entry_id: str) -> str | None:
        """The question the entry's latest semantic hit on this replica answered, if kept."""
        return self._hit_queries.get(entry_id)

    async def invalidate(self, entry_id: str) -> bool:
        """Remove one entry everywhere. Raises StoreUnavailable when the store is down."""
        deleted = await self._store.delete([entry_id])
        held = self.tables.get(entry_id) is not None
        await self.tables.delete([entry_id])
        return bool(deleted) or held

    async def purge(self, tenant: str | None = None, route: str | None = None) -> int:
        """Remove every entry of a tenant and/or route; None matches any. Raises
        StoreUnavailable when the store is down."""
        ids = set(await self._store.purge(tenant, route))
        ids.update(self.tables.matching(tenant, route))
        await self.tables.delete(list(ids))
        return len(ids)

    async def reconcile(self) -> int:
        """Forget the entries the store no longer holds (a Redis FLUSHALL or eviction sends no
        event, so the tables would go on counting them); returns how many. Hits never needed
        this (a hit whose answer is gone is a miss), the figures do. Raises StoreUnavailable
        when the store is down."""
        gone = await self._store.missing(self.tables.matching(None, None))
        await self.tables.delete(gone)
        return len(gone)

    def reconfigure(self, settings: CacheSettings) -> bool:
        """Take a reloaded policy's cache section. False: the store or index settings
        changed, and only a new cache (close this one, open another) can apply them."""
        fixed = ("store", "path", "redis_url", "redis_prefix", "approximate_above")
        fixed += ("verifier_model",)  # another verifier: a new cache loads it
        if any(getattr(settings, k) != getattr(self.settings, k) for k in fixed):
            return False
        self.settings = settings
        return True

    @property
    def records(self) -> Store:
        """The store itself, for the small records kept beside the entries (stored API
        responses): one place for what replicas share."""
        return self._store

    def info(self) -> dict:
        return {
            **self.tables.stats(),
            "store": self._store.info(),
        }

    async def close(self) -> None:
        """Stop the background work and close the store; bounded, so a shutdown never hangs
        on a store that stopped answering."""
        await stop_task(self._sweeper)
        if self._touches:
            await asyncio.wait(list(self._touches), timeout=CLOSE_WAIT_S)
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self._store.close()
        except TimeoutError:
            logger.warning("semantic cache store did not close within %gs", CLOSE_WAIT_S)
        self.tables.close()
        self._verify_thread.shutdown(wait=False)
        closing = getattr(self._verifier, "close", None)
        if closing is not None:
            await closing()

    # --- helpers -----------------------------------------------------------------------

    async def _fetch(self, entry_id: str) -> CachedAnswer | None:
        answer = await self._store.get(entry_id)
        if answer is None:  # gone from the store (evicted, expired, deleted elsewhere)
            await self.tables.delete([entry_id])
            return None
        # Recency is bookkeeping: the hit does not wait for it.
        touch = asyncio.create_task(self._touch(entry_id, time.time()))
        self._touches.add(touch)
        touch.add_done_callback(self._touches.discard)
        return answer

    def _remember_hit(self, entry_id: str, text: str) -> None:
        self._hit_queries[entry_id] = text
        self._hit_queries.move_to_end(entry_id)
        if len(self._hit_queries) > HIT_QUERIES_KEPT:
            self._hit_queries.popitem(last=False)

    async def _touch(self, entry_id: str, now: float) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self._store.touch(entry_id, now)

    async def sweep(self) -> int:
        """Remove expired entries from memory and the store; returns how many."""
        expired = self.tables.expired(time.time())
        if expired:
            await self.tables.delete(expired)
            with contextlib.suppress(StoreUnavailable):
                await self._store.forget_expired(expired)
        return len(expired)

    async def _load(self) -> bool:
        try:
            await self.tables.replace_all(await self._store.load())
        except StoreUnavailable as exc:
            logger.warning("semantic cache store unavailable: %s", exc)
            return False
        self._loaded = True
        return True

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                if not self._loaded:  # a store that failed to open: try it again
                    await self._load()
                await self.sweep()
            except Exception:  # one failed sweep must not end sweeping
                logger.exception("cache sweep failed")


def _setting(value: object, default: object) -> object:
    return default if value is None else value


def _make_store(settings: CacheSettings) -> Store:
    if settings.store == "redis":
        from gateway.cache.store_redis import RedisStore

        return RedisStore(settings.redis_url, settings.redis_prefix)
    from gateway.cache.store_sqlite import SqliteStore

    return SqliteStore(settings.sqlite_path())
