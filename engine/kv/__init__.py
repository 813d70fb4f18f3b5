"""KV-cache bookkeeping: the KV manager (the scheduler's contract) over the page pool."""

from engine.kv.kv_manager import KVManager, PrefixHit, hash_page
from engine.kv.page_pool import PagePool

__all__ = ["KVManager", "PagePool", "PrefixHit", "hash_page"]
