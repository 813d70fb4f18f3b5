"""KV pages: the free list, reference counts, and the index of cached full pages.

A page is in exactly one of three states:
- free: on the free list, holds nothing useful;
- in use: ref_count > 0 (held by one or more sequences; shared pages are full and read-only);
- parked: ref_count == 0 but its contents are cached under a key; evicted (least recently
  released first) only when the free list is empty, so a page in use is never evicted.

The pool knows pages and keys only; which sequence holds what is the KV manager's business
(engine/kv/kv_manager.py), and nothing here calls back into it.
"""

from collections import OrderedDict, deque


class PagePool:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError("the KV pool needs at least one page")
        self.num_pages = num_pages
        self._ref_counts = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._page_of: dict[bytes, int] = {}  # key -> cached page
        self._key_of: dict[int, bytes] = {}  # cached page -> key
        self._parked: OrderedDict[int, None] = OrderedDict()  # cached, unheld; oldest first

    def num_free(self) -> int:
        """Pages allocate() can hand out now: free ones plus parked (evictable) ones."""
        return len(self._free) + len(self._parked)

    def num_in_use(self) -> int:
        return self.num_pages - self.num_free()

    def usage(self) -> float:
        """Fraction of pages held by sequences (parked pages count as free)."""
        return self.num_in_use() / self.num_pages

    def lookup(self, key: bytes) -> int | None:
        """The cached page holding key's contents, held or parked."""
        return self._page_of.get(key)

    def is_parked(self, page: int) -> bool:
        return page in self._parked

    def allocate(self) -> int:
        """A page with ref_count 1; prefers never-cached pages to keep the cache warm.
        The caller checks num_free() first (the KV manager refuses whole requests)."""
        if not self._free and not self._parked:
            raise RuntimeError("KV pool exhausted: the caller must check num_free() first")
        page = self._free.popleft() if self._free else self._evict_oldest()
        self._ref_counts[page] = 1
        return page

    def acquire(self, page: int) -> None:
        """Take one more reference on a cached page (a prefix hit); unparks it."""
        assert page in self._key_of, f"page {page} is not cached"
        self._parked.pop(page, None)
        self._ref_counts[page] += 1

    def release(self, page: int) -> None:
        assert self._ref_counts[page] > 0, f"double free of page {page}"
        self._ref_counts[page] -= 1
        if self._ref_counts[page] > 0:
            return
        if page in self._key_of:
            self._parked[page] = None  # reusable until the pool needs the room
        else:
            self._free.append(page)

    def publish(self, key: bytes, page: int) -> bool:
        """Cache a just-computed full page under key; False if the key or page is known
        (the same content computed by two requests in one step: the first copy stays)."""
        if key in self._page_of or page in self._key_of:
            return False
        self._page_of[key] = page
        self._key_of[page] = key
        return True

    def reset_cache(self) -> None:
        """Forget every parked page's contents and return it to the free list."""
        while self._parked:
            self._free.append(self._evict_oldest())

    def _evict_oldest(self) -> int:
        page, _ = self._parked.popitem(last=False)
        del self._page_of[self._key_of.pop(page)]
        return page
