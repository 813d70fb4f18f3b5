"""The semantic cache over the embedded SQLite store, with the real embedder."""

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gateway.cache.semantic import (
    CachedAnswer,
    CacheQuery,
    Embed,
    Lookup,
    SemanticCache,
    Verdict,
    Verifier,
)
from gateway.cache.verifier import PairVerifier
from gateway.embedding.embedder import Embedder
from gateway.policy import CacheSettings, RouteCacheSettings


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    return Embedder(max_wait_ms=0)


class Embeds:
    """The caller's memoised `embed`: counts how often the cache asked for a vector."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.calls = 0

    def __call__(self, text: str) -> Embed:
        async def embed() -> np.ndarray:
            self.calls += 1
            return await self.embedder.embed(text)

        return embed


class NumbersMustMatch:
    """A stand-in verifier: refuses candidates whose numbers differ, else a plain threshold."""

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = threshold
        self.calls: list[tuple[str, str, str]] = []
        self.thresholds: list[float | None] = []  # the calibrated threshold each call got

    def verify(
        self, query: str, candidate: str, cosine: float, strictness: str, threshold=None, reads=None
    ) -> Verdict:
        self.calls.append((query, candidate, strictness))
        self.thresholds.append(threshold)
        if re.findall(r"\d+", query) != re.findall(r"\d+", candidate):
            return Verdict(False, 0.0, "numbers differ")
        return Verdict(cosine >= self.threshold, cosine, "below threshold")


class Broken:
    def verify(
        self, query: str, candidate: str, cosine: float, strictness: str, threshold=None, reads=None
    ) -> Verdict:
        raise RuntimeError("model file missing")


def settings_for(path: Path, **overrides: object) -> CacheSettings:
    values = {"enabled": True, "path": str(path / "cache.sqlite3"), "min_similarity": 0.75}
    return CacheSettings(**{**values, **overrides})


def query(
    text: str, scope: str = "s1", tenant: str = "t1", route: str = "auto", **kw
) -> CacheQuery:
    return CacheQuery(scope, tenant, route, text, kw.pop("max_tokens", None), **kw)


def answer(
    text: str = "Paris.", finish: str = "stop", tokens: int = 3, limit: int | None = None
) -> CachedAnswer:
    return CachedAnswer(text, finish, 12, tokens, "small", "smollm2-135m", limit)


@pytest.fixture
async def opened(tmp_path: Path, embedder: Embedder) -> AsyncIterator:
    caches: list[SemanticCache] = []

    async def open_cache(checker: Verifier | None = None, **overrides: object) -> SemanticCache:
        cache = await SemanticCache.open(settings_for(tmp_path, **overrides), embedder, checker)
        caches.append(cache)
        return cache

    yield open_cache
    for cache in caches:
        await cache.close()


async def put(cache: SemanticCache, embeds: Embeds, text: str, **kw) -> str:
    stored = kw.pop("ans", answer())
    entry_id = await cache.store(query(text, **kw), embeds(text), stored, None)
    assert entry_id is not None
    return entry_id


async def ask(
    cache: SemanticCache, embeds: Embeds, text: str, route: RouteCacheSettings | None = None, **kw
) -> Lookup:
    route = route or cache.settings.for_route(None)
    return await cache.lookup(query(text, **kw), embeds(text), route)


async def test_exact_hit_needs_no_embedding_then_semantic_then_miss(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    assert (await ask(cache, embeds, "What is the capital of France?")).outcome == "miss"
    entry_id = await put(cache, embeds, "What is the capital of France?")
    embeds.calls = 0
    exact = await ask(cache, embeds, "  What is the capital\tof  France? ")
    assert (exact.outcome, exact.entry_id, exact.similarity) == ("exact", entry_id, 1.0)
    assert exact.answer.text == "Paris." and embeds.calls == 0
    semantic = await ask(cache, embeds, "Tell me the capital city of France")
    assert semantic.outcome == "semantic" and semantic.entry_id == entry_id
    assert 0.75 <= semantic.similarity < 1.0 and embeds.calls == 1
    miss = await ask(cache, embeds, "How do I bake sourdough bread?")
    assert miss.outcome == "miss" and miss.similarity < 0.75


async def test_only_spacing_makes_an_exact_repeat(opened, embedder) -> None:
    """An exact hit skips the verifier: case, Unicode forms and punctuation can change the
    question, so texts that differ in them are left to the verifier."""
    cache, embeds = await opened(PairVerifier.load()), Embeds(embedder)
    stored = {
        "What is 2³?": ["What is 23?", "What is 2?"],
        "Compute 10!": ["Compute 10", "compute 10"],
        "Convert to lowercase: Hello World": ["convert to lowercase: hello world"],
        "What is ½ of 10?": ["What is 1⁄2 of 10?"],
        "Straße": ["STRASSE", "strasse"],
    }
    for text, others in stored.items():
        await put(cache, embeds, text)
        assert (await ask(cache, embeds, f" {text.replace(' ', '  ')}\n")).outcome == "exact"
        for other in others:
            found = await ask(cache, embeds, other)
            assert found.outcome == "miss" and found.answer is None, (text, other, found)


async def test_a_scope_never_sees_another_scopes_entries(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    await put(cache, embeds, "What is the capital of France?", scope="tenant-a", tenant="a")
    for text in ("What is the capital of France?", "Tell me the capital city of France"):
        result = await ask(cache, embeds, text, scope="tenant-b", tenant="b")
        assert result.outcome == "miss" and result.similarity is None


async def test_verifier_refusals_are_counted_and_the_floor_alone_would_hit(
    opened, embedder
) -> None:
    verifier = NumbersMustMatch()
    cache, embeds = await opened(verifier), Embeds(embedder)
    await put(cache, embeds, "What is 2+2?")
    refused = await ask(cache, embeds, "What is 2+3?")
    assert (refused.outcome, refused.refused, refused.reason) == ("miss", 1, "numbers differ")
    assert verifier.calls == [("What is 2+3?", "What is 2+2?", "balanced")]
    floor_only = RouteCacheSettings(enabled=True, min_similarity=0.75, verifier="off")
    assert (await ask(cache, embeds, "What is 2+3?", route=floor_only)).outcome == "semantic"
    accepted = await ask(cache, embeds, "what's 2+2 ?")
    assert accepted.outcome in ("exact", "semantic") and accepted.answer is not None


class ManyAtOnce:
    """A verifier that scores a lookup's candidates in one call (as the pair model does)."""

    def __init__(self, accept: str | None = None, broken: bool = False) -> None:
        self.accept, self.broken = accept, broken
        self.calls: list[list[str]] = []

    async def verify_many(self, query: str, candidates: list[str], strictness: str, threshold):
        self.calls.append(candidates)
        if self.broken:
            raise RuntimeError("model file missing")
        return [Verdict(c == self.accept, 0.9, "ok") for c in candidates]


async def test_a_calibrated_threshold_reaches_the_verifier_route_first(opened, embedder) -> None:
    verifier = NumbersMustMatch()
    cache, embeds = await opened(verifier, verifier_threshold=0.42), Embeds(embedder)
    await put(cache, embeds, "What is 2+2?")
    await ask(cache, embeds, "what's 2+2 ?")
    route = cache.settings.for_route(None).model_copy(update={"verifier_threshold": 0.9})
    await ask(cache, embeds, "what's 2+2 ?", route=route)
    assert verifier.thresholds == [0.42, 0.9]


async def test_a_broken_verifier_refuses_instead_of_raising(opened, embedder) -> None:
    for broken in (Broken(), ManyAtOnce(broken=True)):
        cache, embeds = await opened(broken), Embeds(embedder)
        await put(cache, embeds, "What is the capital of France?")
        result = await ask(cache, embeds, "Tell me the capital city of France")
        assert result.outcome == "miss" and result.reason.startswith("verifier_failed")


async def test_a_lookups_candidates_are_verified_in_one_call(opened, embedder) -> None:
    stored = ["What is the capital of France?", "Which city is the capital of France?"]
    verifier = ManyAtOnce(accept=stored[1])
    cache, embeds = await opened(verifier), Embeds(embedder)
    ids = [await put(cache, embeds, text) for text in stored]
    found = await ask(cache, embeds, "Tell me the capital city of France")
    assert len(verifier.calls) == 1 and sorted(verifier.calls[0]) == sorted(stored)
    assert (found.outcome, found.entry_id) == ("semantic", ids[1])


async def test_a_one_pair_verifier_stops_at_the_candidate_it_serves(opened, embedder) -> None:
    stored = ["What is the capital of France?", "Which city is the capital of France?"]
    verifier = NumbersMustMatch()
    cache, embeds = await opened(verifier), Embeds(embedder)
    for text in stored:
        await put(cache, embeds, text)
    found = await ask(cache, embeds, "Tell me the capital city of France")
    assert found.outcome == "semantic" and len(verifier.calls) == 1
    missed = await ask(cache, embeds, "Tell me the capital city of France in 1900")
    assert missed.outcome == "miss" and missed.refused == len(verifier.calls) - 1 == 2


async def test_entries_expire_after_their_ttl(opened, embedder, tmp_path) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    short = await cache.store(query("What is a KV cache?"), embeds("What is a KV cache?"),
                              answer(), ttl_s=0.3)  # fmt: skip
    route = RouteCacheSettings(enabled=True, ttl_s=1000)
    kept = await cache.store(query("Define paged attention"), embeds("Define paged attention"),
                             answer(), None, route)  # fmt: skip
    assert (await ask(cache, embeds, "What is a KV cache?")).entry_id == short
    await asyncio.sleep(0.4)
    assert (await ask(cache, embeds, "What is a KV cache?")).outcome == "miss"
    assert await cache.sweep() == 1 and cache.info()["entries"] == 1
    await cache.close()
    reopened = await opened(verifier="off")
    assert reopened.info()["entries"] == 1
    assert (await ask(reopened, embeds, "Define paged attention")).entry_id == kept


async def test_lru_bound_evicts_the_least_recently_used(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off", max_entries=3), Embeds(embedder)
    texts = ["How do magnets work?", "Best way to learn Rust?", "Why is the sky blue?"]
    ids = [await put(cache, embeds, t) for t in texts]
    assert (await ask(cache, embeds, texts[0])).outcome == "exact"  # refreshes the first
    await put(cache, embeds, "What causes tides?")
    assert cache.info()["entries"] == 3
    assert (await ask(cache, embeds, texts[0])).entry_id == ids[0]
    assert (await ask(cache, embeds, texts[1])).outcome == "miss"  # least recently used
    assert (await ask(cache, embeds, texts[2])).entry_id == ids[2]


async def test_purge_by_tenant_or_route_and_invalidate_one(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    a1 = await put(cache, embeds, "How do magnets work?", scope="a", tenant="a", route="r1")
    await put(cache, embeds, "Why is the sky blue?", scope="a2", tenant="a", route="r2")
    b1 = await put(cache, embeds, "How do magnets work?", scope="b", tenant="b", route="r1")
    await put(cache, embeds, "What causes tides?", scope="b2", tenant="b", route="r2")
    assert await cache.invalidate(a1) and not await cache.invalidate(a1)
    assert await cache.purge(route="r2") == 2
    assert await cache.purge(tenant="a") == 0
    assert (await ask(cache, embeds, "How do magnets work?", scope="b")).entry_id == b1
    assert await cache.purge(tenant="b") == 1 and cache.info()["entries"] == 0


def test_what_an_answer_serves() -> None:
    stop = answer(tokens=40)
    assert stop.serves(None) and stop.serves(40) and stop.serves(100)
    assert not stop.serves(39)  # it would have been cut
    cut = answer(finish="length", tokens=40, limit=40)
    assert cut.serves(40)
    assert not cut.serves(None) and not cut.serves(41)  # the model would have gone on
    assert not cut.serves(20)


async def test_lookups_skip_answers_that_do_not_serve_the_request(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    cut = answer(finish="length", tokens=16, limit=16)
    await put(cache, embeds, "Write a poem about the sea", ans=cut)
    assert (await ask(cache, embeds, "Write a poem about the sea")).outcome == "miss"
    hit = await ask(cache, embeds, "Write a poem about the sea", max_tokens=16)
    assert hit.outcome == "exact" and hit.answer == cut


async def test_only_complete_cool_answers_on_enabled_routes_are_stored(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off", max_temperature=0.7), Embeds(embedder)
    text = "How do magnets work?"
    assert await cache.store(query(text), embeds(text), answer(finish="error"), None) is None
    assert await cache.store(query(text, temperature=1.2), embeds(text), answer(), None) is None
    off = RouteCacheSettings(enabled=False)
    assert await cache.store(query(text), embeds(text), answer(), None, off) is None
    assert await cache.store(query(text), embeds(text), answer(), ttl_s=0) is None
    assert embeds.calls == 0 and cache.info()["entries"] == 0
    assert (await ask(cache, embeds, text, route=off)).reason == "disabled"


async def test_restart_keeps_the_embedded_store(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    entry_id = await put(cache, embeds, "What is the capital of France?")
    await cache.close()
    reopened = await opened(verifier="off")
    assert (await ask(reopened, embeds, "What is the capital of France?")).entry_id == entry_id
    semantic = await ask(reopened, embeds, "Tell me the capital city of France")
    assert semantic.outcome == "semantic" and semantic.answer.text == "Paris."


async def test_a_broken_store_file_is_bypassed_left_alone_and_retried(
    opened, embedder, tmp_path
) -> None:
    garbage = b"this is not an SQLite file" * 100
    (tmp_path / "cache.sqlite3").write_bytes(garbage)
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    result = await ask(cache, embeds, "What is the capital of France?")
    assert (result.outcome, result.reason) == ("bypass", "store_unavailable")
    text = "What is the capital of France?"
    assert await cache.store(query(text), embeds(text), answer(), None) is None
    assert cache.info()["store"]["healthy"] is False
    await asyncio.sleep(1.5)  # the cache retries opening its store meanwhile
    assert (tmp_path / "cache.sqlite3").read_bytes() == garbage

    (tmp_path / "cache.sqlite3").unlink()  # the operator moves the broken file away
    deadline = asyncio.get_running_loop().time() + 30
    while (await ask(cache, embeds, text)).outcome == "bypass":
        assert asyncio.get_running_loop().time() < deadline, "the store never reopened"
        await asyncio.sleep(0.1)
    assert await cache.store(query(text), embeds(text), answer(), None) is not None
    assert (await ask(cache, embeds, text)).outcome == "exact"


async def test_a_failing_embedder_degrades_to_bypass(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    await put(cache, embeds, "What is the capital of France?")

    async def broken() -> np.ndarray:
        raise RuntimeError("embedder thread died")

    route = cache.settings.for_route(None)
    result = await cache.lookup(query("Tell me the capital city of France"), broken, route)
    assert (result.outcome, result.reason) == ("bypass", "embed_failed: RuntimeError")
    exact = await cache.lookup(query("What is the capital of France?"), broken, route)
    assert exact.outcome == "exact"  # the exact table needs no vector
    assert await cache.store(query("How do magnets work?"), broken, answer(), None) is None


async def test_reloaded_settings_apply_unless_the_store_changes(opened, embedder) -> None:
    cache, embeds = await opened(verifier="off"), Embeds(embedder)
    await put(cache, embeds, "What is the capital of France?")
    stricter = cache.settings.model_copy(update={"min_similarity": 0.99})
    assert cache.reconfigure(stricter)
    paraphrase = await ask(cache, embeds, "Tell me the capital city of France")
    assert paraphrase.outcome == "miss"
    moved = cache.settings.model_copy(update={"path": "/elsewhere/cache.sqlite3"})
    assert not cache.reconfigure(moved) and cache.settings.min_similarity == 0.99
    other_model = cache.settings.model_copy(update={"verifier_model": "pair"})
    assert not cache.reconfigure(other_model)  # a new cache loads the other verifier
    with pytest.raises(ValueError, match="verifier_model"):
        CacheSettings(verifier_model="cosine")


async def test_concurrent_stores_lookups_and_deletes_stay_consistent(opened, tmp_path) -> None:
    # Vectors straight from a seeded generator stand in for the caller's memoised embedding.
    cache = await opened(verifier="off", approximate_above=30, max_entries=150)
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((400, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    def vector_of(i: int) -> Embed:
        async def embed() -> np.ndarray:
            return vectors[i]

        return embed

    async def worker(i: int) -> None:
        q = query(f"question {i}", scope=f"s{i % 3}", tenant=f"t{i % 2}")
        await cache.store(q, vector_of(i), answer(f"answer {i}"), None)
        found = await cache.lookup(q, vector_of(i), cache.settings.for_route(None))
        assert found.outcome in ("exact", "miss")  # a miss: evicted by a concurrent store
        if found.outcome == "exact":
            assert found.answer.text == f"answer {i}"
        if i % 7 == 0 and found.entry_id:
            await cache.invalidate(found.entry_id)

    await asyncio.gather(*(worker(i) for i in range(400)))
    assert cache.info()["vectors_by_index_kind"]["ivf"] > 0  # scopes outgrew exact search
    await cache.purge(tenant="t1")
    entries = cache.info()["entries"]
    assert 0 < entries <= 150 and cache.info()["vectors"] == entries
    await cache.close()
    reopened = await opened(verifier="off", approximate_above=30, max_entries=150)
    assert reopened.info()["entries"] == entries  # memory and the store agree
