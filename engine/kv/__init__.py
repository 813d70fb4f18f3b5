"""KV-cache bookkeeping: the page pool, prefix-page hashing and per-sequence page tables."""

from engine.kv.kv_manager import KVManager
from engine.kv.page_pool import PagePool
from engine.kv.prefix_cache import PrefixCache, hash_page

__all__ = ["KVManager", "PagePool", "PrefixCache", "hash_page"]
