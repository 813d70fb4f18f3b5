"""The shared store: Redis (`cache.store: redis`), for gateways that run as replicas.

Layout under `cache.redis_prefix` (P):
  P:e:<id>    hash: one entry (scope, tenant, route, question, vector, answer JSON, times);
              it carries its TTL, so Redis itself drops an expired answer
  P:lru       sorted set: id -> last use; beyond `max_entries` the oldest are evicted
  P:r:<key>   string: a record beside the entries (a stored API response), with its TTL
  P:events    stream of inserts and deletes; every replica follows it to keep its in-memory
              tables and FAISS indexes in step, and rebuilds them from the hashes at start
              and after every reconnect (events may have been missed meanwhile)
  P:generation  a random token the first replica to load writes; a FLUSHALL (or anything
              that drops the keys) removes it without an event, so a follower that finds it
              gone or changed rebuilds from Redis, as after a reconnect

Any Redis error marks the store down: lookups bypass, stores are skipped, and the follower
task reconnects and resyncs by itself.
"""

import asyncio
import contextlib
import logging
import time
import uuid

import numpy as np
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.cache.entry import CachedAnswer, Entry, facts_only
from gateway.cache.store import (
    CLOSE_WAIT_S,
    StoreListener,
    StoreUnavailable,
    answer_from_json,
    answer_to_json,
    stop_task,
)

logger = logging.getLogger("tiergate.cache")

STREAM_LENGTH = 100_000  # events kept; a replica further behind than this resyncs anyway
BLOCK_MS = 1000  # longest wait for new events: also how soon a lost sync is noticed
GENERATION_CHECK_S = 1.0  # how often the follower checks that the keys were not dropped
REQUEST_TIMEOUT_S = 1.0  # a hung Redis costs a request at most this before it bypasses
RECONNECT_S = (0.1, 2.0)  # backoff between reconnect attempts: first, most
SCAN_BATCH = 1000
_ERRORS = (RedisError, OSError)


class RedisStore:
    kind = "redis"

    def __init__(self, url: str, prefix: str = "tiergate:cache") -> None:
        self.url = url
        self.prefix = prefix
        self._lru = f"{prefix}:lru"
        self._events = f"{prefix}:events"
        self._generation_key = f"{prefix}:generation"
        self._origin = uuid.uuid4().hex  # our own events are applied already: skip them
        self._client = Redis.from_url(
            url,
            socket_timeout=REQUEST_TIMEOUT_S,
            socket_connect_timeout=REQUEST_TIMEOUT_S,
            retry=Retry(NoBackoff(), 1),  # a pooled connection may predate a Redis restart
        )
        # The follower's connection never retries silently: a broken connection means
        # events may have been missed (or Redis restarted empty), so it must resync.
        self._reader = Redis.from_url(
            url,
            socket_timeout=BLOCK_MS / 1000 + 5,
            socket_connect_timeout=REQUEST_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        self._synced = False
        self._generation: bytes | None = None  # the token the tables were loaded under
        self._generation_due = 0.0  # monotonic time of the follower's next check
        self._last_id: bytes | str = "0-0"
        self._error: str | None = "not connected yet"
        self._follower: asyncio.Task | None = None
        self._listener: StoreListener | None = None
        self.resyncs = 0  # counted so tests and /admin can see reconnects

    @property
    def healthy(self) -> bool:
        return self._synced

    # --- start-up and following other replicas ------------------------------------------

    async def load(self) -> list[Entry]:
        try:
            generation = await self._claim_generation()
            newest = await self._client.xrevrange(self._events, count=1)
            last_id = newest[0][0] if newest else "0-0"
            entries = await self._scan()
        except _ERRORS as exc:
            raise self._down(exc) from exc
        self._last_id, self._synced, self._error = last_id, True, None
        self._generation = generation
        return [e for e in entries if e is not None]

    async def _claim_generation(self) -> bytes:
        """The keys' generation token, written first if there is none (a fresh Redis or one
        flushed since): read before the scan, so a flush during it shows at the next check."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(self._generation_key, uuid.uuid4().hex, nx=True)
            pipe.get(self._generation_key)
            return (await pipe.execute())[1]

    async def _check_generation(self) -> None:
        """A FLUSHALL announces nothing: the tables would keep serving the lost entries'
        vectors (and counting them) until a lookup found an answer gone."""
        if time.monotonic() < self._generation_due:
            return
        self._generation_due = time.monotonic() + GENERATION_CHECK_S
        if await self._client.get(self._generation_key) != self._generation:
            logger.info("semantic cache: the redis keys were dropped (FLUSHALL?); resyncing")
            self._synced = False

    def follow(self, listener: StoreListener) -> None:
        self._listener = listener
        self._follower = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        pause = RECONNECT_S[0]
        while True:
            try:
                if not self._synced:
                    entries = await self.load()
                    # Counted before the tables change: whoever sees them emptied (a test, /admin)
                    # must also see the resync that emptied them.
                    self.resyncs += 1
                    await self._listener.replace_all(entries)
                    logger.info("semantic cache resynced from redis: %d entries", len(entries))
                await self._read_events()
                await self._check_generation()
                pause = RECONNECT_S[0]
            except (StoreUnavailable, *_ERRORS) as exc:
                self._down(exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RECONNECT_S[1])
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one event must not end following for good
                logger.exception("semantic cache: applying a redis event failed")
                self._synced = False
                await asyncio.sleep(pause)

    async def _read_events(self) -> None:
        reply = await self._reader.xread({self._events: self._last_id}, count=500, block=BLOCK_MS)
        for _stream, messages in reply or []:
            for message_id, fields in messages:
                if not self._synced:  # a request saw Redis fail: resync before going on
                    return
                if fields.get(b"origin") != self._origin.encode():
                    await self._apply(fields)
                self._last_id = message_id

    async def _apply(self, fields: dict[bytes, bytes]) -> None:
        ids = fields[b"ids"].decode().split()
        if fields[b"op"] == b"put":
            for entry in await self._fetch_entries(ids):
                if entry is not None:
                    await self._listener.put(entry)
        elif fields[b"op"] == b"del":
            await self._listener.delete(ids)

    # --- the request path ---------------------------------------------------------------

    async def put(self, entry: Entry, max_entries: int) -> list[str]:
        key = self._key(entry.id)
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=_fields(entry))
                if entry.expires_at is not None:
                    pipe.pexpireat(key, int(entry.expires_at * 1000))
                pipe.zadd(self._lru, {entry.id: entry.created_at})
                self._announce(pipe, "put", [entry.id])
                pipe.zcard(self._lru)
                count = (await pipe.execute())[-1]
            if count <= max_entries:
                return []
            oldest = await self._client.zpopmin(self._lru, count - max_entries)
            evicted = [m.decode() for m, _ in oldest if m.decode() != entry.id]
            return await self._delete(evicted)
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def get(self, entry_id: str) -> CachedAnswer | None:
        try:
            answer = await self._client.hget(self._key(entry_id), "answer")
        except _ERRORS as exc:
            raise self._down(exc) from exc
        return answer_from_json(answer) if answer is not None else None

    async def touch(self, entry_id: str, now: float) -> None:
        try:
            await self._client.zadd(self._lru, {entry_id: now}, xx=True)
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def delete(self, ids: list[str]) -> list[str]:
        try:
            return await self._delete(ids)
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def purge(self, tenant: str | None, route: str | None) -> list[str]:
        try:
            keys = [k async for k in self._client.scan_iter(f"{self.prefix}:e:*", SCAN_BATCH)]
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hmget(key, "tenant", "route")
                owners = await pipe.execute()
            ids = [
                key.decode().rpartition(":")[2]
                for key, (t, r) in zip(keys, owners, strict=True)
                if t is not None and tenant in (None, t.decode()) and route in (None, r.decode())
            ]
            return await self._delete(ids)
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def missing(self, ids: list[str]) -> list[str]:
        gone: list[str] = []
        try:
            for start in range(0, len(ids), SCAN_BATCH):
                batch = ids[start : start + SCAN_BATCH]
                async with self._client.pipeline(transaction=False) as pipe:
                    for entry_id in batch:
                        pipe.exists(self._key(entry_id))
                    found = await pipe.execute()
                gone += [i for i, n in zip(batch, found, strict=True) if not n]
        except _ERRORS as exc:
            raise self._down(exc) from exc
        return gone

    async def forget_expired(self, ids: list[str]) -> None:
        try:
            await self._client.zrem(self._lru, *ids)  # the hashes expired by themselves
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def put_record(self, key: str, value: str, ttl_s: float) -> None:
        try:
            await self._client.set(self._record(key), value, px=max(1, int(ttl_s * 1000)))
        except _ERRORS as exc:
            raise self._down(exc) from exc

    async def get_record(self, key: str) -> str | None:
        try:
            value = await self._client.get(self._record(key))
        except _ERRORS as exc:
            raise self._down(exc) from exc
        return value.decode() if value is not None else None

    async def delete_record(self, key: str) -> bool:
        try:
            return bool(await self._client.delete(self._record(key)))
        except _ERRORS as exc:
            raise self._down(exc) from exc

    def info(self) -> dict:
        return {
            "kind": self.kind,
            "url": _without_password(self.url),
            "healthy": self.healthy,
            "error": self._error,
            "resyncs": self.resyncs,
        }

    async def close(self) -> None:
        await stop_task(self._follower)
        for client in (self._client, self._reader):
            with contextlib.suppress(*_ERRORS, TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await client.aclose()

    # --- internals -----------------------------------------------------------------------

    def _key(self, entry_id: str) -> str:
        return f"{self.prefix}:e:{entry_id}"

    def _record(self, key: str) -> str:
        return f"{self.prefix}:r:{key}"

    def _announce(self, pipe: object, op: str, ids: list[str]) -> None:
        event = {"op": op, "ids": " ".join(ids), "origin": self._origin}
        pipe.xadd(self._events, event, maxlen=STREAM_LENGTH, approximate=True)

    async def _delete(self, ids: list[str]) -> list[str]:
        if not ids:
            return []
        async with self._client.pipeline(transaction=True) as pipe:
            for entry_id in ids:
                pipe.delete(self._key(entry_id))
            pipe.zrem(self._lru, *ids)
            self._announce(pipe, "del", ids)
            results = await pipe.execute()
        return [i for i, existed in zip(ids, results, strict=False) if existed]

    async def _scan(self) -> list[Entry | None]:
        keys = [k async for k in self._client.scan_iter(f"{self.prefix}:e:*", SCAN_BATCH)]
        ids = [k.decode().rpartition(":")[2] for k in keys]
        return await self._fetch_entries(ids)

    async def _fetch_entries(self, ids: list[str]) -> list[Entry | None]:
        entries: list[Entry | None] = []
        for start in range(0, len(ids), SCAN_BATCH):
            batch = ids[start : start + SCAN_BATCH]
            async with self._client.pipeline(transaction=False) as pipe:
                for entry_id in batch:
                    pipe.hmget(self._key(entry_id), LOAD_FIELDS)
                rows = await pipe.execute()
            entries += [_entry(i, row) for i, row in zip(batch, rows, strict=True)]
        return entries

    def _down(self, exc: BaseException) -> StoreUnavailable:
        if self._synced:
            logger.warning("semantic cache: redis unavailable, bypassing: %s", exc)
        self._synced = False
        self._error = f"{type(exc).__name__}: {exc}"
        return StoreUnavailable(self._error)


# Loading reads every field but the answer text, which only a hit needs.
LOAD_FIELDS = (
    "scope",
    "tenant",
    "route",
    "question",
    "vector",
    "finish_reason",
    "completion_tokens",
    "max_tokens",
    "created_at",
    "expires_at",
)


def _fields(entry: Entry) -> dict[str, str | bytes | float | int]:
    answer = entry.answer
    return {
        "scope": entry.scope,
        "tenant": entry.tenant,
        "route": entry.route,
        "question": entry.question,
        "vector": np.asarray(entry.vector, dtype=np.float32).tobytes(),
        "answer": answer_to_json(answer),
        "finish_reason": answer.finish_reason,
        "completion_tokens": answer.completion_tokens,
        "max_tokens": "" if answer.max_tokens is None else answer.max_tokens,
        "created_at": entry.created_at,
        "expires_at": "" if entry.expires_at is None else entry.expires_at,
    }


def _entry(entry_id: str, values: list[bytes | None]) -> Entry | None:
    if any(v is None for v in values):  # deleted or expired since it was listed
        return None
    scope, tenant, route, question, vector, finish, completion, limit, created, expires = values
    return Entry(
        id=entry_id,
        scope=scope.decode(),
        tenant=tenant.decode(),
        route=route.decode(),
        question=question.decode(),
        vector=np.frombuffer(vector, dtype=np.float32),
        answer=facts_only(finish.decode(), int(completion), int(limit) if limit else None),
        created_at=float(created),
        expires_at=float(expires) if expires else None,
    )


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}"
