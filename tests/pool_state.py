"""The engines' state read from /metrics (the gateway's or `tiergate engine`'s: same
names): requests running and waiting, KV usage, tokens generated; and waiting for rest."""

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from tests.load_driver import Target


@dataclass
class PoolState:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # the largest over the engines
    engines: int = 0
    generated_tokens: float = 0.0  # over the engines' lifetime
    requests_by_status: dict[str, float] = field(default_factory=dict)  # the gateway's

    @property
    def at_rest(self) -> bool:
        return self.engines > 0 and self.running == 0 and self.waiting == 0 and self.kv_usage == 0


async def pool_state(target: Target) -> PoolState:
    """Engine gauges from /metrics (the gateway's or `tiergate engine`'s: same names)."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {target.metrics_key}"}
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as client:
        r = await client.get("/metrics", headers=headers)
    r.raise_for_status()
    state = PoolState()
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == "tiergate_engine_num_requests_running":
                state.running += s.value
                state.engines += 1
            elif s.name == "tiergate_engine_num_requests_waiting":
                state.waiting += s.value
            elif s.name == "tiergate_engine_kv_cache_usage_perc":
                state.kv_usage = max(state.kv_usage, s.value)
            elif s.name == "tiergate_engine_generation_tokens_total":
                state.generated_tokens += s.value
            elif s.name == "tiergate_requests_total":
                key = s.labels["status"]
                state.requests_by_status[key] = state.requests_by_status.get(key, 0) + s.value
    return state


async def wait_at_rest(target: Target, deadline_s: float = 120.0) -> PoolState:
    """Poll /metrics until the engines hold no request and no page (or the deadline)."""
    end = time.monotonic() + deadline_s
    state = await pool_state(target)
    while not state.at_rest and time.monotonic() < end:
        await asyncio.sleep(0.2)
        state = await pool_state(target)
    return state
