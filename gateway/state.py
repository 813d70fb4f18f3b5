"""What the request handlers read: the running policy's objects, swapped whole on reload."""

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from httpx import AsyncClient

from gateway.backends.base import Backend, BackendError
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends
from gateway.backends.local import LocalBackend, LocalEngines
from gateway.backends.openai_compat import NATIVE_PROVIDERS, OpenAICompatBackend
from gateway.backends.remote import RemoteBackend, load_litellm
from gateway.embedding import SharedEmbedder
from gateway.policy import Deployment, Policy, PolicyWatcher
from gateway.routing.router import Router, Scorer, ScorerFactory
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
    http: AsyncClient  # one connection pool for every OpenAI-compatible remote
    scorer_factory: ScorerFactory | None = None
    policy_path: Path | None = None
    watcher: PolicyWatcher | None = None
    embedder: SharedEmbedder | None = None  # one for the cache and the router


def _uses_litellm(policy: Policy, dep: Deployment) -> bool:
    if policy.is_local(dep):
        return False
    return dep.client == "litellm" or dep.model.split("/", 1)[0] not in NATIVE_PROVIDERS


@dataclass
class Prepared:
    """What a policy needs that takes time to get: its engines and its scorer."""

    engines: dict[str, Any]  # engines-section name -> running engine
    scorer: Scorer | None


async def prepare(
    policy: Policy, engines: LocalEngines, scorer_factory: ScorerFactory | None
) -> Prepared:
    """Everything slow, done before the policy serves: local engines started, litellm
    imported if used, the difficulty scorer built."""
    running = await engines.start(policy.local_engines())
    deployments = [d for t in policy.tiers.values() for d in t.deployments]
    if any(_uses_litellm(policy, d) for d in deployments):
        await asyncio.to_thread(load_litellm)
    scorer = await scorer_factory(policy) if scorer_factory is not None else None
    return Prepared(running, scorer)


def _backend(
    policy: Policy, tier_timeout: float, dep: Deployment, engines: dict[str, Any], http: AsyncClient
) -> Backend:
    if policy.is_local(dep):
        return LocalBackend(dep.model, engines[dep.model])
    timeout_s = dep.timeout_s or tier_timeout
    if _uses_litellm(policy, dep):
        return RemoteBackend(dep, timeout_s)
    return OpenAICompatBackend(dep, timeout_s, http)


def build_runtime(
    policy: Policy,
    prepared: Prepared,
    cooldowns: Cooldowns,
    stats: Stats,
    http: AsyncClient,
) -> Runtime:
    """Wire one policy's tiers to backends (cheap: the slow part was `prepare`)."""
    engines = prepared.engines
    tiers = {
        name: TierBackends(
            name,
            tier,
            [(d, _backend(policy, tier.timeout_s, d, engines, http)) for d in tier.deployments],
        )
        for name, tier in policy.tiers.items()
    }

    def on_failure(tier: str, model: str, error: BackendError) -> None:
        stats.deployment_failed(tier, model, error.status)

    chain = FallbackChain(tiers, cooldowns, on_failure)
    tenants = {k.key: k.tenant for k in policy.auth.keys}
    return Runtime(policy, Router(policy, prepared.scorer), chain, tenants)
