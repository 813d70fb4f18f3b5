"""Page pool: free list, reference counts, parked cached pages and LRU eviction."""

import pytest

from engine.kv import PagePool, PrefixCache
from engine.kv.page_pool import OutOfPagesError


def test_allocate_release_roundtrip() -> None:
    pool = PagePool(4)
    pages = [pool.allocate() for _ in range(4)]
    assert sorted(pages) == [0, 1, 2, 3]
    assert pool.num_free() == 0 and pool.usage() == 1.0
    with pytest.raises(OutOfPagesError):
        pool.allocate()
    for p in pages:
        pool.release(p)
    assert pool.num_free() == 4 and pool.usage() == 0.0


def test_shared_page_freed_by_last_holder() -> None:
    cache = PrefixCache()
    pool = PagePool(2, cache)
    page = pool.allocate()
    cache.insert(b"k", page)
    pool.acquire(page)  # a second sequence shares it
    pool.release(page)
    assert pool.ref_counts[page] == 1 and pool.num_free() == 1
    pool.release(page)
    assert pool.num_free() == 2 and cache.num_unused() == 1  # parked, still cached
    with pytest.raises(AssertionError):
        pool.release(page)


def test_parked_pages_evicted_lru_only_when_free_list_empty() -> None:
    cache = PrefixCache()
    pool = PagePool(3, cache)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    cache.insert(b"a", a)
    cache.insert(b"b", b)
    pool.release(b)  # b parked first: evicted first
    pool.release(a)
    pool.release(c)  # never cached: back on the free list, handed out before any eviction
    assert pool.allocate() == c
    assert cache.lookup(b"a") == a and cache.lookup(b"b") == b
    assert pool.allocate() == b  # least recently released
    assert cache.lookup(b"b") is None and cache.lookup(b"a") == a


def test_page_in_use_is_never_evicted() -> None:
    cache = PrefixCache()
    pool = PagePool(2, cache)
    a, b = pool.allocate(), pool.allocate()
    cache.insert(b"a", a)
    pool.release(a)
    pool.acquire(a)  # reused from the cache: in use again, so not evictable
    assert pool.num_free() == 0
    with pytest.raises(OutOfPagesError):
        pool.allocate()
    pool.release(a)
    pool.release(b)
    pool.reset_cache()
    assert pool.num_free() == 2 and cache.num_cached() == 0
