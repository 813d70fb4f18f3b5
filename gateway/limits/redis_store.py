"""The same limits kept in Redis, so every gateway replica counts against one budget.

Each admission is one Lua script (atomic: check every scope, then count in all of them or
none) and each end of a request another. Time comes from Redis' TIME, so replicas with
skewed clocks still agree on the minute. Concurrency slots are sorted-set members that
expire after a lease: a replica that dies mid-request leaks its slots for a lease at most.
Key names are built inside the scripts, which is fine for one Redis (not Redis Cluster).
"""

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.limits.budget import RedisBudgets
from gateway.limits.window import WINDOW_S, Denial, Scope

PREFIX = "tiergate:limits:"
LEASE_S = 900.0  # longest a slot is held without its release (a stream longer than this
# stops counting towards max_concurrent; raising it only delays recovery from dead replicas)

# KEYS: one base per scope. ARGV: cost, member, lease ms, window ms, then per scope the
# requests/tokens/concurrency limits (-1: none). Returns {0} or {scope index, limit kind,
# previous count, current count, ms into the minute}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cost, member = tonumber(ARGV[1]), ARGV[2]
local lease, w = tonumber(ARGV[3]), tonumber(ARGV[4])
local minute = math.floor(now / w)
local elapsed = now - minute * w
local function count(key) return tonumber(redis.call('GET', key) or '0') end
local function over(base, kind, limit, amount)
  local cur = count(base .. ':' .. kind .. ':' .. minute)
  local prev = count(base .. ':' .. kind .. ':' .. (minute - 1))
  if prev * (w - elapsed) / w + cur + amount > limit then return {prev, cur} end
  return nil
end
for i, base in ipairs(KEYS) do
  local o = 4 + (i - 1) * 3
  local rpm, tpm, conc = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  if rpm >= 0 then
    local hit = over(base, 'r', rpm, 1)
    if hit then return {i, 'r', hit[1], hit[2], elapsed} end
  end
  if tpm >= 0 then
    local hit = over(base, 't', tpm, cost)
    if hit then return {i, 't', hit[1], hit[2], elapsed} end
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', base .. ':c', '-inf', now)
    if redis.call('ZCARD', base .. ':c') >= conc then return {i, 'c', 0, 0, elapsed} end
  end
end
for i, base in ipairs(KEYS) do
  local o = 4 + (i - 1) * 3
  if tonumber(ARGV[o + 1]) >= 0 then
    local k = base .. ':r:' .. minute
    redis.call('INCR', k)
    redis.call('PEXPIRE', k, 2 * w)
  end
  if tonumber(ARGV[o + 2]) >= 0 then
    local k = base .. ':t:' .. minute
    redis.call('INCRBY', k, cost)
    redis.call('PEXPIRE', k, 2 * w)
  end
  if tonumber(ARGV[o + 3]) >= 0 then
    redis.call('ZADD', base .. ':c', now + lease, member)
    redis.call('PEXPIRE', base .. ':c', lease)
  end
end
return {0}
"""

# KEYS: one base per scope. ARGV: token delta, member, window ms, then per scope two flags
# (1: correct its token count, 1: free its slot).
_FINISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local delta, member, w = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local minute = math.floor(now / w)
for i, base in ipairs(KEYS) do
  local o = 3 + (i - 1) * 2
  if ARGV[o + 1] == '1' and delta ~= 0 then
    local k = base .. ':t:' .. minute
    if redis.call('INCRBY', k, delta) < 0 then redis.call('SET', k, 0) end
    redis.call('PEXPIRE', k, 2 * w)
  end
  if ARGV[o + 2] == '1' then redis.call('ZREM', base .. ':c', member) end
end
return 0
"""

_KINDS = {b"r": "requests_per_minute", b"t": "tokens_per_minute", b"c": "max_concurrent"}


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisStore:
    """Raises redis' errors (ConnectionError, TimeoutError...) for the caller to fall back."""

    def __init__(self, url: str) -> None:
        self.url = url
        # Short timeouts and one immediate retry (a pooled connection that Redis dropped):
        # redis-py's default backoff would hold every request for seconds while it is down.
        self._redis = Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 1)
        )
        self._admit = self._redis.register_script(_ADMIT)
        self._finish = self._redis.register_script(_FINISH)
        # The same connection for the budgets' counts, their reservations under the same lease.
        self.budgets = RedisBudgets(self._redis, LEASE_S)

    async def admit(self, scopes: list[Scope], cost: int, member: str) -> Denial | None:
        args: list[int | str] = [cost, member, int(LEASE_S * 1000), int(WINDOW_S * 1000)]
        for s in scopes:
            lim = s.limits
            args += [_limit(lim.requests_per_minute), _limit(lim.tokens_per_minute)]
            args.append(_limit(lim.max_concurrent))
        reply = await self._admit(keys=[PREFIX + s.base for s in scopes], args=args)
        if reply[0] == 0:
            return None
        index, kind, prev, cur, elapsed_ms = reply
        amount = cost if kind == b"t" else 1
        return Denial(scopes[index - 1], _KINDS[kind], prev, cur, elapsed_ms / 1000, amount)

    async def finish(self, scopes: list[Scope], token_delta: int, member: str) -> None:
        args: list[int | str] = [token_delta, member, int(WINDOW_S * 1000)]
        for s in scopes:
            args.append(int(s.limits.tokens_per_minute is not None))
            args.append(int(s.limits.max_concurrent is not None))
        await self._finish(keys=[PREFIX + s.base for s in scopes], args=args)

    async def close(self) -> None:
        await self._redis.aclose()
