"""Gateway counters in one prometheus registry: the single source for /metrics and /admin/stats."""

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from engine.entrypoints.openai.protocol import Usage
from gateway.backends.fallback import Cooldowns
from gateway.policy import Price
from gateway.routing.router import Decision

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SCORE_BUCKETS = tuple(i / 10 for i in range(1, 11))
_PER_MILLION = 1_000_000
# What windows are differenced from: counters and histogram parts (gauges are read live).
_CUMULATIVE_SUFFIXES = ("_total", "_bucket", "_count", "_sum")

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[str, dict[Labels, float]]  # sample name -> labels -> value


def cost_usd(usage: Usage, price: Price) -> float:
    return (
        usage.prompt_tokens * price.input + usage.completion_tokens * price.output
    ) / _PER_MILLION


class Stats:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "tiergate_requests",
            "Requests answered, by route, tier, model and HTTP status",
            ["route", "tier", "model", "status"],
            registry=r,
        )
        self._prompt_tokens = Counter(
            "tiergate_prompt_tokens", "Prompt tokens", ["tier", "model"], registry=r
        )
        self._completion_tokens = Counter(
            "tiergate_completion_tokens", "Completion tokens", ["tier", "model"], registry=r
        )
        self._cost = Counter(
            "tiergate_cost_usd", "Cost from the tier prices", ["tier", "model"], registry=r
        )
        self._spend = Counter(
            "tiergate_spend_usd",
            "What requests cost their tenants (cache hits as pricing says), by tenant, key, route",
            ["tenant", "key", "route"],
            registry=r,
        )
        self._latency = Histogram(
            "tiergate_request_duration_seconds",
            "Time from request to last byte",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "Time from request to the first piece of the answer",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._failures = Counter(
            "tiergate_deployment_failures",
            "Failed attempts at a deployment (timeouts, errors), before any fallback",
            ["tier", "model", "status"],
            registry=r,
        )
        self._cache = Counter(
            "tiergate_cache_lookups",
            "Semantic cache lookups by outcome: exact, semantic (hits), miss, bypass",
            ["route", "tenant", "outcome"],
            registry=r,
        )
        self._refusals = Counter(
            "tiergate_cache_verifier_refusals",
            "Cache candidates above the similarity floor that the verifier refused",
            ["route", "tenant"],
            registry=r,
        )
        self._saved_tokens = Counter(
            "tiergate_cache_saved_tokens",
            "Tokens the cache avoided, on the tier and model that first gave the answer",
            ["route", "tier", "model", "kind"],
            registry=r,
        )
        self._saved_cost = Counter(
            "tiergate_cache_saved_cost_usd",
            "What cache hits would have cost at their tier's price",
            ["route", "tier", "model"],
            registry=r,
        )
        self._decisions = Counter(
            "tiergate_route_decisions",
            "Routed requests by route, the rule that fired (or default / override) and tier",
            ["route", "rule", "tier"],
            registry=r,
        )
        self._scores = Histogram(
            "tiergate_difficulty_score",
            "Difficulty scores of routed requests whose rules read the score",
            ["route"],
            buckets=_SCORE_BUCKETS,
            registry=r,
        )
        self._reloads = Counter(
            "tiergate_policy_reloads", "Policy reloads by result", ["result"], registry=r
        )
        self._engine_restarts = Counter(
            "tiergate_engine_restarts",
            "Local engines restarted after their step loop died",
            ["engine"],
            registry=r,
        )
        self._tenant_requests = Counter(
            "tiergate_tenant_requests",
            "Completion requests by route (as asked; '-' for a tier or model) and tenant",
            ["route", "tenant"],
            registry=r,
        )
        self._fallbacks = Counter(
            "tiergate_fallbacks",
            "Requests answered by a fallback tier instead of the tier they were routed to",
            ["tier", "served_tier"],
            registry=r,
        )
        self._cooldowns = Counter(
            "tiergate_cooldowns",
            "Times a deployment was put in cooldown after failing",
            ["model"],
            registry=r,
        )
        self._wrong_hits = Counter(
            "tiergate_cache_wrong_hits_reported",
            "Cache entries an admin reported as wrong answers (each removed)",
            registry=r,
        )

        self._embedding_requests = Counter(
            "tiergate_embedding_requests",
            "POST /v1/embeddings requests by tenant and result (ok, error)",
            ["tenant", "result"],
            registry=r,
        )
        self._embedding_inputs = Counter(
            "tiergate_embedding_inputs", "Texts embedded for callers", ["tenant"], registry=r
        )
        self._embedding_tokens = Counter(
            "tiergate_embedding_tokens", "Word pieces embedded for callers", ["tenant"], registry=r
        )

    def request_done(self, route: str, tier: str, model: str, status: int) -> None:
        self._requests.labels(route or "-", tier or "-", model or "-", str(status)).inc()

    def routed(self, decision: Decision) -> None:
        if decision.route is None:  # a tier or deployment named directly: no rule ran
            return
        self._decisions.labels(decision.route, decision.rule or "-", decision.tier).inc()
        if decision.score is not None:
            self._scores.labels(decision.route).observe(decision.score)

    def usage(
        self, tier: str, model: str, usage: Usage, price: Price, cost: float | None = None
    ) -> None:
        """`cost`: what the policy's pricing makes of it (None: `usage` at `price`)."""
        self._prompt_tokens.labels(tier, model).inc(usage.prompt_tokens)
        self._completion_tokens.labels(tier, model).inc(usage.completion_tokens)
        self._cost.labels(tier, model).inc(cost_usd(usage, price) if cost is None else cost)

    def spent(self, tenant: str, key: str, route: str, cost: float) -> None:
        """A request's cost to its tenant (`key`: the key's label, never the key)."""
        self._spend.labels(tenant, key, route or "-").inc(cost)

    def latency(self, tier: str, seconds: float) -> None:
        self._latency.labels(tier).observe(seconds)

    def first_token(self, tier: str, seconds: float) -> None:
        self._ttft.labels(tier).observe(seconds)

    def deployment_failed(self, tier: str, model: str, status: int) -> None:
        self._failures.labels(tier, model, str(status)).inc()

    def cache_lookup(self, route: str, tenant: str, outcome: str, refused: int) -> None:
        self._cache.labels(route, tenant, outcome).inc()
        if refused:
            self._refusals.labels(route, tenant).inc(refused)

    def cache_saved(self, route: str, tier: str, model: str, usage: Usage, price: Price) -> None:
        self._saved_tokens.labels(route, tier, model, "prompt").inc(usage.prompt_tokens)
        self._saved_tokens.labels(route, tier, model, "completion").inc(usage.completion_tokens)
        self._saved_cost.labels(route, tier, model).inc(cost_usd(usage, price))

    def policy_reload(self, ok: bool) -> None:
        self._reloads.labels("ok" if ok else "error").inc()

    def engine_restarted(self, engine: str) -> None:
        self._engine_restarts.labels(engine).inc()

    def tenant_request(self, route: str, tenant: str) -> None:
        self._tenant_requests.labels(route, tenant).inc()

    def fallback(self, tier: str, served_tier: str) -> None:
        self._fallbacks.labels(tier, served_tier).inc()

    def cooldown(self, model: str) -> None:
        self._cooldowns.labels(model).inc()

    def embeddings(self, tenant: str, inputs: int, tokens: int, ok: bool) -> None:
        self._embedding_requests.labels(tenant, "ok" if ok else "error").inc()
        if ok:
            self._embedding_inputs.labels(tenant).inc(inputs)
            self._embedding_tokens.labels(tenant).inc(tokens)

    def wrong_hit_reported(self) -> None:
        self._wrong_hits.inc()

    def exposition(self, *extra: CollectorRegistry) -> bytes:
        """Prometheus text of this registry and of others (e.g. each local engine's)."""
        return generate_latest(_Merged([self.registry, *extra]))

    def snapshot(self) -> dict[str, Any]:
        """Counter totals by name and label set, for JSON views such as /admin/stats."""
        out: dict[str, Any] = defaultdict(dict)
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    out[metric.name][key or "-"] = sample.value
        return dict(out)


def read_samples(*registries: CollectorRegistry) -> Samples:
    """Every cumulative sample of the registries, by name: what a window subtracts."""
    out: Samples = {}
    for registry in registries:
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name.endswith(_CUMULATIVE_SUFFIXES):
                    values = out.setdefault(sample.name, {})
                    labels = tuple(sorted(sample.labels.items()))
                    values[labels] = values.get(labels, 0.0) + sample.value
    return out


class CountedCooldowns(Cooldowns):
    """Cooldowns that count each trip in the stats (by model: the key is `model@api_base`)."""

    def __init__(self, stats: Stats) -> None:
        super().__init__()
        self._stats = stats

    def trip(self, key: str, seconds: float, *args: Any, **kwargs: Any) -> None:
        super().trip(key, seconds, *args, **kwargs)
        if seconds > 0:
            self._stats.cooldown(_model_of_key(key))


def _model_of_key(key: str) -> str:
    # `model@api_base`: either part may hold an "@" (vertex models, user@host), the
    # api_base's scheme never does, so split at the last "@" before "://".
    if key.endswith("@local"):
        return key[: -len("@local")]
    scheme = key.find("://")
    cut = key.rfind("@", 0, scheme) if scheme >= 0 else key.rfind("@")
    return key[:cut] if cut > 0 else key


class _Merged:
    """Several registries as one: engines share metric names (told apart by a model_name
    label), and Prometheus refuses a metric family that appears twice in one scrape."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self._registries = registries

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()
