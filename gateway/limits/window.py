"""Sliding-window counters and concurrency slots, kept in this process.

The window is the sliding-window counter (Cloudflare's, also Redis' usual recipe): a count
for the current minute and one for the previous minute, the previous one weighted by how
much of it still overlaps the last 60 seconds (exact when that minute's requests came
evenly). Two integers per counter and no per-request log. The Redis store runs the same
arithmetic in Lua; both report a refusal as a `Denial` so Retry-After is computed once.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.policy import LimitSet

WINDOW_S = 60.0


@dataclass(frozen=True)
class Scope:
    """One set of limits a request counts against: a tenant's, or one key's."""

    kind: str  # "tenant" | "key"
    name: str  # the tenant, or the key's SHA-256 hex
    limits: LimitSet

    @property
    def base(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Denial:
    scope: Scope
    limit: str  # the LimitSet field that refused: requests_per_minute | tokens_per_minute | ...
    prev: int = 0  # the counter's previous and current minute, for Retry-After
    cur: int = 0
    elapsed_s: float = 0.0  # into the current minute
    cost: int = 1


def used(prev: int, cur: int, elapsed_s: float) -> float:
    """The counter's value over the last minute."""
    return prev * (WINDOW_S - elapsed_s) / WINDOW_S + cur


def retry_after_s(denial: Denial) -> float:
    """Seconds until the refused request would fit, if nothing else arrives meanwhile."""
    if denial.limit == "max_concurrent":
        return 1.0  # a slot frees when some request ends: unknown, so ask again soon
    limit = getattr(denial.scope.limits, denial.limit)
    prev, cur, elapsed, cost = denial.prev, denial.cur, denial.elapsed_s, denial.cost
    room = limit - cost - cur
    if room >= 0 and prev > 0:  # fits once enough of the previous minute has slid out
        wait = WINDOW_S * (1 - room / prev) - elapsed
        if wait < WINDOW_S - elapsed:
            return max(wait, 0.0)
    if cost > limit:
        return WINDOW_S  # never fits: the body says so; come back no sooner than a minute
    # Next minute: this minute's count becomes the sliding-out one.
    into_next = WINDOW_S * (1 - (limit - cost) / cur) if cur > 0 else 0.0
    return WINDOW_S - elapsed + max(into_next, 0.0)


def retry_after_header(denial: Denial) -> str:
    return str(max(1, math.ceil(retry_after_s(denial))))


@dataclass
class _Counter:
    minute: int = 0
    cur: int = 0
    prev: int = 0

    def roll(self, minute: int) -> None:
        if minute != self.minute:
            self.prev = self.cur if minute == self.minute + 1 else 0
            self.cur, self.minute = 0, minute


class MemoryStore:
    """The limits of one process; also the fallback while Redis is unreachable.

    Not thread-safe, and needs none: it runs on the event loop and never awaits, so each
    admission's check-then-count is atomic.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counters: dict[tuple[str, str], _Counter] = {}
        self._in_flight: dict[str, int] = {}

    def _counter(self, scope: Scope, kind: str, minute: int) -> _Counter:
        counter = self._counters.setdefault((scope.base, kind), _Counter(minute))
        counter.roll(minute)
        return counter

    def admit(self, scopes: list[Scope], cost: int) -> Denial | None:
        """Count the request against every scope, or against none and say which refused."""
        now = self._clock()
        minute, elapsed = divmod(now, WINDOW_S)
        checks = (("requests_per_minute", "r", 1), ("tokens_per_minute", "t", cost))
        for scope in scopes:
            for field, kind, amount in checks:
                limit = getattr(scope.limits, field)
                if limit is None:
                    continue
                c = self._counter(scope, kind, int(minute))
                if used(c.prev, c.cur, elapsed) + amount > limit:
                    return Denial(scope, field, c.prev, c.cur, elapsed, amount)
            cap = scope.limits.max_concurrent
            if cap is not None and self._in_flight.get(scope.base, 0) >= cap:
                return Denial(scope, "max_concurrent")
        for scope in scopes:
            for field, kind, amount in checks:
                if getattr(scope.limits, field) is not None:
                    self._counter(scope, kind, int(minute)).cur += amount
            if scope.limits.max_concurrent is not None:
                self._in_flight[scope.base] = self._in_flight.get(scope.base, 0) + 1
        return None

    def finish(self, scopes: list[Scope], token_delta: int) -> None:
        """The request ended: correct its token count by `token_delta`, free its slots."""
        minute = int(self._clock() // WINDOW_S)
        for scope in scopes:
            if token_delta and scope.limits.tokens_per_minute is not None:
                c = self._counter(scope, "t", minute)
                c.cur = max(0, c.cur + token_delta)
            if scope.limits.max_concurrent is not None:
                left = self._in_flight.get(scope.base, 0) - 1
                if left > 0:
                    self._in_flight[scope.base] = left
                else:
                    self._in_flight.pop(scope.base, None)
