"""KV pages: a free list and reference counts, with cached pages parked in the prefix cache.

A page is in exactly one of three states:
- free: on the free list, holds nothing useful;
- in use: ref_count > 0 (held by one or more sequences; shared pages are full and read-only);
- parked: ref_count == 0 but its contents are cached under a key; evicted (LRU) only when
  the free list is empty, so a page in use is never evicted.
"""

from collections import deque

from engine.kv.prefix_cache import PrefixCache


class OutOfPagesError(RuntimeError):
    """Raised by allocate() when no free or parked page is left (callers check first)."""


class PagePool:
    def __init__(self, num_pages: int, cache: PrefixCache | None = None) -> None:
        if num_pages < 1:
            raise ValueError("the KV pool needs at least one page")
        self.num_pages = num_pages
        self.cache = cache
        self.ref_counts = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))

    def num_free(self) -> int:
        """Pages allocate() can hand out now: free ones plus parked (evictable) ones."""
        parked = self.cache.num_unused() if self.cache else 0
        return len(self._free) + parked

    def usage(self) -> float:
        """Fraction of pages held by sequences (parked pages count as free)."""
        return 1.0 - self.num_free() / self.num_pages

    def allocate(self) -> int:
        """A page with ref_count 1; prefers never-cached pages to keep the cache warm."""
        if self._free:
            page = self._free.popleft()
        elif self.cache and (page := self.cache.evict()) is not None:
            pass
        else:
            raise OutOfPagesError("KV pool exhausted")
        self.ref_counts[page] = 1
        return page

    def acquire(self, page: int) -> None:
        """Take one more reference on a page (a prefix-cache hit)."""
        if self.ref_counts[page] == 0:
            assert self.cache is not None and self.cache.is_cached(page), "not a cached page"
            self.cache.unpark(page)
        self.ref_counts[page] += 1

    def release(self, page: int) -> None:
        assert self.ref_counts[page] > 0, f"double free of page {page}"
        self.ref_counts[page] -= 1
        if self.ref_counts[page] > 0:
            return
        if self.cache and self.cache.is_cached(page):
            self.cache.park(page)
        else:
            self._free.append(page)

    def reset_cache(self) -> None:
        """Return all parked pages to the free list (their contents are forgotten)."""
        if self.cache:
            self._free.extend(self.cache.clear_unused())
