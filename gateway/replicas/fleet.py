"""The Redis side of a fleet of gateway replicas: stats reports and the shared policy.

Keys, under PREFIX (`cache.redis_prefix` + ":replicas": gateways that share cache entries
are one fleet):
  PREFIX:stats:ID   one replica's latest ReplicaReport (JSON), expiring after `ttl_s`, so
                    a replica that died ages out
  PREFIX:members    sorted set of replica ids (score: last report time), to find the above
  PREFIX:policy     hash: version (incremented per publish), sha256, origin, text and
                    signature (HMAC-SHA256 of the text: signing.py)
Every call raises redis' errors; callers degrade (local stats, no sharing) on them.
"""

import hashlib
import logging
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.replicas.report import ReplicaReport

logger = logging.getLogger("tiergate.replicas")

STATS_TTL_S = 15.0


def policy_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SharedPolicy:
    version: int
    text: str
    signature: str | None  # None: published unsigned (or by something that is no replica)


@dataclass(frozen=True)
class PolicyHead:
    """The shared policy's version and who published it (its text is fetched apart)."""

    version: int
    sha256: str | None
    origin: str | None


def _decoded(value: bytes) -> ReplicaReport | None:
    try:
        return ReplicaReport.from_json(value)
    except (ValueError, KeyError, TypeError):  # e.g. a replica of another version
        logger.warning("replicas: skipped a stats report that could not be read")
        return None


class Fleet:
    def __init__(self, url: str, prefix: str, ttl_s: float = STATS_TTL_S) -> None:
        self.url, self.prefix, self.ttl_s = url, prefix, ttl_s
        # Short timeouts, no backoff: an /admin/stats call must not wait long on a dead Redis.
        self._redis = Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 1)
        )
        self._members = f"{prefix}:members"
        self._policy = f"{prefix}:policy"

    def _stats_key(self, replica: str) -> str:
        return f"{self.prefix}:stats:{replica}"

    async def publish_stats(self, report: ReplicaReport) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._stats_key(report.replica), report.to_json(), px=int(self.ttl_s * 1000))
            pipe.zadd(self._members, {report.replica: report.at})
            await pipe.execute()

    async def reports(self, exclude: str) -> list[ReplicaReport]:
        """Every live replica's latest report but `exclude`'s; forgets the dead ones."""
        ids = [i.decode() for i in await self._redis.zrange(self._members, 0, -1)]
        ids = [i for i in ids if i != exclude]
        if not ids:
            return []
        values = await self._redis.mget([self._stats_key(i) for i in ids])
        gone = [i for i, value in zip(ids, values, strict=True) if value is None]
        if gone:
            await self._redis.zrem(self._members, *gone)
        return [r for v in values if v is not None and (r := _decoded(v)) is not None]

    async def forget(self, replica: str) -> None:
        """A replica that stops on purpose leaves the fleet at once."""
        await self._redis.delete(self._stats_key(replica))
        await self._redis.zrem(self._members, replica)

    async def publish_policy(self, text: str, origin: str, signature: str) -> int:
        """Share policy text a replica put in force; returns its version."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self._policy, "version", 1)
            mapping = {
                "sha256": policy_sha256(text),
                "origin": origin,
                "text": text,
                "signature": signature,
            }
            pipe.hset(self._policy, mapping=mapping)
            version, _ = await pipe.execute()
        return int(version)

    async def policy_head(self) -> PolicyHead:
        version, sha, origin = await self._redis.hmget(
            self._policy, ["version", "sha256", "origin"]
        )
        return PolicyHead(
            int(version or 0),
            sha.decode() if sha else None,
            origin.decode() if origin else None,
        )

    async def policy_text(self) -> SharedPolicy | None:
        """The shared policy's version, text and signature, read together."""
        fields = ["version", "text", "signature"]
        version, text, signature = await self._redis.hmget(self._policy, fields)
        if text is None:
            return None
        signed = signature.decode(errors="replace") if signature is not None else None
        return SharedPolicy(int(version or 0), text.decode(errors="replace"), signed)

    async def close(self) -> None:
        await self._redis.aclose()
