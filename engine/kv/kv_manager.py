"""Per-sequence page tables over the page pool and the prefix cache.

Only the last page of a sequence can be partly full. A full page enters the prefix cache
only after its K/V have been computed, so a page another request reuses is always valid.
"""

from engine.kv.page_pool import PagePool
from engine.kv.prefix_cache import PrefixCache, hash_page
from engine.sequence import Sequence


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool) -> None:
        self.page_size = page_size
        self.cache = PrefixCache() if enable_prefix_caching else None
        self.pool = PagePool(num_pages, self.cache)

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    def num_free(self) -> int:
        return self.pool.num_free()

    def usage(self) -> float:
        return self.pool.usage()

    def _ensure_keys(self, seq: Sequence, num_pages: int) -> None:
        ps = self.page_size
        while len(seq.page_keys) < num_pages:
            i = len(seq.page_keys)
            parent = seq.page_keys[-1] if i else None
            tokens = seq.token_ids[i * ps : (i + 1) * ps]
            seq.page_keys.append(hash_page(parent, tokens, seq.cache_salt))

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Pages of the longest cached prefix, leaving at least one token to compute."""
        if self.cache is None:
            return []
        max_pages = (seq.num_tokens - 1) // self.page_size
        self._ensure_keys(seq, max_pages)
        pages: list[int] = []
        for key in seq.page_keys[:max_pages]:
            page = self.cache.lookup(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def can_admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Enough pages for the cached prefix plus num_new_tokens more?"""
        total = len(hits) * self.page_size + num_new_tokens
        needed = _cdiv(total, self.page_size) - len(hits)
        parked_hits = sum(1 for p in hits if self.pool.ref_counts[p] == 0)
        return needed <= self.pool.num_free() - parked_hits  # reusing parked pages uses them up

    def admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> None:
        assert not seq.page_table and seq.num_computed_tokens == 0
        for page in hits:
            self.pool.acquire(page)
        seq.page_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.page_size
        seq.num_registered_pages = len(hits)
        self.grow(seq, num_new_tokens)

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        total = seq.num_computed_tokens + num_new_tokens
        return _cdiv(total, self.page_size) - len(seq.page_table) <= self.pool.num_free()

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Allocate pages so num_new_tokens more tokens fit after the computed ones."""
        total = seq.num_computed_tokens + num_new_tokens
        while len(seq.page_table) < _cdiv(total, self.page_size):
            seq.page_table.append(self.pool.allocate())

    def register_full_pages(self, seq: Sequence) -> None:
        """Publish pages that became full and computed; call after num_computed_tokens grows."""
        if self.cache is None:
            return
        full = seq.num_computed_tokens // self.page_size
        self._ensure_keys(seq, full)
        for i in range(seq.num_registered_pages, full):
            # False when the same content was computed by another request in the same step:
            # that copy stays cached; this page is simply freed later.
            self.cache.insert(seq.page_keys[i], seq.page_table[i])
        seq.num_registered_pages = max(seq.num_registered_pages, full)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's pages (tail first, so tails are evicted before shared heads)."""
        for page in reversed(seq.page_table):
            self.pool.release(page)
        seq.page_table = []
        seq.num_computed_tokens = 0
        seq.num_registered_pages = 0
