"""Traffic samples in the shared Redis, beside the cache's entries.

Layout under `cache.redis_prefix` (P): `P:samples:<tenant hash>:<route hash>`, a sorted set
of sample JSON by creation time, one per tenant and route (so a tenant's purge is a SCAN of
its own prefix); the key's TTL is the route's retention, renewed on each add, so a route
that stops sampling leaves nothing behind.
"""

from __future__ import annotations  # annotations below name `list` beside a method of that name

import hashlib
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.cache.samples import LIST_LIMIT, Sample
from gateway.cache.store import StoreUnavailable

REQUEST_TIMEOUT_S = 2.0
_ERRORS = (RedisError, OSError)


def _part(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:24]


class RedisSamples:
    kind = "redis"

    def __init__(self, url: str, prefix: str = "tiergate:cache") -> None:
        self.prefix = f"{prefix}:samples"
        self._client = Redis.from_url(
            url, socket_timeout=REQUEST_TIMEOUT_S, socket_connect_timeout=REQUEST_TIMEOUT_S
        )

    def _key(self, tenant: str, route: str) -> str:
        return f"{self.prefix}:{_part(tenant)}:{_part(route)}"

    def _pattern(self, tenant: str | None, route: str | None) -> str:
        return f"{self.prefix}:{_part(tenant) if tenant is not None else '*'}:" + (
            _part(route) if route is not None else "*"
        )

    async def add(self, sample: Sample, max_samples: int) -> None:
        key = self._key(sample.tenant, sample.route)
        ttl_ms = max(1, round((sample.expires_at - time.time()) * 1000))
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.zremrangebyscore(key, "-inf", sample.created_at - ttl_ms / 1000)
                pipe.zadd(key, {sample.to_json(): sample.created_at})
                pipe.zremrangebyrank(key, 0, -max_samples - 1)
                pipe.pexpire(key, ttl_ms)
                await pipe.execute()
        except _ERRORS as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def list(
        self, tenant: str | None, route: str | None, limit: int = LIST_LIMIT
    ) -> list[Sample]:
        now = time.time()
        out: list[Sample] = []
        try:
            for key in await self._keys(tenant, route):
                for raw in await self._client.zrange(key, 0, -1):
                    sample = Sample.from_json(raw)
                    if sample.expires_at > now:
                        out.append(sample)
        except _ERRORS as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        out.sort(key=lambda s: s.created_at)
        return out[:limit]

    async def purge(self, tenant: str | None, route: str | None) -> int:
        removed = 0
        try:
            for key in await self._keys(tenant, route):
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.zcard(key)
                    pipe.delete(key)
                    removed += (await pipe.execute())[0]
        except _ERRORS as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return removed

    async def _keys(self, tenant: str | None, route: str | None) -> list[str]:
        if tenant is not None and route is not None:
            return [self._key(tenant, route)]
        return [k.decode() async for k in self._client.scan_iter(self._pattern(tenant, route))]

    async def close(self) -> None:
        await self._client.aclose()
