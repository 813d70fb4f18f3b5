"""create_app(policy): wires routing, backends and stats; the lifespan runs the local engines."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from engine.entrypoints.body_limit import BodyLimit
from engine.entrypoints.openai.errors import install_error_handlers
from gateway.api import (
    admin,
    admin_cache,
    admin_keys,
    admin_samples,
    batches,
    dashboard,
    embeddings,
    files,
    health,
    messages,
    openai,
    responses,
)
from gateway.api.headers import TiergateHeaders
from gateway.api.openapi import install_openapi
from gateway.backends.balance import Balancer
from gateway.backends.fallback import deployment_key
from gateway.backends.health import HealthChecker, ReplicaMetrics
from gateway.backends.local import EngineFactory, LocalEngines, default_engine_factory
from gateway.batch.runner import BatchRunner
from gateway.cache.semantic import SemanticCache
from gateway.cache.verifiers import load_verifier
from gateway.drain import Drain
from gateway.embedding.shared import SharedEmbedder
from gateway.keys import ManagedKeys
from gateway.limits import Limiter
from gateway.policy import Deployment, Policy, PolicyError, PolicyIssue, PolicyWatcher
from gateway.policy.watcher import example_files
from gateway.replicas import Fleet, ReplicaSync, replica_id
from gateway.replicas.fleet import policy_sha256
from gateway.replicas.signing import policy_secret
from gateway.routing.difficulty import difficulty_scorer_factory
from gateway.routing.router import ScorerFactory
from gateway.state import GatewayState, build_runtime, prepare
from gateway.stats.counters import CountedCooldowns, Stats, read_samples
from gateway.stats.history import StatsHistory
from gateway.stats.view import replica_report

logger = logging.getLogger("tiergate")
# Streams hold a connection each for their whole length: allow many at once.
_HTTP_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256)


def _applier(state: GatewayState):
    """The hot-reload step after validation: start new engines, then swap the runtime."""

    async def apply(policy: Policy) -> None:
        if policy.server != state.runtime.policy.server:
            logger.warning("server settings changed: they take effect at the next restart")
        try:
            prepared = await prepare(policy, state.engines, state.scorer_factory)
            await _reload_cache(state, policy)
        except PolicyError:  # e.g. a difficulty example set the classifier cannot use
            raise
        except Exception as exc:  # e.g. a model that is not installed
            issue = PolicyIssue("", f"preparing the policy failed: {exc}")
            raise PolicyError(str(state.policy_path), [issue]) from exc
        state.runtime = build_runtime(
            policy, prepared, state.cooldowns, state.stats, state.http, state.balancer
        )
        state.engines.activate(prepared.engines)  # after the swap: retire what is unused

    return apply


async def _start_cache(policy: Policy, shared: SharedEmbedder) -> SemanticCache | None:
    """The semantic cache on the shared embedder, when the policy turns the cache on."""
    if not policy.cache.enabled:
        return None
    embedder = await shared.get(policy.embedder)
    verifier = await asyncio.to_thread(load_verifier, policy.cache.verifier_model)
    return await SemanticCache.open(policy.cache, embedder, verifier)


async def _reload_cache(state: GatewayState, policy: Policy) -> None:
    """A reload's cache section: most keys apply to the open cache at once; a new store
    (or the cache turned on) opens a new cache, and the old one closes after the swap.
    Turned off, the cache stays open unused (every route reads `enabled` per request)."""
    old = state.cache
    if not policy.cache.enabled or (old is not None and old.reconfigure(policy.cache)):
        return
    state.cache = await _start_cache(policy, state.embedder)
    if old is not None:
        await old.close()


async def _stop_cache(state: GatewayState) -> None:
    if state.background:  # stores under way finish, or are dropped after a moment
        await asyncio.wait(list(state.background), timeout=5)
    if state.cache is not None:
        await state.cache.close()
    if state.samples is not None:
        await state.samples.close()
    await state.embedder.close()


async def _start_replica_sync(
    state: GatewayState, policy: Policy, replica: str
) -> asyncio.Task | None:
    """Share stats and policy reloads with the replicas on the policy's Redis (if any)."""
    url = policy.replicas_redis_url()  # read at start, like the rest of `server`
    fleet = None
    try:
        fleet = Fleet(url, f"{policy.cache.redis_prefix}:replicas") if url else None
    except ValueError as exc:  # e.g. limits.redis_url with a scheme redis-py cannot read
        logger.error("replicas: not sharing stats or reloads, bad Redis URL: %s", exc)
    history = state.history
    assert history is not None
    state.replicas = ReplicaSync(
        fleet, replica, lambda: replica_report(history, replica), secret=policy_secret()
    )
    if state.watcher is not None:
        state.replicas.watcher = state.watcher
        state.watcher.on_loaded = state.replicas.policy_loaded
        with contextlib.suppress(PolicyError):
            state.replicas.policy_sha = policy_sha256(state.watcher.read())
    if fleet is None:
        return None
    await state.replicas.join()
    return asyncio.create_task(state.replicas.run())


def create_app(
    policy: Policy,
    *,
    policy_path: str | Path | None = None,
    engine_factory: EngineFactory = default_engine_factory,
    scorer_factory: ScorerFactory | None = None,
    retire_grace_s: float = 5.0,
    replica: str | None = None,
) -> FastAPI:
    """The gateway for `policy`. With `policy_path` the file is watched and reloadable.

    `engine_factory` builds local engines (tests may pass their own); `scorer_factory` is
    the difficulty router's hook: it builds a policy's scorer at start-up and on reload
    (default: the trained difficulty score, on the embedder the cache shares).
    A local engine a reload retires is stopped `retire_grace_s` after the swap at the
    earliest, and never while a request still holds it. `replica` names this gateway
    among the replicas sharing its Redis (default: TIERGATE_REPLICA_ID, else host:pid).
    """

    embedder = SharedEmbedder()
    if scorer_factory is None:
        scorer_factory = difficulty_scorer_factory(embedder.get)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stats = Stats()
        cooldowns = CountedCooldowns(stats)

        def on_restart(engine: str) -> None:
            stats.engine_restarted(engine)
            cooldowns.reset(deployment_key(Deployment(model=engine)))  # serve on it again now

        engines = LocalEngines(engine_factory, retire_grace_s, on_restart)
        prepared = await prepare(policy, engines, scorer_factory)
        engines.activate(prepared.engines)
        http = httpx.AsyncClient(limits=_HTTP_LIMITS)
        balancer = Balancer()
        # No local name for the first runtime: this frame lives as long as the app, and a
        # runtime held here would keep engines a reload retires from ever being stopped.
        path = Path(policy_path) if policy_path is not None else None
        state = GatewayState(
            build_runtime(policy, prepared, cooldowns, stats, http, balancer),
            stats,
            engines,
            cooldowns,
            http,
            scorer_factory,
            path,
            embedder=embedder,
            balancer=balancer,
        )
        state.cache = await _start_cache(policy, embedder)
        state.history = StatsHistory(
            lambda: read_samples(stats.registry, *state.engine_registries())
        )
        history_task = asyncio.create_task(state.history.run())

        def tiers_now() -> dict:
            return state.runtime.chain.tiers

        health = HealthChecker(balancer, cooldowns, http, tiers_now)
        stats.registry.register(ReplicaMetrics(balancer, tiers_now))
        health_task = asyncio.create_task(health.run())
        app.state.gateway = state
        app.state.limiter = Limiter(stats.registry)
        app.state.managed_keys = ManagedKeys()
        app.state.drain = Drain()
        watch_task = None
        if path is not None:
            interval = policy.server.reload_interval_s
            state.watcher = PolicyWatcher(
                path, _applier(state), interval, stats.policy_reload, example_files(policy)
            )
            if interval > 0:
                watch_task = asyncio.create_task(state.watcher.watch())
        sync_task = await _start_replica_sync(state, policy, replica or replica_id())
        app.state.batches = BatchRunner(app)
        await app.state.batches.resume()  # batches a stopped gateway left unfinished
        try:
            yield
        finally:
            await app.state.batches.close()  # lines in flight run again at the next start
            for task in (history_task, health_task, watch_task, sync_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await state.replicas.close()
            await _stop_cache(state)
            await http.aclose()
            await app.state.limiter.close()
            await app.state.managed_keys.close()
            await engines.shutdown()

    app = FastAPI(title="tiergate", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(messages.router)
    app.include_router(health.router)
    app.include_router(embeddings.router)
    app.include_router(admin.router)
    app.include_router(admin_cache.router)
    app.include_router(admin_keys.router)
    app.include_router(admin_samples.router)
    app.include_router(dashboard.router)
    app.add_middleware(TiergateHeaders)
    app.add_middleware(BodyLimit, max_body_bytes=policy.server.max_body_bytes)  # outermost
    return app
