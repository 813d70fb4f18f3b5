"""Engine metrics in vLLM's terms; one registry per engine so several engines can share a process.

The engine calls the `on_*` hooks; servers expose `registry` on /metrics and read `snapshot()`.
"""

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PREFIX = "tiergate_engine_"


@dataclass
class EngineSnapshot:
    running: int
    waiting: int
    kv_cache_usage_perc: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    generated_tokens: int
    prompt_tokens: int


class EngineMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._labels = {"model_name": model_name}
        self._running = self._add(Gauge, "num_requests_running", "Running requests")
        self._waiting = self._add(Gauge, "num_requests_waiting", "Waiting requests")
        self._kv_usage = self._add(Gauge, "kv_cache_usage_perc", "Fraction of KV pages in use")
        self._prefix_queries = self._add(
            Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache"
        )
        self._prefix_hits = self._add(
            Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache"
        )
        self._preemptions = self._add(
            Counter, "num_preemptions", "Requests preempted (recomputed later)"
        )
        self._generation_tokens = self._add(Counter, "generation_tokens", "Generated tokens")
        self._prompt_tokens = self._add(
            Counter, "prompt_tokens", "Prompt tokens prefilled or reused"
        )
        buckets = {"buckets": _LATENCY_BUCKETS}
        self._ttft = self._add(
            Histogram, "time_to_first_token_seconds", "Time to first token", **buckets
        )
        self._itl = self._add(
            Histogram, "inter_token_latency_seconds", "Time between output tokens", **buckets
        )

    def _add(self, kind: type, name: str, doc: str, **kwargs: Any) -> Any:
        """The metric's child for this engine's model_name."""
        metric = kind(_PREFIX + name, doc, [*self._labels], registry=self.registry, **kwargs)
        return metric.labels(**self._labels)

    def set_kernel_info(self, info: dict[str, str]) -> None:
        """The kernels this engine runs and the CPU features they were chosen by, as one
        info gauge (value 1, the facts in its labels), set once at start."""
        gauge = Gauge(
            _PREFIX + "kernel_info",
            "Kernel paths, weight format and CPU features (labels)",
            [*self._labels, *info],
            registry=self.registry,
        )
        gauge.labels(**self._labels, **info).set(1)

    def on_step(self, running: int, waiting: int, kv_usage: float) -> None:
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv_usage.set(kv_usage)

    def on_prefix_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        self._prefix_queries.inc(queried_tokens)
        self._prefix_hits.inc(hit_tokens)

    def on_prompt(self, prompt_tokens: int) -> None:
        self._prompt_tokens.inc(prompt_tokens)

    def on_preemption(self) -> None:
        self._preemptions.inc()

    def on_token(self) -> None:
        self._generation_tokens.inc()

    def on_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def snapshot(self) -> EngineSnapshot:
        """The gauges and counters as they stand, read back from the registry."""
        value = {
            s.name.removeprefix(_PREFIX): s.value
            for metric in self.registry.collect()
            for s in metric.samples
            if s.labels == self._labels
        }
        return EngineSnapshot(
            running=int(value["num_requests_running"]),
            waiting=int(value["num_requests_waiting"]),
            kv_cache_usage_perc=value["kv_cache_usage_perc"],
            prefix_cache_queries=int(value["prefix_cache_queries_total"]),
            prefix_cache_hits=int(value["prefix_cache_hits_total"]),
            preemptions=int(value["num_preemptions_total"]),
            generated_tokens=int(value["generation_tokens_total"]),
            prompt_tokens=int(value["prompt_tokens_total"]),
        )
