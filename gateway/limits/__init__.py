"""Per-key and per-tenant limits: requests and tokens per minute, requests in flight.

The request path calls `Limiter.admit` once a request is authenticated and parsed (it
raises a 429 `OpenAIError` or returns an `Admission`) and `Admission.finish` once the answer
has ended, however it ended. Tokens are counted twice: at admission the prompt estimate
plus the completion budget (max_tokens for each answer generated, as OpenAI reserves it),
so concurrent requests cannot all fit a budget that their answers then overrun; at the end
corrected to the real prompt + completion usage (to the prompt estimate when there is none).

Counters live in Redis when the policy names one (replicas share them) and in this process
otherwise. A Redis that fails is skipped for a moment and the in-process store decides
meanwhile (counted in `tiergate_limits_redis_fallbacks_total`); requests never fail
because of it, and the next admission after the pause tries Redis again.
"""

import logging
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from engine.entrypoints.openai.errors import OpenAIError
from gateway.limits.redis_store import RedisStore
from gateway.limits.window import Denial, MemoryStore, Scope, retry_after_header
from gateway.policy import Policy

logger = logging.getLogger("tiergate.limits")

_MAX_UNSENT = 10_000
REDIS_RETRY_S = 1.0  # after a Redis failure, decide in process this long before trying again
_WHAT = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "max_concurrent": "concurrent requests",
}


@dataclass
class Admission:
    """One admitted request's share of its limits; `finish` gives it back (once)."""

    limiter: "Limiter | None"
    scopes: list[Scope] = field(default_factory=list)
    estimate: int = 0  # tokens counted at admission: the prompt's estimate + completion budget
    prompt_estimate: int = 0  # what an answer that reports no usage settles at
    member: str = ""  # its concurrency slot's id in Redis
    store: RedisStore | None = None  # None: counted in process
    finished: bool = False

    async def finish(self, total_tokens: int | None = None) -> None:
        """Settle the real token usage (None: the prompt's estimate) and free the slots."""
        if self.finished or self.limiter is None or not self.scopes:
            self.finished = True
            return
        self.finished = True
        settled = self.prompt_estimate if total_tokens is None else total_tokens
        delta = settled - self.estimate
        await self.limiter._finish(self, delta)


NOT_LIMITED = Admission(None, finished=True)


class Limiter:
    """Lives as long as the gateway; each call takes the limits of the request's policy."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.memory = MemoryStore()
        self._redis: RedisStore | None = None
        self._redis_down_until = 0.0
        # Ends of Redis-counted requests that Redis missed; sent again once it answers.
        self._unsent: list[tuple[Admission, int]] = []
        registry = registry or CollectorRegistry()
        self.refused = Counter(
            "tiergate_rate_limited",
            "Requests refused with 429 by a policy limit",
            ["scope", "limit"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "tiergate_limits_redis_fallbacks",
            "Limit checks decided in process because Redis failed or was being skipped",
            registry=registry,
        )

    async def admit(
        self,
        policy: Policy,
        tenant: str,
        key_digest: str | None,
        prompt_tokens: int,
        completion_tokens: int = 0,
    ) -> Admission:
        """Count a request against its tenant's and its key's limits, or raise a 429.

        `completion_tokens`: the most the answer may generate; reserved until it ends.
        """
        scopes = _scopes(policy, tenant, key_digest)
        if not scopes:
            return NOT_LIMITED
        cost = prompt_tokens + completion_tokens
        member = uuid.uuid4().hex
        url = policy.limits_redis_url()
        store = await self._store(url)
        denial: Denial | None = None
        if store is not None:
            try:
                await self._resend(store)  # first: a slot it frees may be what this one needs
                denial = await store.admit(scopes, cost, member)
            except RedisError as exc:
                self._redis_failed(exc)
                store = None
        if store is None:
            if url is not None:
                self.fallbacks.inc()
            denial = self.memory.admit(scopes, cost)
        if denial is not None:
            self.refused.labels(denial.scope.kind, denial.limit).inc()
            raise _too_many(denial)
        return Admission(self, scopes, cost, prompt_tokens, member, store)

    async def _finish(self, admission: Admission, token_delta: int) -> None:
        store = admission.store
        if store is None:
            self.memory.finish(admission.scopes, token_delta)
            return
        try:
            await store.finish(admission.scopes, token_delta, admission.member)
        except RedisError as exc:  # the request is done regardless: settle it later
            self._redis_failed(exc)
            if len(self._unsent) < _MAX_UNSENT:  # beyond it, slots expire with their lease
                self._unsent.append((admission, token_delta))

    async def _resend(self, store: RedisStore) -> None:
        while self._unsent:
            # Taken off first: a concurrent admission must not send the same one again.
            admission, delta = self._unsent.pop()
            if admission.store is not store:
                continue  # counted in a Redis the policy no longer names
            try:
                await store.finish(admission.scopes, delta, admission.member)
            except RedisError:
                self._unsent.append((admission, delta))
                raise

    async def _store(self, url: str | None) -> RedisStore | None:
        """The Redis store for `url`, or None: no Redis, or it failed a moment ago."""
        if url is None:
            return None
        if self._redis is None or self._redis.url != url:  # first use, or a reload moved it
            if self._redis is not None:
                await self._redis.close()
            self._redis = RedisStore(url)
        if time.monotonic() < self._redis_down_until:
            return None
        return self._redis

    def _redis_failed(self, exc: Exception) -> None:
        if time.monotonic() >= self._redis_down_until:  # log once per pause, not per request
            logger.warning("limits: Redis failed (%s); counting in process for now", exc)
        self._redis_down_until = time.monotonic() + REDIS_RETRY_S

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.close()


def _scopes(policy: Policy, tenant: str, digest: str | None) -> list[Scope]:
    """`digest`: the caller's key as the policy names it (`key_digest`, SHA-256 hex)."""
    limits = policy.limits
    scopes = []
    if digest is not None and limits.keys:
        own = limits.keys.get(digest)
        if own is not None and not own.empty:
            scopes.append(Scope("key", digest, own))
    per_tenant = limits.for_tenant(tenant)
    if not per_tenant.empty:
        scopes.append(Scope("tenant", tenant, per_tenant))
    return scopes


def _too_many(denial: Denial) -> OpenAIError:
    scope, what = denial.scope, _WHAT[denial.limit]
    limit = getattr(scope.limits, denial.limit)
    who = f"tenant {scope.name!r}" if scope.kind == "tenant" else "this API key"
    if denial.limit == "tokens_per_minute" and denial.cost > limit:
        message = (
            f"Request too large: about {denial.cost} tokens (the prompt and max_tokens for "
            f"each answer), over the limit of {limit} {what} for {who}. Lower max_tokens "
            "or send a shorter prompt."
        )
    else:
        message = f"Rate limit reached for {who}: {limit} {what}. Retry after Retry-After seconds."
    return OpenAIError(
        429,
        message,
        type="rate_limit_error",
        code=denial.limit,
        headers={"retry-after": retry_after_header(denial)},
    )
