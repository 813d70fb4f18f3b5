"""Which store keeps the traffic samples: the one the policy's cache section names."""

from gateway.cache.samples import SampleStore
from gateway.cache.samples_redis import RedisSamples
from gateway.cache.samples_sqlite import SqliteSamples
from gateway.policy import CacheSettings


def store_key(cache: CacheSettings) -> tuple:
    """What decides which store the samples go to: a reload that changes it reopens it."""
    if cache.store == "redis":
        return ("redis", cache.redis_url, cache.redis_prefix)
    return ("embedded", str(cache.sqlite_path()))


def open_sample_store(cache: CacheSettings) -> SampleStore:
    """The samples' store beside the cache's entries, as the cache section names it."""
    if cache.store == "redis":
        assert cache.redis_url is not None  # the schema requires it for `store: redis`
        return RedisSamples(cache.redis_url, cache.redis_prefix)
    return SqliteSamples(cache.sqlite_path())
