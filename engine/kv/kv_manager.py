"""The one owner of KV bookkeeping, and the scheduler's whole KV contract: lookup,
allocate-or-refuse, on_computed, free. The page pool beneath it keeps the free list,
reference counts and cached-page index (vLLM v1's KV cache manager over its block pool).

A full page enters the prefix cache only once its K/V are computed, so a reused page is
always valid. Page keys chain the parent's key, the page's tokens and the cache salt: equal
keys mean equal whole prefixes, and tenants with different salts never share (nor can they
time each other's cache hits).
"""

import hashlib
from array import array
from collections.abc import Sequence as Tokens
from dataclasses import dataclass

from engine.kv.page_pool import PagePool
from engine.sequence import Sequence


def hash_page(parent: bytes | None, token_ids: Tokens[int], salt: str | None = None) -> bytes:
    """A collision-resistant key (sha256): Python's hash() could be forced to collide."""
    h = hashlib.sha256()
    h.update(parent if parent is not None else b"root")
    h.update(b"\x00" + (salt or "").encode() + b"\x00")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PrefixHit:
    pages: list[int]  # cached pages of the longest prefix, leaving >= 1 token to compute
    num_tokens: int  # tokens those pages hold
    next_in_flight: bool  # a running sequence is computing the next page of this prefix


@dataclass
class _Held:
    seq: Sequence
    pages: list[int]  # the sequence's page table
    num_published: int  # leading pages already in the prefix cache


class KVManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool) -> None:
        self.page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = PagePool(num_pages)
        self._held: dict[int, _Held] = {}  # seq_id -> pages; exactly the running sequences

    def num_free(self) -> int:
        return self.pool.num_free()

    def usage(self) -> float:
        return self.pool.usage()

    def page_table(self, seq: Sequence) -> list[int]:
        """A copy of the pages seq holds, covering its computed and allocated tokens."""
        return list(self._held[seq.seq_id].pages)

    def lookup(self, seq: Sequence) -> PrefixHit:
        """The longest cached prefix of a sequence that holds no pages yet."""
        if not self.enable_prefix_caching:
            return PrefixHit([], 0, False)
        max_pages = (seq.num_tokens - 1) // self.page_size
        self._ensure_keys(seq, max_pages)
        pages: list[int] = []
        for key in seq.page_keys[:max_pages]:
            page = self.pool.lookup(key)
            if page is None:
                break
            pages.append(page)
        in_flight = len(pages) < max_pages and self._computing(seq.page_keys, len(pages))
        return PrefixHit(pages, len(pages) * self.page_size, in_flight)

    def _computing(self, keys: list[bytes], i: int) -> bool:
        """Is a running sequence computing page i of this key chain right now? Then the
        caller waits a step or two and reuses it instead of computing it again (64
        requests with one long system prompt arrive together: only one computes it)."""
        end = (i + 1) * self.page_size
        return any(
            h.seq.num_computed_tokens < end
            and len(h.seq.page_keys) > i
            and h.seq.page_keys[i] == keys[i]
            for h in self._held.values()
        )

    def allocate(
        self, seq: Sequence, num_new_tokens: int, hit: PrefixHit | None = None, reserve: int = 0
    ) -> bool:
        """Pages so num_new_tokens more tokens of seq fit after its computed ones, all or
        none: False changes nothing. A sequence holding no pages is admitted first, taking
        the hit's cached pages (from lookup() this step) as its computed prefix, and only if
        `reserve` pages stay free after it (the scheduler's admission watermark)."""
        held = self._held.get(seq.seq_id)
        if held is None:
            hits = hit.pages if hit else []
            needed = _cdiv(len(hits) * self.page_size + num_new_tokens, self.page_size) - len(hits)
            parked = sum(1 for p in hits if self.pool.is_parked(p))  # reusing them uses them up
            if needed + reserve > self.pool.num_free() - parked:
                return False
            for page in hits:
                self.pool.acquire(page)
            held = self._held[seq.seq_id] = _Held(seq, list(hits), len(hits))
            seq.num_computed_tokens = len(hits) * self.page_size
        else:
            total = seq.num_computed_tokens + num_new_tokens
            needed = _cdiv(total, self.page_size) - len(held.pages)
            if needed > self.pool.num_free():
                return False
        held.pages.extend(self.pool.allocate() for _ in range(needed))
        return True

    def pages_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """Pages a running seq still needs to hold num_tokens tokens in all."""
        return max(0, _cdiv(num_tokens, self.page_size) - len(self._held[seq.seq_id].pages))

    def on_computed(self, seq: Sequence) -> None:
        """Publish the pages that became full; call after seq.num_computed_tokens grows."""
        if not self.enable_prefix_caching:
            return
        held = self._held[seq.seq_id]
        full = seq.num_computed_tokens // self.page_size
        self._ensure_keys(seq, full)
        for i in range(held.num_published, full):
            self.pool.publish(seq.page_keys[i], held.pages[i])
        held.num_published = max(held.num_published, full)

    def free(self, seq: Sequence) -> None:
        """Drop seq's pages (tail first, so tails are evicted before shared heads)."""
        held = self._held.pop(seq.seq_id, None)
        for page in reversed(held.pages if held else []):
            self.pool.release(page)
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached page no sequence holds (a cold cache on demand)."""
        self.pool.reset_cache()

    def _ensure_keys(self, seq: Sequence, num_pages: int) -> None:
        ps = self.page_size
        while len(seq.page_keys) < num_pages:
            i = len(seq.page_keys)
            parent = seq.page_keys[-1] if i else None
            tokens = seq.token_ids[i * ps : (i + 1) * ps]
            seq.page_keys.append(hash_page(parent, tokens, seq.cache_salt))
