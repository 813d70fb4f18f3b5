"""One replica's part in the fleet: every 5 s it publishes its stats windows, and every
second it checks whether another replica put a new policy in force, which it then applies
through the same validated path as its own file (refused here: the running policy stays,
the error shows in GET /admin/policy). Shared policies are signed with the fleet's secret
(signing.py); one whose signature does not check out is refused the same way. Redis down:
nothing is shared meanwhile, nothing fails.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from gateway.policy import PolicyError, PolicyIssue, PolicyWatcher
from gateway.replicas.fleet import Fleet, SharedPolicy, policy_sha256
from gateway.replicas.report import ReplicaReport
from gateway.replicas.signing import SECRET_ENV, sign, signed_by

logger = logging.getLogger("tiergate.replicas")

SYNC_INTERVAL_S = 1.0  # how often the shared policy is checked
# How often this replica's stats are written: reading them costs tens of ms on the event
# loop (bench/replica_stats.py), and /admin/stats windows are 5 s snapshots anyway.
STATS_EVERY_S = 5.0
JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class FleetStats:
    """What /admin/stats adds to this replica's own figures."""

    replica: str
    shared: bool  # False: the others' figures could not be read (or there is no Redis)
    error: str | None  # why not, when a Redis is configured
    others: list[ReplicaReport]


class ReplicaSync:
    def __init__(
        self,
        fleet: Fleet | None,
        replica: str,
        report: Callable[[], ReplicaReport],
        interval_s: float = SYNC_INTERVAL_S,
        secret: bytes | None = None,
    ) -> None:
        self.fleet, self.replica, self.interval_s = fleet, replica, interval_s
        self._report = report
        self._secret = secret  # None: policies are neither published nor applied
        self.watcher: PolicyWatcher | None = None  # None: no policy file, nothing to apply
        self.policy_sha: str | None = None  # the text in force (this file's or shared)
        self._seen: int | None = None  # the shared policy version last looked at
        self._down = False
        self._stats_due = 0.0  # monotonic time of the next stats write
        self.last_shared = False  # whether the last reload of the file reached the fleet

    async def join(self) -> None:
        """The first round, before the gateway serves: from here on a policy that another
        replica shares is applied (the one shared before this replica started is not: it
        serves its own file). Bounded: a Redis that does not answer is left to `run`."""
        if self.fleet is not None and self._secret is None:
            logger.warning("replicas: %s is not set: policy reloads are not shared", SECRET_ENV)
        try:
            await asyncio.wait_for(self.tick(), JOIN_TIMEOUT_S)
        except TimeoutError:
            self._failed(TimeoutError(f"no answer in {JOIN_TIMEOUT_S} s"))
        except Exception:  # sharing is never a reason not to serve
            logger.exception("replica sync failed")

    async def run(self) -> None:
        """Every round after `join`'s, until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except Exception:  # a bug in one round must not end sharing for good
                logger.exception("replica sync failed")

    async def tick(self) -> None:
        if self.fleet is None:
            return
        try:
            if time.monotonic() >= self._stats_due:
                await self.fleet.publish_stats(self._report())
                self._stats_due = time.monotonic() + STATS_EVERY_S
            await self._follow_policy(self.fleet)
        except RedisError as exc:
            self._failed(exc)
            return
        if self._down:
            logger.info("replicas: Redis answers again; sharing stats and policies")
        self._down = False

    async def _follow_policy(self, fleet: Fleet) -> None:
        head = await fleet.policy_head()
        if self._seen is None:  # at start this replica's own file is in force
            self._seen = head.version
            return
        if head.version == self._seen:
            return
        self._seen = head.version
        if self.watcher is None or head.origin == self.replica or head.sha256 == self.policy_sha:
            return
        shared = await fleet.policy_text()
        if shared is None:
            return
        self._seen = version = shared.version
        source = f"the policy replica {head.origin} shared"
        if not self._authentic(shared, source):
            return
        # A reload of this replica's own file may publish a newer one meanwhile: then this
        # older text must not replace it.
        text = shared.text
        applied = await self.watcher.apply_text(text, source, lambda: self._seen == version)
        if applied is not None:
            self.policy_sha = policy_sha256(text)

    def _authentic(self, shared: SharedPolicy, source: str) -> bool:
        """Whether the fleet's secret signed this text; if not, it is refused as an invalid
        policy would be (logged, counted, shown in GET /admin/policy)."""
        if self._secret is not None and signed_by(self._secret, shared.text, shared.signature):
            return True
        if self._secret is None:
            reason = f"not applied: this replica has no {SECRET_ENV} to check its signature"
        else:
            reason = f"not applied: its signature is missing or not made with {SECRET_ENV}"
        assert self.watcher is not None
        self.watcher.refuse(PolicyError(source, [PolicyIssue("", reason)]))
        return False

    async def policy_loaded(self, text: str) -> bool:
        """This replica put its file's `text` in force: share it. False when it could not."""
        self.policy_sha = policy_sha256(text)
        self.last_shared = False
        if self.fleet is None:
            return False
        if self._secret is None:
            logger.warning("replicas: reload not shared: %s is not set", SECRET_ENV)
            return False
        try:
            signature = sign(self._secret, text)
            self._seen = await self.fleet.publish_policy(text, self.replica, signature)
        except RedisError as exc:
            self._failed(exc)
            return False
        self.last_shared = True
        return True

    async def fleet_stats(self) -> FleetStats:
        if self.fleet is None:
            return FleetStats(self.replica, False, None, [])
        try:
            others = await self.fleet.reports(exclude=self.replica)
        except RedisError as exc:
            self._failed(exc)
            error = "Redis is unreachable: these figures are this replica's only"
            return FleetStats(self.replica, False, error, [])
        return FleetStats(self.replica, True, None, others)

    def _failed(self, exc: Exception) -> None:
        if not self._down:  # log once per outage, not per second
            logger.warning("replicas: Redis failed (%s); not sharing stats or policies", exc)
        self._down = True

    async def close(self) -> None:
        if self.fleet is None:
            return
        with contextlib.suppress(RedisError, OSError):
            await self.fleet.forget(self.replica)  # leaves the fleet's figures at once
        await self.fleet.close()
