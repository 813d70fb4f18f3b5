"""create_app(policy): wires routing, backends and stats; the lifespan runs the local engines."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from gateway.api import admin, openai
from gateway.api.headers import TiergateHeaders
from gateway.backends.fallback import Cooldowns
from gateway.backends.local import EngineFactory, LocalEngines, default_engine_factory
from gateway.embedding import SharedEmbedder
from gateway.errors import install_error_handlers
from gateway.policy import Policy, PolicyError, PolicyIssue, PolicyWatcher
from gateway.routing.difficulty import difficulty_scorer_factory
from gateway.routing.router import ScorerFactory
from gateway.state import GatewayState, build_runtime, prepare
from gateway.stats import Stats

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
        except PolicyError:  # e.g. a difficulty example set the classifier cannot use
            raise
        except Exception as exc:  # e.g. a model that is not installed
            issue = PolicyIssue("", f"preparing the policy failed: {exc}")
            raise PolicyError(str(state.policy_path), [issue]) from exc
        state.runtime = build_runtime(policy, prepared, state.cooldowns, state.stats, state.http)
        state.engines.activate(prepared.engines)  # after the swap: retire what is unused

    return apply


def create_app(
    policy: Policy,
    *,
    policy_path: str | Path | None = None,
    engine_factory: EngineFactory = default_engine_factory,
    scorer_factory: ScorerFactory | None = None,
) -> FastAPI:
    """The gateway for `policy`. With `policy_path` the file is watched and reloadable.

    `engine_factory` builds local engines (tests may pass their own); `scorer_factory` is
    the difficulty router's hook: it builds a policy's scorer at start-up and on reload
    (default: the trained difficulty score, on the embedder the cache shares).
    """
    embedder = SharedEmbedder()
    if scorer_factory is None:
        scorer_factory = difficulty_scorer_factory(embedder.get)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines = LocalEngines(engine_factory)
        prepared = await prepare(policy, engines, scorer_factory)
        engines.activate(prepared.engines)
        stats, cooldowns = Stats(), Cooldowns()
        http = httpx.AsyncClient(limits=_HTTP_LIMITS)
        runtime = build_runtime(policy, prepared, cooldowns, stats, http)
        path = Path(policy_path) if policy_path is not None else None
        state = GatewayState(
            runtime, stats, engines, cooldowns, http, scorer_factory, path, embedder=embedder
        )
        app.state.gateway = state
        watch_task = None
        if path is not None:
            interval = policy.server.reload_interval_s
            state.watcher = PolicyWatcher(path, _applier(state), interval, stats.policy_reload)
            if interval > 0:
                watch_task = asyncio.create_task(state.watcher.watch())
        try:
            yield
        finally:
            if watch_task is not None:
                watch_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch_task
            await http.aclose()
            await engines.shutdown()
            await embedder.close()

    app = FastAPI(title="tiergate", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(openai.router)
    app.include_router(admin.router)
    app.add_middleware(TiergateHeaders)
    return app
