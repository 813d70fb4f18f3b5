"""Engine metrics in vLLM's terms; one registry per engine so several engines can share a process.

The engine calls the `on_*` hooks; servers expose `registry` on /metrics and read `snapshot()`.
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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
        labels = ["model_name"]
        r = self.registry
        self._running = Gauge(
            "tiergate_engine_num_requests_running", "Running requests", labels, registry=r
        )
        self._waiting = Gauge(
            "tiergate_engine_num_requests_waiting", "Waiting requests", labels, registry=r
        )
        self._kv_usage = Gauge(
            "tiergate_engine_kv_cache_usage_perc", "Fraction of KV pages in use", labels, registry=r
        )
        self._prefix_queries = Counter(
            "tiergate_engine_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            labels,
            registry=r,
        )
        self._prefix_hits = Counter(
            "tiergate_engine_prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            labels,
            registry=r,
        )
        self._preemptions = Counter(
            "tiergate_engine_num_preemptions",
            "Requests preempted (recomputed later)",
            labels,
            registry=r,
        )
        self._generation_tokens = Counter(
            "tiergate_engine_generation_tokens", "Generated tokens", labels, registry=r
        )
        self._prompt_tokens = Counter(
            "tiergate_engine_prompt_tokens", "Prompt tokens prefilled or reused", labels, registry=r
        )
        self._ttft = Histogram(
            "tiergate_engine_time_to_first_token_seconds",
            "Time to first token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._itl = Histogram(
            "tiergate_engine_inter_token_latency_seconds",
            "Time between output tokens",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._labels = {"model_name": model_name}
        self._snapshot = EngineSnapshot(0, 0, 0.0, 0, 0, 0, 0, 0)

    def set_kernel_info(self, info: dict[str, str]) -> None:
        """The kernels this engine runs and the CPU features they were chosen by, as one
        info gauge (value 1, the facts in its labels), set once at start."""
        gauge = Gauge(
            "tiergate_engine_kernel_info",
            "Kernel paths, weight format and CPU features (labels)",
            ["model_name", *info],
            registry=self.registry,
        )
        gauge.labels(**self._labels, **info).set(1)

    def on_step(self, running: int, waiting: int, kv_usage: float) -> None:
        self._running.labels(**self._labels).set(running)
        self._waiting.labels(**self._labels).set(waiting)
        self._kv_usage.labels(**self._labels).set(kv_usage)
        s = self._snapshot
        s.running, s.waiting, s.kv_cache_usage_perc = running, waiting, kv_usage

    def on_prefix_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        self._prefix_queries.labels(**self._labels).inc(queried_tokens)
        self._prefix_hits.labels(**self._labels).inc(hit_tokens)
        self._snapshot.prefix_cache_queries += queried_tokens
        self._snapshot.prefix_cache_hits += hit_tokens

    def on_prompt(self, prompt_tokens: int) -> None:
        self._prompt_tokens.labels(**self._labels).inc(prompt_tokens)
        self._snapshot.prompt_tokens += prompt_tokens

    def on_preemption(self) -> None:
        self._preemptions.labels(**self._labels).inc()
        self._snapshot.preemptions += 1

    def on_tokens(self, count: int) -> None:
        self._generation_tokens.labels(**self._labels).inc(count)
        self._snapshot.generated_tokens += count

    def on_first_token(self, seconds: float) -> None:
        self._ttft.labels(**self._labels).observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self._itl.labels(**self._labels).observe(seconds)

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(**vars(self._snapshot))
