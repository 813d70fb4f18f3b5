"""What the request handlers read: the running policy's objects, swapped whole on reload."""

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from httpx import AsyncClient

from gateway.backends.balance import Balancer
from gateway.backends.base import Backend, BackendError
from gateway.backends.fallback import Cooldowns, FallbackChain, TierBackends
from gateway.backends.local import EngineSlot, LocalBackend, LocalEngines
from gateway.backends.openai_compat import NATIVE_PROVIDERS, OpenAICompatBackend
from gateway.backends.remote import RemoteBackend, load_litellm
from gateway.cache.semantic import SemanticCache
from gateway.embedding.shared import SharedEmbedder
from gateway.policy import Deployment, Policy, PolicyWatcher
from gateway.pricing import deployment_price
from gateway.replicas import ReplicaReport, ReplicaSync
from gateway.routing.router import Router, Scorer, ScorerFactory
from gateway.stats.counters import Stats
from gateway.stats.history import StatsHistory


@dataclass(frozen=True)
class Runtime:
    """Everything derived from one policy. Handlers take one reference per request, so a
    reload never mixes two policies within a request."""

    policy: Policy
    router: Router
    chain: FallbackChain
    tenants: dict[str, str]  # SHA-256 hex of a bearer key -> tenant
    key_labels: dict[str, str] = field(default_factory=dict)  # SHA-256 hex -> spend label
    loaded_at: float = field(default_factory=time.time)


def _no_report() -> ReplicaReport:
    raise RuntimeError("a replica without a Redis publishes nothing")


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
    cache: SemanticCache | None = None  # None: the policy turns the cache off
    embedder: SharedEmbedder = field(default_factory=SharedEmbedder)  # cache and router
    background: set[asyncio.Task] = field(default_factory=set)  # e.g. cache stores
    history: StatsHistory | None = None  # snapshots of the stats, for windowed views
    balancer: Balancer = field(default_factory=Balancer)  # replicas' load, prefixes, health
    replicas: ReplicaSync = field(  # the other gateways on the same Redis, if any
        default_factory=lambda: ReplicaSync(None, "-", _no_report)
    )

    def engine_registries(self) -> list[Any]:
        """Each running local engine's metrics registry (a test double may have none)."""
        engines = self.engines.all().values()
        return [e.metrics.registry for e in engines if hasattr(e, "metrics")]


def _uses_litellm(policy: Policy, dep: Deployment) -> bool:
    if policy.is_local(dep):
        return False
    return dep.client == "litellm" or dep.model.split("/", 1)[0] not in NATIVE_PROVIDERS


@dataclass
class Prepared:
    """What a policy needs that takes time to get: its engines and its scorer."""

    engines: dict[str, EngineSlot]  # engines-section name -> its running engine's slot
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
    policy: Policy,
    tier_timeout: float,
    dep: Deployment,
    engines: dict[str, EngineSlot],
    http: AsyncClient,
) -> Backend:
    if policy.is_local(dep):
        return LocalBackend(dep.model, engines[dep.model])
    timeout_s = dep.timeout_s or tier_timeout
    salt_secret = policy.auth.cache_salt_secret
    if _uses_litellm(policy, dep):
        return RemoteBackend(dep, timeout_s, salt_secret)
    return OpenAICompatBackend(dep, timeout_s, http, salt_secret)


def build_runtime(
    policy: Policy,
    prepared: Prepared,
    cooldowns: Cooldowns,
    stats: Stats,
    http: AsyncClient,
    balancer: Balancer | None = None,
) -> Runtime:
    """Wire one policy's tiers to backends (cheap: the slow part was `prepare`)."""
    engines = prepared.engines
    tiers = {
        name: TierBackends(
            name,
            tier,
            [(d, _backend(policy, tier.timeout_s, d, engines, http)) for d in tier.deployments],
            {d.model: deployment_price(policy, tier, d) for d in tier.deployments},
        )
        for name, tier in policy.tiers.items()
    }

    def on_failure(tier: str, model: str, error: BackendError) -> None:
        stats.deployment_failed(tier, model, error.status)

    chain = FallbackChain(tiers, cooldowns, on_failure, balancer=balancer)
    tenants = {k.digest(): k.tenant for k in policy.auth.keys}
    labels = {k.digest(): k.label() for k in policy.auth.keys}
    return Runtime(policy, Router(policy, prepared.scorer), chain, tenants, labels)
