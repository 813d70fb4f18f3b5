"""Content keys for full KV pages, and the LRU of cached pages that no sequence holds.

A page's key chains the parent page's key, its token ids and the request's cache salt,
so two pages share a key only if the whole prefix up to and including them is equal
(and the salt too: tenants with different salts never share, which also closes the
timing side channel a shared prefix cache would open).
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence


def hash_page(parent: bytes | None, token_ids: Sequence[int], salt: str | None = None) -> bytes:
    """A collision-resistant key (sha256): Python's hash() could be forced to collide."""
    h = hashlib.sha256()
    h.update(parent if parent is not None else b"root")
    h.update(b"\x00" + (salt or "").encode() + b"\x00")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class PrefixCache:
    """Maps page keys to page ids; keeps unreferenced cached pages in LRU order."""

    def __init__(self) -> None:
        self._page_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._unused: OrderedDict[int, None] = OrderedDict()  # oldest first

    def lookup(self, key: bytes) -> int | None:
        return self._page_of.get(key)

    def insert(self, key: bytes, page: int) -> bool:
        """Register a just-computed full page; False if the key or the page is already known."""
        if key in self._page_of or page in self._key_of:
            return False
        self._page_of[key] = page
        self._key_of[page] = key
        return True

    def is_cached(self, page: int) -> bool:
        return page in self._key_of

    def park(self, page: int) -> None:
        """The last holder let go: keep the page reusable until the pool needs it."""
        self._unused[page] = None

    def unpark(self, page: int) -> None:
        """A sequence reuses a parked page: it is in use again, so not evictable."""
        self._unused.pop(page, None)

    def evict(self) -> int | None:
        """Forget the least recently released unused page and return it for reuse."""
        if not self._unused:
            return None
        page, _ = self._unused.popitem(last=False)
        del self._page_of[self._key_of.pop(page)]
        return page

    def num_unused(self) -> int:
        return len(self._unused)

    def num_cached(self) -> int:
        return len(self._key_of)

    def clear_unused(self) -> list[int]:
        """Drop every unused cached page (e.g. to reset the cache); returns them."""
        pages = []
        while (page := self.evict()) is not None:
            pages.append(page)
        return pages
