"""Health probes of remote replicas: a dead one leaves its tier's rotation, a live one returns.

Failures already take a replica out for the tier's `cooldown_s` (fallback.py). A probe
adds two things: a replica that died is skipped before a request has to fail on it, and
one that comes back serves again at the next probe rather than at the end of a cooldown.
Probed: `hosted_vllm/` deployments with an `api_base` (vLLM, SGLang and `tiergate engine`
all answer `GET /health` at the server's root) of tiers that set `health_check_s`; the
deployment's key goes along, for servers that guard /health too.
"""

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from prometheus_client.core import GaugeMetricFamily

from gateway.backends.balance import Balancer
from gateway.backends.fallback import Cooldowns, TierBackends, deployment_key
from gateway.policy import Deployment

logger = logging.getLogger("tiergate.health")
PROBE_TIMEOUT_S = 5.0  # not tied to the interval: a busy replica may answer slowly


def health_url(deployment: Deployment) -> str | None:
    """`http://host:port/health` for a probed deployment, else None."""
    if deployment.api_base is None or not deployment.model.startswith("hosted_vllm/"):
        return None
    base = deployment.api_base.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/health"


@dataclass(frozen=True)
class Probe:
    url: str
    timeout_s: float
    key_env: str | None  # environment variable holding the deployment's key


async def probe(http: httpx.AsyncClient, target: Probe) -> bool:
    key = os.environ.get(target.key_env) if target.key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = await http.get(target.url, headers=headers, timeout=target.timeout_s)
    except (httpx.HTTPError, OSError):
        return False
    return response.status_code == 200


class HealthChecker:
    def __init__(
        self,
        balancer: Balancer,
        cooldowns: Cooldowns,
        http: httpx.AsyncClient,
        tiers_now: Callable[[], dict[str, TierBackends]],  # the running policy's tiers
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._balancer, self._cooldowns, self._http = balancer, cooldowns, http
        self._tiers_now, self._clock = tiers_now, clock
        self._last: dict[str, float] = {}  # deployment key -> when it was last probed

    def due(self) -> dict[str, Probe]:
        """Deployment key -> its probe, for replicas due one now."""
        now, out = self._clock(), {}
        for tier in self._tiers_now().values():
            interval = tier.tier.health_check_s
            if interval <= 0:
                continue
            for dep, _ in tier.backends:
                key, url = deployment_key(dep), health_url(dep)
                if url is not None and now - self._last.get(key, -interval) >= interval:
                    out[key] = Probe(url, PROBE_TIMEOUT_S, dep.api_key_env)
        return out

    async def check_once(self) -> None:
        probed = {
            deployment_key(d)
            for t in self._tiers_now().values()
            if t.tier.health_check_s > 0
            for d, _ in t.backends
            if health_url(d) is not None
        }
        for key in self._balancer.down_keys() - probed:  # no longer probed: not held down
            self._balancer.mark(key, True)
        due = self.due()
        for key in due:
            self._last[key] = self._clock()
        verdicts = await asyncio.gather(*(probe(self._http, p) for p in due.values()))
        for key, alive in zip(due, verdicts, strict=True):
            if not self._balancer.mark(key, alive):
                continue
            if alive:
                logger.warning("%s answers its health probe again: back in rotation", key)
                self._cooldowns.reset(key)  # it was down by the probe's word, not a request's
            else:
                logger.warning("%s failed its health probe: out of rotation", key)

    async def run(self, tick_s: float = 0.5) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # a probe bug must not stop probing
                logger.exception("health probes failed")
            await asyncio.sleep(tick_s)


class ReplicaMetrics:
    """Prometheus collector: each deployment's requests in flight and probe verdict, read
    live from the balancer (label `deployment` is the key, model@api_base)."""

    def __init__(
        self, balancer: Balancer, tiers_now: Callable[[], dict[str, TierBackends]]
    ) -> None:
        self._balancer, self._tiers_now = balancer, tiers_now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        keys = {deployment_key(d) for t in self._tiers_now().values() for d, _ in t.backends}
        up = GaugeMetricFamily(
            "tiergate_replica_up",
            "0 while a health probe finds the deployment dead",
            labels=["deployment"],
        )
        busy = GaugeMetricFamily(
            "tiergate_replica_outstanding",
            "Requests this gateway has in flight at the deployment",
            labels=["deployment"],
        )
        for key in sorted(keys):
            up.add_metric([key], 0.0 if self._balancer.is_down(key) else 1.0)
            busy.add_metric([key], float(self._balancer.outstanding.get(key, 0)))
        yield up
        yield busy
