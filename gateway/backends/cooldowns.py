"""Cooldowns: deployments that failed recently are skipped for a while, for one tenant or
for every one (see `Cooldowns`)."""

import time
from collections.abc import Callable


class Cooldowns:
    """Deployments that failed recently are skipped until their cooldown ends.

    A failure the request may have caused itself (a timeout, a 5xx) cools the deployment
    down for that tenant only: one tenant's bad requests must not take a deployment away
    from everyone. Once a second tenant sees such a failure within the cooldown, or on a
    failure that is the deployment's own (`deployment_fault`), it cools down for all.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}  # deployment key -> end of its cooldown
        self._tenant_until: dict[tuple[str, str], float] = {}

    def cooling(self, key: str, tenant: str | None = None) -> bool:
        now = self._clock()
        if self._until.get(key, 0.0) > now:
            return True
        return tenant is not None and self._tenant_until.get((key, tenant), 0.0) > now

    def trip(self, key: str, seconds: float, tenant: str | None = None) -> None:
        """Cool `key` down for everyone, or with `tenant` for that tenant (see above)."""
        if seconds <= 0:
            return
        now = self._clock()
        until = now + seconds
        if tenant is not None:
            others = [t for (k, t), end in self._tenant_until.items() if k == key and end > now]
            if not others or others == [tenant]:
                self._drop_expired(now)
                self._tenant_until[(key, tenant)] = until
                return
        self._until[key] = until

    def _drop_expired(self, now: float) -> None:
        # Bounded by the tenants that failed lately; cleaned as new ones arrive.
        for entry in [e for e, end in self._tenant_until.items() if end <= now]:
            del self._tenant_until[entry]

    def reset(self, key: str) -> None:
        """The deployment is known good again (its local engine restarted, or its health
        probe passes after failing): for every tenant too, as its failures were its own."""
        self._until.pop(key, None)
        for entry in [e for e in self._tenant_until if e[0] == key]:
            del self._tenant_until[entry]
