"""Probes and scrapes: /health (liveness), /ready (engines), /metrics (Prometheus)."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from gateway.api.deps import Metrics, State
from gateway.backends.local import engine_alive

router = APIRouter()


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: State) -> JSONResponse:
    engines, restarts = state.engines.all(), state.engines.restarts()
    report = {n: {"running": engine_alive(e), "restarts": restarts[n]} for n, e in engines.items()}
    dead = [name for name, e in report.items() if not e["running"]]
    if dead:  # a dead engine is being restarted; its tier's fallback serves meanwhile
        body = {"status": "unavailable", "dead_engines": dead, "engines": report}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "engines": report})


@router.get("/metrics")
async def metrics(state: State, _: Metrics) -> Response:
    engine_registries = [
        e.metrics.registry for e in state.engines.all().values() if hasattr(e, "metrics")
    ]
    body = state.stats.exposition(*engine_registries)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
