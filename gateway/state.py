"""What the request handlers read: the running policy's objects, swapped whole on reload."""

import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.backends.base import Backend
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends
from gateway.backends.local import LocalBackend, LocalEngines
from gateway.backends.remote import RemoteBackend
from gateway.policy import Policy, PolicyWatcher
from gateway.routing.router import Router, Scorer
from gateway.stats import Stats


@dataclass(frozen=True)
class Runtime:
    """Everything derived from one policy. Handlers take one reference per request, so a
    reload never mixes two policies within a request."""

    policy: Policy
    router: Router
    chain: FallbackChain
    tenants: dict[str, str]  # bearer key -> tenant; empty: no auth
    loaded_at: float = field(default_factory=time.time)


@dataclass
class GatewayState:
    runtime: Runtime
    stats: Stats
    engines: LocalEngines
    cooldowns: Cooldowns
    scorer: Scorer | None = None
    policy_path: Path | None = None
    watcher: PolicyWatcher | None = None


def _backend(policy: Policy, tier_timeout: float, dep, engines: LocalEngines) -> Backend:
    if policy.is_local(dep):
        return LocalBackend(dep.model, engines.get(dep.model))
    return RemoteBackend(dep, dep.timeout_s or tier_timeout)


def build_runtime(
    policy: Policy,
    engines: LocalEngines,
    cooldowns: Cooldowns,
    stats: Stats,
    scorer: Scorer | None = None,
) -> Runtime:
    """Wire one policy's tiers to backends; the local engines must be started already."""
    tiers = {
        name: TierBackends(
            name,
            tier,
            [(d, _backend(policy, tier.timeout_s, d, engines)) for d in tier.deployments],
        )
        for name, tier in policy.tiers.items()
    }

    def on_failure(tier: str, model: str, error) -> None:
        stats.deployment_failed(tier, model, error.status)

    chain = FallbackChain(tiers, cooldowns, on_failure)
    tenants = {k.key: k.tenant for k in policy.auth.keys}
    return Runtime(policy, Router(policy, scorer), chain, tenants)
