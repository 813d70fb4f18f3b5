"""USD budgets per tenant and per key, per UTC day or month: reserve, then settle.

At admission a request reserves the most it can cost (`pricing.reservation_usd`); it is
admitted while spent + reserved is under every budget it counts against, so concurrent
requests see each other's reservations and the overspend is at most the last admitted
request's cost. When it ends the reservation becomes its real cost. Amounts are integer
nano-USD, so Redis adds them exactly. In Redis (one Lua script each way, keys expiring
after their period, reservations leased) replicas share the counts; otherwise they live in
this process.
"""

import calendar
import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from engine.entrypoints.openai.errors import OpenAIError
from gateway.limits.terms import KeyTerms
from gateway.policy import Policy

NANO = 1_000_000_000
PREFIX = "tiergate:budget:"
_KEEP_S = {"day": 2 * 86_400, "month": 32 * 86_400}  # a period's counts, then some


@dataclass(frozen=True)
class BudgetScope:
    kind: str  # "tenant" | "key"
    name: str  # the tenant, or the key's SHA-256 hex
    label: str  # the tenant, or the key's label: what the 429 names
    period: str  # "day" | "month"
    period_id: str  # 2026-12-02 or 2026-12 (UTC)
    limit_usd: float

    @property
    def base(self) -> str:
        return f"{self.kind}:{self.name}:{self.period}:{self.period_id}"

    @property
    def limit_nano(self) -> int:
        return round(self.limit_usd * NANO)


@dataclass(frozen=True)
class BudgetDenial:
    scope: BudgetScope
    spent_nano: int
    held_nano: int  # reserved by requests still running


def period_id(period: str, now: float) -> str:
    return time.strftime("%Y-%m-%d" if period == "day" else "%Y-%m", time.gmtime(now))


def period_end(period: str, now: float) -> float:
    """The Unix time the period holding `now` ends (its budget starts again)."""
    t = time.gmtime(now)
    if period == "day":
        return calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)) + 86_400
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def budget_scopes(
    policy: Policy, tenant: str, key: KeyTerms | None, now: float
) -> list[BudgetScope]:
    """Every budget the request counts against: its key's, then its tenant's."""
    scopes = []
    own = key.budget(policy) if key is not None else None
    if key is not None and own is not None:
        for period, usd in own.limits().items():
            scopes.append(
                BudgetScope("key", key.digest, key.label, period, period_id(period, now), usd)
            )
    for period, usd in policy.budgets.for_tenant(tenant).limits().items():
        scopes.append(BudgetScope("tenant", tenant, tenant, period, period_id(period, now), usd))
    return scopes


class MemoryBudgets:
    """Spent and reserved nano-USD per scope and period, in this process."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}  # base -> [spent, reserved]

    def reserve(self, scopes: list[BudgetScope], amount: int) -> BudgetDenial | None:
        for scope in scopes:
            spent, held = self._counts.get(scope.base, (0, 0))
            if spent + held >= scope.limit_nano:
                return BudgetDenial(scope, spent, held)
        for scope in scopes:
            self._counts.setdefault(scope.base, [0, 0])[1] += amount
        return None

    def settle(self, scopes: list[BudgetScope], amount: int, cost: int) -> None:
        for scope in scopes:
            counts = self._counts.setdefault(scope.base, [0, 0])
            counts[0] += cost
            counts[1] = max(0, counts[1] - amount)

    def spent(self, scope: BudgetScope) -> int:
        return self._counts.get(scope.base, (0, 0))[0]


# Reservations are leased members (as the limits' concurrency slots are): one that is never
# settled (its replica died, or a reply was lost to a timeout) lapses with its lease.
# Per scope and period: `:s` spent, `:r` member -> amount reserved, `:l` member -> lease end.
# KEYS: one base per scope and period. ARGV: amount, member, lease ms, then per key its
# limit and keep ms. Returns {0} or {index, spent, reserved}, as strings.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local amount, member, lease = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local function held(base)
  local lapsed = redis.call('ZRANGEBYSCORE', base .. ':l', '-inf', now)
  for _, m in ipairs(lapsed) do redis.call('HDEL', base .. ':r', m) end
  redis.call('ZREMRANGEBYSCORE', base .. ':l', '-inf', now)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', base .. ':r')) do sum = sum + tonumber(v) end
  return sum
end
for i, base in ipairs(KEYS) do
  local spent = tonumber(redis.call('GET', base .. ':s') or '0')
  local h = held(base)
  if spent + h >= tonumber(ARGV[2 + 2 * i]) then
    return {i, string.format('%.0f', spent), string.format('%.0f', h)}
  end
end
for i, base in ipairs(KEYS) do
  local keep = ARGV[3 + 2 * i]
  redis.call('HSET', base .. ':r', member, amount)
  redis.call('ZADD', base .. ':l', now + lease, member)
  redis.call('PEXPIRE', base .. ':r', keep)
  redis.call('PEXPIRE', base .. ':l', keep)
end
return {0}
"""

# KEYS: the same bases. ARGV: member, cost, keep ms. Idempotent: the cost is added once,
# by the call that removes the reservation (a resend after a lost reply adds nothing).
_SETTLE = """
for _, base in ipairs(KEYS) do
  redis.call('ZREM', base .. ':l', ARGV[1])
  if redis.call('HDEL', base .. ':r', ARGV[1]) == 1 and ARGV[2] ~= '0' then
    redis.call('INCRBY', base .. ':s', ARGV[2])
    redis.call('PEXPIRE', base .. ':s', ARGV[3])
  end
end
return 0
"""


class RedisBudgets:
    """The same counts in Redis; raises redis' errors for the caller to fall back."""

    def __init__(self, redis: Redis, lease_s: float) -> None:
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._reserve = redis.register_script(_RESERVE)
        self._settle = redis.register_script(_SETTLE)

    async def reserve(
        self, scopes: list[BudgetScope], amount: int, member: str
    ) -> BudgetDenial | None:
        args: list[int | str] = [amount, member, self._lease_ms]
        for scope in scopes:
            args += [scope.limit_nano, _KEEP_S[scope.period] * 1000]
        reply = await self._reserve(keys=[PREFIX + s.base for s in scopes], args=args)
        if reply[0] == 0:
            return None
        index, spent, held = reply
        return BudgetDenial(scopes[index - 1], int(spent), int(held))

    async def settle(self, scopes: list[BudgetScope], member: str, cost: int) -> None:
        keep = max(_KEEP_S[s.period] for s in scopes) * 1000
        await self._settle(keys=[PREFIX + s.base for s in scopes], args=[member, cost, keep])

    async def spent(self, scope: BudgetScope) -> int:
        return int(await self._redis.get(PREFIX + scope.base + ":s") or 0)


def over_budget(denial: BudgetDenial, now: float) -> OpenAIError:
    """The 429 naming the budget: whose, which period, its limit and what is spent."""
    s = denial.scope
    who = f"tenant {s.label!r}" if s.kind == "tenant" else f"API key {s.label!r}"
    ends = period_end(s.period, now)
    held = denial.held_nano / NANO
    in_flight = f", ${held:.6f} more reserved by requests in flight" if held else ""
    message = (
        f"Budget exceeded for {who}: ${denial.spent_nano / NANO:.6f} spent{in_flight} of its "
        f"${s.limit_usd:g} budget per {s.period} ({s.period_id} UTC). It starts again at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ends))}."
    )
    return OpenAIError(
        429,
        message,
        type="insufficient_quota",
        code="budget_exceeded",
        headers={"retry-after": str(max(1, math.ceil(ends - now)))},
    )
