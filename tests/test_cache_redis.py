"""The semantic cache on a real redis-server: replicas in step, outages bypassed, reconnects."""

import asyncio
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
from redis.asyncio import Redis

from gateway.cache.semantic import CachedAnswer, CacheQuery, Embed, Lookup, SemanticCache
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings
from tests.servers import free_port, redis_server, start_redis_server

ANSWER = CachedAnswer("Paris.", "stop", 12, 3, "small", "smollm2-135m", None)


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    return Embedder(max_wait_ms=0)


@pytest.fixture
async def opened(embedder: Embedder) -> AsyncIterator[Callable[..., Awaitable[SemanticCache]]]:
    caches: list[SemanticCache] = []
    prefix = f"test:{uuid.uuid4().hex}"  # each test its own keys on the shared server

    async def open_cache(url: str, **overrides: object) -> SemanticCache:
        settings = CacheSettings(enabled=True, store="redis", redis_url=url, redis_prefix=prefix,
                                 verifier="off", min_similarity=0.75, **overrides)  # fmt: skip
        cache = await SemanticCache.open(settings, embedder, None)
        caches.append(cache)
        return cache

    yield open_cache
    for cache in caches:
        await cache.close()


def embed_of(embedder: Embedder, text: str) -> Embed:
    async def embed() -> np.ndarray:
        return await embedder.embed(text)

    return embed


def query(text: str) -> CacheQuery:
    return CacheQuery("scope-1", "tenant-1", "auto", text, None)


async def ask(cache: SemanticCache, embedder: Embedder, text: str) -> Lookup:
    return await cache.lookup(query(text), embed_of(embedder, text), cache.settings.for_route(None))


async def put(cache: SemanticCache, embedder: Embedder, text: str) -> str | None:
    return await cache.store(query(text), embed_of(embedder, text), ANSWER, None)


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"not true within {within_s}s"
        await asyncio.sleep(0.02)


async def test_two_caches_see_each_others_inserts_and_deletes(opened, embedder, redis_url) -> None:
    a, b = await opened(redis_url), await opened(redis_url)
    text = "What is the capital of France?"
    entry_id = await put(a, embedder, text)

    async def b_hits() -> bool:
        return (await ask(b, embedder, text)).entry_id == entry_id

    await eventually(b_hits, within_s=1.0)
    paraphrase = await ask(b, embedder, "Tell me the capital city of France")
    assert paraphrase.outcome == "semantic" and paraphrase.answer == ANSWER

    assert await b.invalidate(entry_id)

    async def a_forgot() -> bool:
        return a.info()["entries"] == 0

    await eventually(a_forgot, within_s=1.0)
    assert (await ask(a, embedder, text)).outcome == "miss"

    kept = await put(b, embedder, "How do magnets work?")
    fresh = await opened(redis_url)  # rebuilds its tables from Redis at start
    assert fresh.info()["entries"] == 1
    assert (await ask(fresh, embedder, "How do magnets work?")).entry_id == kept
    assert await fresh.purge(tenant="tenant-1") == 1

    async def all_forgot() -> bool:
        return a.info()["entries"] == b.info()["entries"] == 0

    await eventually(all_forgot, within_s=1.0)


async def test_replicas_forget_what_a_flushall_dropped(opened, embedder) -> None:
    # A FLUSHALL sends no event: before the generation key, each follower kept every lost
    # entry in its tables (and FAISS index) until a lookup or /admin/cache stumbled on it.
    with redis_server() as server:  # its own server: a FLUSHALL drops every test's keys
        a, b = await opened(server.url), await opened(server.url)
        for text in ("What is the capital of France?", "How do magnets work?"):
            await put(a, embedder, text)

        async def both_hold(count: int) -> bool:
            return a.info()["entries"] == b.info()["entries"] == count

        await eventually(lambda: both_hold(2), within_s=2.0)
        resyncs = b.info()["store"]["resyncs"]
        client = Redis.from_url(server.url)
        await client.flushall()
        await client.aclose()
        await eventually(lambda: both_hold(0), within_s=5.0)  # no lookup, no reconcile
        assert b.info()["store"]["resyncs"] > resyncs and b.info()["store"]["healthy"]

        kept = await put(b, embedder, "Why is the sky blue?")  # following goes on after it

        async def a_hits() -> bool:
            return (await ask(a, embedder, "Why is the sky blue?")).entry_id == kept

        await eventually(a_hits, within_s=2.0)
        assert await both_hold(1)


async def test_lru_bound_is_shared_by_replicas(opened, embedder, redis_url) -> None:
    a, b = await opened(redis_url, max_entries=2), await opened(redis_url, max_entries=2)
    first = await put(a, embedder, "How do magnets work?")
    second = await put(b, embedder, "Why is the sky blue?")

    async def b_hits_first() -> bool:  # a hit through one replica refreshes it for all
        return (await ask(b, embedder, "How do magnets work?")).entry_id == first

    await eventually(b_hits_first, within_s=1.0)
    await put(a, embedder, "What causes tides?")

    async def second_evicted_everywhere() -> bool:
        gone = all(c.tables.get(second) is None for c in (a, b))
        return gone and a.info()["entries"] == b.info()["entries"] == 2

    await eventually(second_evicted_everywhere, within_s=1.0)
    assert (await ask(a, embedder, "How do magnets work?")).entry_id == first


async def test_ttl_expires_on_every_replica(opened, embedder, redis_url) -> None:
    a, b = await opened(redis_url), await opened(redis_url)
    text = "What is the capital of France?"
    entry_id = await a.store(query(text), embed_of(embedder, text), ANSWER, ttl_s=0.5)

    async def b_hits() -> bool:
        return (await ask(b, embedder, text)).entry_id == entry_id

    await eventually(b_hits, within_s=1.0)
    await asyncio.sleep(0.6)
    for replica in (a, b):
        assert (await ask(replica, embedder, text)).outcome == "miss"


async def test_redis_down_bypasses_and_recovers_without_a_restart(opened, embedder) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="tiergate-redis-") as workdir:
        unreachable = await opened(url)  # nothing listens yet: opening must not fail
        assert (await ask(unreachable, embedder, "hello")).reason == "store_unavailable"
        assert await put(unreachable, embedder, "hello") is None

        server = start_redis_server(port, workdir)
        try:
            text = "What is the capital of France?"

            async def works() -> bool:
                return await put(unreachable, embedder, text) is not None

            await eventually(works, within_s=30)
            assert (await ask(unreachable, embedder, text)).outcome == "exact"

            server.kill()
            server.wait()

            async def bypassed() -> bool:
                result = await ask(unreachable, embedder, text)
                return (result.outcome, result.reason) == ("bypass", "store_unavailable")

            await eventually(bypassed, within_s=30)  # every call on the way returned, none raised
            assert await put(unreachable, embedder, "How do magnets work?") is None

            server = start_redis_server(port, workdir)  # empty: the entries are gone
            await eventually(works, within_s=30)
            assert (await ask(unreachable, embedder, text)).outcome == "exact"
            assert (await ask(unreachable, embedder, "How do magnets work?")).outcome == "miss"
            assert unreachable.info()["store"]["resyncs"] >= 2
        finally:
            server.kill()
            server.wait()
