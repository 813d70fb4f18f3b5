"""Per-key and per-tenant limits: requests and tokens per minute, requests in flight, and
USD budgets per day or month (budget.py: a request reserves its most, settles its cost).

The request path calls `Limiter.admit` once a request is authenticated and parsed (it
raises a 429 `OpenAIError` or returns an `Admission`) and `Admission.finish` once the answer
has ended, however it ended. Tokens are counted twice: at admission the prompt estimate
plus the completion budget (max_tokens for each answer generated, as OpenAI reserves it),
so concurrent requests cannot all fit a budget that their answers then overrun; at the end
corrected to the real prompt + completion usage (to the prompt estimate when there is none).

Counters live in Redis when the policy names one (replicas share them) and in this process
otherwise. A Redis that fails is skipped for a moment and the in-process store decides
meanwhile (counted in `tiergate_limits_redis_fallbacks_total`); requests never fail
because of it, and the next admission after the pause tries Redis again. Budgets fail open
the same way: while Redis is out each replica counts only what it spends meanwhile.
"""

import logging
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from engine.entrypoints.openai.errors import OpenAIError
from gateway.limits.budget import (
    NANO,
    BudgetDenial,
    BudgetScope,
    MemoryBudgets,
    budget_scopes,
    over_budget,
)
from gateway.limits.redis_store import RedisStore
from gateway.limits.terms import KeyTerms
from gateway.limits.window import Denial, MemoryStore, Scope, retry_after_header
from gateway.policy import Policy
from gateway.pricing import reservation_usd

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
    budgets: list[BudgetScope] = field(default_factory=list)
    held: int = 0  # nano-USD reserved under `budgets`
    finished: bool = False
    limits_settled: bool = False  # each part is settled once, even when Redis fails between
    budgets_settled: bool = False

    async def finish(self, total_tokens: int | None = None, cost_usd: float = 0.0) -> None:
        """Settle the real token usage (None: the prompt's estimate) and cost, free the slots."""
        if self.finished or self.limiter is None or not (self.scopes or self.budgets):
            self.finished = True
            return
        self.finished = True
        settled = self.prompt_estimate if total_tokens is None else total_tokens
        delta = settled - self.estimate
        await self.limiter._finish(self, delta, round(cost_usd * NANO))


NOT_LIMITED = Admission(None, finished=True)


class Limiter:
    """Lives as long as the gateway; each call takes the limits of the request's policy."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.memory = MemoryStore()
        self._redis: RedisStore | None = None
        self._redis_down_until = 0.0
        self.memory_budgets = MemoryBudgets()
        # Ends of Redis-counted requests that Redis missed; sent again once it answers.
        self._unsent: list[tuple[Admission, int, int]] = []
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
        self.over_budget = Counter(
            "tiergate_budget_refused",
            "Requests refused with 429 because a budget was spent",
            ["scope", "period"],
            registry=registry,
        )

    async def admit(
        self,
        policy: Policy,
        tenant: str,
        key: KeyTerms | None,
        prompt_tokens: int,
        completion_tokens: int = 0,
        prompt_bound: int | None = None,
    ) -> Admission:
        """Count a request against its tenant's and its key's limits and budgets, or raise
        a 429. `completion_tokens`: the most the answer may generate; reserved until it ends.
        `prompt_bound`: the most prompt tokens it can have (None: `prompt_tokens`), what a
        budget reserves: an estimate under the real count would let concurrent requests
        overspend by more than one request's cost.
        """
        now = time.time()
        scopes, budgets = _scopes(policy, tenant, key), budget_scopes(policy, tenant, key, now)
        if not scopes and not budgets:
            return NOT_LIMITED
        cost = prompt_tokens + completion_tokens
        most = prompt_tokens if prompt_bound is None else max(prompt_bound, prompt_tokens)
        held = round(reservation_usd(policy, most, completion_tokens) * NANO)
        admission = Admission(self, scopes, cost, prompt_tokens, uuid.uuid4().hex)
        admission.budgets, admission.held = budgets, held if budgets else 0
        url = policy.limits_redis_url()
        store = await self._store(url)
        denial: Denial | BudgetDenial | None = None
        if store is not None:
            try:
                await self._resend(store)  # first: a slot it frees may be what this one needs
                denial = await self._admit_redis(store, admission)
            except RedisError as exc:
                self._redis_failed(exc)
                self._release_later(store, admission)
                store = None
        if store is None:
            if url is not None:
                self.fallbacks.inc()
            denial = self._admit_memory(admission)
        if isinstance(denial, BudgetDenial):
            self.over_budget.labels(denial.scope.kind, denial.scope.period).inc()
            raise over_budget(denial, now)
        if denial is not None:
            self.refused.labels(denial.scope.kind, denial.limit).inc()
            raise _too_many(denial)
        admission.store = store
        return admission

    async def _admit_redis(self, store: RedisStore, a: Admission) -> Denial | BudgetDenial | None:
        """Budgets first: a refusal there gives back its reservation exactly."""
        if a.budgets and (refused := await store.budgets.reserve(a.budgets, a.held, a.member)):
            return refused
        denial = await store.admit(a.scopes, a.estimate, a.member) if a.scopes else None
        if denial is not None and a.budgets:
            await store.budgets.settle(a.budgets, a.member, 0)
        return denial

    def _release_later(self, store: RedisStore, a: Admission) -> None:
        """A reply lost to a Redis error may have left a reservation there: give it back
        once Redis answers (settling is idempotent), rather than after its lease."""
        if a.budgets and len(self._unsent) < _MAX_UNSENT:
            release = Admission(self, [], 0, 0, a.member, store, a.budgets, a.held)
            self._unsent.append((release, 0, 0))

    def _admit_memory(self, a: Admission) -> Denial | BudgetDenial | None:
        if a.budgets and (refused := self.memory_budgets.reserve(a.budgets, a.held)):
            return refused
        denial = self.memory.admit(a.scopes, a.estimate) if a.scopes else None
        if denial is not None and a.budgets:
            self.memory_budgets.settle(a.budgets, a.held, 0)
        return denial

    async def _finish(self, admission: Admission, token_delta: int, cost: int) -> None:
        store = admission.store
        if store is None:
            self.memory.finish(admission.scopes, token_delta)
            self.memory_budgets.settle(admission.budgets, admission.held, cost)
            return
        try:
            await self._settle(store, admission, token_delta, cost)
        except RedisError as exc:  # the request is done regardless: settle it later
            self._redis_failed(exc)
            if len(self._unsent) < _MAX_UNSENT:  # beyond it, slots expire with their lease
                self._unsent.append((admission, token_delta, cost))

    @staticmethod
    async def _settle(store: RedisStore, a: Admission, token_delta: int, cost: int) -> None:
        if a.budgets and not a.budgets_settled:
            await store.budgets.settle(a.budgets, a.member, cost)
            a.budgets_settled = True
        if a.scopes and not a.limits_settled:
            await store.finish(a.scopes, token_delta, a.member)
            a.limits_settled = True

    async def _resend(self, store: RedisStore) -> None:
        while self._unsent:
            # Taken off first: a concurrent admission must not send the same one again.
            admission, delta, cost = self._unsent.pop()
            if admission.store is not store:
                continue  # counted in a Redis the policy no longer names
            try:
                await self._settle(store, admission, delta, cost)
            except RedisError:
                self._unsent.append((admission, delta, cost))
                raise

    async def spent_usd(self, policy: Policy, scope: BudgetScope) -> float | None:
        """What `scope` has spent this period (None: its Redis cannot say right now)."""
        store = await self._store(policy.limits_redis_url())
        if store is None:
            return self.memory_budgets.spent(scope) / NANO
        try:
            return await store.budgets.spent(scope) / NANO
        except RedisError as exc:
            self._redis_failed(exc)
            return None

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


def _scopes(policy: Policy, tenant: str, key: KeyTerms | None) -> list[Scope]:
    limits = policy.limits
    scopes = []
    if key is not None:
        own = key.limits(policy)
        if own is not None and not own.empty:
            scopes.append(Scope("key", key.digest, own))
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
