"""Where managed keys live so every replica sees the same ones: the policy's Redis (the
limits' one) or, without a Redis, an SQLite file (replicas on one host share it).

Every lookup reads the store, so a revoke takes effect on the next request everywhere.
Errors (Redis down, file unreadable) are raised as `KeyStoreError`: authentication then
answers 503 rather than let an unverifiable key in.
"""

import asyncio
import sqlite3
from pathlib import Path
from typing import Protocol

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.keys.record import ManagedKey

REDIS_PREFIX = "tiergate:keys:"


class KeyStoreError(Exception):
    pass


class KeyStore(Protocol):
    async def add(self, record: ManagedKey) -> None: ...
    async def by_digest(self, digest: str) -> ManagedKey | None: ...
    async def all(self) -> list[ManagedKey]: ...
    async def delete(self, key_id: str) -> bool: ...
    async def close(self) -> None: ...


class RedisKeys:
    """Two hashes: digest -> record (JSON), id -> digest."""

    def __init__(self, url: str) -> None:
        self.where = url
        self._redis = Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 1)
        )
        self._records, self._ids = REDIS_PREFIX + "by_digest", REDIS_PREFIX + "ids"

    async def add(self, record: ManagedKey) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._records, record.digest, record.model_dump_json())
                pipe.hset(self._ids, record.id, record.digest)
                await pipe.execute()
        except RedisError as exc:
            raise KeyStoreError(str(exc)) from exc

    async def by_digest(self, digest: str) -> ManagedKey | None:
        try:
            raw = await self._redis.hget(self._records, digest)
        except RedisError as exc:
            raise KeyStoreError(str(exc)) from exc
        return None if raw is None else ManagedKey.model_validate_json(raw)

    async def all(self) -> list[ManagedKey]:
        try:
            raw = await self._redis.hvals(self._records)
        except RedisError as exc:
            raise KeyStoreError(str(exc)) from exc
        return [ManagedKey.model_validate_json(r) for r in raw]

    async def delete(self, key_id: str) -> bool:
        try:
            digest = await self._redis.hget(self._ids, key_id)
            if digest is None:
                return False
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self._records, digest)
                pipe.hdel(self._ids, key_id)
                await pipe.execute()
        except RedisError as exc:
            raise KeyStoreError(str(exc)) from exc
        return True

    async def close(self) -> None:
        await self._redis.aclose()


_SCHEMA = "CREATE TABLE IF NOT EXISTS keys (digest TEXT PRIMARY KEY, id TEXT UNIQUE, record TEXT)"


class SqliteKeys:
    """One table; the file is made by the first key added (a lookup never creates it)."""

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        self._path = path

    def _run(self, create: bool, sql: str, *args: str) -> list[tuple]:
        if not create and not self._path.exists():
            return []
        if create:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with sqlite3.connect(self._path, timeout=5) as db:  # commits on leaving
                db.execute(_SCHEMA)
                return db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise KeyStoreError(f"{self._path}: {exc}") from exc

    async def add(self, record: ManagedKey) -> None:
        sql = "INSERT INTO keys VALUES (?, ?, ?)"
        args = (record.digest, record.id, record.model_dump_json())
        await asyncio.to_thread(self._run, True, sql, *args)

    async def by_digest(self, digest: str) -> ManagedKey | None:
        sql = "SELECT record FROM keys WHERE digest = ?"
        rows = await asyncio.to_thread(self._run, False, sql, digest)
        return ManagedKey.model_validate_json(rows[0][0]) if rows else None

    async def all(self) -> list[ManagedKey]:
        rows = await asyncio.to_thread(self._run, False, "SELECT record FROM keys")
        return [ManagedKey.model_validate_json(r[0]) for r in rows]

    async def delete(self, key_id: str) -> bool:
        sql = "DELETE FROM keys WHERE id = ? RETURNING id"
        return bool(await asyncio.to_thread(self._run, False, sql, key_id))

    async def close(self) -> None:
        return None
