"""Page pool: free list, reference counts, the cached-page index and LRU eviction."""

import pytest

from engine.kv.page_pool import PagePool


def test_allocate_release_roundtrip() -> None:
    pool = PagePool(4)
    pages = [pool.allocate() for _ in range(4)]
    assert sorted(pages) == [0, 1, 2, 3]
    assert pool.num_free() == 0 and pool.usage() == 1.0
    with pytest.raises(RuntimeError):
        pool.allocate()
    for p in pages:
        pool.release(p)
    assert pool.num_free() == 4 and pool.usage() == 0.0


def test_shared_page_freed_by_last_holder() -> None:
    pool = PagePool(2)
    page = pool.allocate()
    assert pool.publish(b"k", page)
    pool.acquire(page)  # a second sequence shares it
    pool.release(page)
    assert pool.num_in_use() == 1 and pool.num_free() == 1
    pool.release(page)
    assert pool.num_free() == 2 and pool.is_parked(page) and pool.lookup(b"k") == page
    with pytest.raises(AssertionError):
        pool.release(page)


def test_publish_refuses_a_known_key_or_page() -> None:
    pool = PagePool(2)
    a, b = pool.allocate(), pool.allocate()
    assert pool.publish(b"k", a)
    assert not pool.publish(b"k", b)  # same content computed twice: the first copy stays
    assert not pool.publish(b"other", a)
    assert pool.lookup(b"k") == a and pool.lookup(b"other") is None
    pool.release(b)
    assert pool.num_free() == 1 and not pool.is_parked(b)  # never cached: plain free


def test_parked_pages_evicted_lru_only_when_free_list_empty() -> None:
    pool = PagePool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    pool.publish(b"a", a)
    pool.publish(b"b", b)
    pool.release(b)  # b parked first: evicted first
    pool.release(a)
    pool.release(c)  # never cached: back on the free list, handed out before any eviction
    assert pool.allocate() == c
    assert pool.lookup(b"a") == a and pool.lookup(b"b") == b
    assert pool.allocate() == b  # least recently released
    assert pool.lookup(b"b") is None and pool.lookup(b"a") == a


def test_page_in_use_is_never_evicted() -> None:
    pool = PagePool(2)
    a, b = pool.allocate(), pool.allocate()
    pool.publish(b"a", a)
    pool.release(a)
    pool.acquire(a)  # reused from the cache: in use again, so not evictable
    assert pool.num_free() == 0 and not pool.is_parked(a)
    with pytest.raises(RuntimeError):
        pool.allocate()
    pool.release(a)
    pool.release(b)
    pool.reset_cache()
    assert pool.num_free() == 2 and pool.lookup(b"a") is None and not pool.is_parked(a)
