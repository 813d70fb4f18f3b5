"""The JSON of GET /admin/stats, built from differences of the stats registry's samples.

Every figure comes from the counters in `gateway/stats/counters.py` (and each local engine's
registry), so /admin/stats and /metrics never disagree; with replicas, the windows add the
other replicas' counters to this one's (each replica's /metrics stays its own). The shape
is documented in docs/operations.md ("Admin view").
"""

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from engine.entrypoints.streaming import CLIENT_CLOSED_REQUEST
from gateway.policy import Price
from gateway.replicas.report import ReplicaReport, Windows, summed
from gateway.replicas.sync import FleetStats
from gateway.stats.counters import Labels, Samples
from gateway.stats.history import Live, Snapshot, StatsHistory, difference

WINDOWS: dict[str, float | None] = {"1m": 60.0, "1h": 3600.0, "all": None}
SERIES_S = 600.0  # what the dashboard's charts span
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
_HIT_OUTCOMES = ("exact", "semantic")
_OUTCOME_FIELDS = {
    "exact": "exact_hits",
    "semantic": "semantic_hits",
    "miss": "misses",
    "bypass": "bypasses",
}
# answered, or the client left: neither is an error
_OK_STATUSES = {"200", str(CLIENT_CLOSED_REQUEST)}
_PER_MILLION = 1_000_000

Prices = dict[tuple[str, str], Price]  # (tier, model) -> price


@functools.lru_cache(maxsize=1 << 16)
def _project(pairs: Labels, labels: tuple[str, ...]) -> tuple[str, ...]:
    # The same label sets come back every poll: projecting each once halves a poll's time.
    found = dict(pairs)
    return tuple(found.get(label, "-") for label in labels)


def total(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """Sum of one sample name's values grouped by `labels` (missing labels read "-")."""
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for pairs, value in samples.get(name, {}).items():
        out[_project(pairs, labels)] += value
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket holding the q-th value."""
    bounds = sorted(buckets)
    count = buckets[bounds[-1]] if bounds else 0.0
    if count <= 0:
        return None
    rank, lower, below = q * count, 0.0, 0.0
    for bound in bounds:
        cumulative = buckets[bound]
        if cumulative >= rank:
            if math.isinf(bound):  # above the top bucket: its lower edge is all we know
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def latency(samples: Samples, name: str, tier: str | None) -> dict[str, float | None]:
    buckets: dict[float, float] = defaultdict(float)
    for pairs, value in samples.get(f"{name}_bucket", {}).items():
        found = dict(pairs)
        if tier is None or found.get("tier") == tier:
            buckets[float(found["le"])] += value
    return {key: quantile(buckets, q) for key, q in QUANTILES.items()}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _cache_rows(samples: Samples, keys: Iterable[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Requests and cache outcomes grouped by `keys` (route and/or tenant)."""
    keys = tuple(keys)
    rows: dict[tuple[str, ...], dict[str, Any]] = defaultdict(
        lambda: {"requests": 0, **dict.fromkeys(_OUTCOME_FIELDS.values(), 0)}
    )
    for key, n in total(samples, "tiergate_tenant_requests_total", *keys).items():
        rows[key]["requests"] += int(n)
    lookups = total(samples, "tiergate_cache_lookups_total", *keys, "outcome")
    for (*key, outcome), n in lookups.items():
        if outcome in _OUTCOME_FIELDS:
            rows[tuple(key)][_OUTCOME_FIELDS[outcome]] += int(n)
    refusals = total(samples, "tiergate_cache_verifier_refusals_total", *keys)
    for key in list(rows) + list(refusals):
        row = rows[key]
        row["verifier_refusals"] = int(refusals.get(key, 0))
        hits = row["exact_hits"] + row["semantic_hits"]
        looked_up = hits + row["misses"] + row["bypasses"]
        row["hit_rate"] = _ratio(hits, looked_up)
    return dict(rows)


def _tiers(samples: Samples) -> dict[str, Any]:
    requests = total(samples, "tiergate_requests_total", "tier", "model", "status")
    prompt = total(samples, "tiergate_prompt_tokens_total", "tier", "model")
    completion = total(samples, "tiergate_completion_tokens_total", "tier", "model")
    cost = total(samples, "tiergate_cost_usd_total", "tier", "model")
    failed = total(samples, "tiergate_deployment_failures_total", "tier", "model")
    cooldowns = total(samples, "tiergate_cooldowns_total", "model")
    fallbacks = total(samples, "tiergate_fallbacks_total", "tier", "served_tier")
    models: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: dict.fromkeys(("requests", "errors", "prompt_tokens", "completion_tokens"), 0)
    )
    for (tier, model, status), n in requests.items():
        models[tier, model]["requests"] += int(n)
        if status not in _OK_STATUSES:
            models[tier, model]["errors"] += int(n)
    for key in {*prompt, *completion, *cost, *failed}:
        row = models[key]
        row["prompt_tokens"] = int(prompt.get(key, 0))
        row["completion_tokens"] = int(completion.get(key, 0))
    tiers: dict[str, Any] = {}
    for (tier, model), row in sorted(models.items()):
        row["cost_usd"] = cost.get((tier, model), 0.0)
        row["failed_attempts"] = int(failed.get((tier, model), 0))
        row["cooldowns"] = int(cooldowns.get((model,), 0))
        entry = tiers.setdefault(tier, {"models": {}})
        entry["models"][model] = row
    for pair in fallbacks:  # a tier skipped while cooling down has fallbacks and no rows
        for tier in pair:
            tiers.setdefault(tier, {"models": {}})
    for tier, entry in tiers.items():
        rows = entry["models"].values()
        for field in ("requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd"):
            entry[field] = sum(r[field] for r in rows)
        entry["fallbacks_out"] = int(sum(n for (t, _), n in fallbacks.items() if t == tier))
        entry["fallbacks_in"] = int(sum(n for (_, s), n in fallbacks.items() if s == tier))
        entry["latency_s"] = latency(samples, "tiergate_request_duration_seconds", tier)
        entry["ttft_s"] = latency(samples, "tiergate_time_to_first_token_seconds", tier)
    return tiers


def _savings(samples: Samples, top: tuple[str, Price]) -> dict[str, Any]:
    """Cost the cache avoided, and cost the router avoided against sending every served
    token to the most expensive tier (`top`) at its price."""
    top_tier, top_price = top
    prompt = total(samples, "tiergate_prompt_tokens_total", "tier", "model")
    completion = total(samples, "tiergate_completion_tokens_total", "tier", "model")
    spent = sum(total(samples, "tiergate_cost_usd_total").values())
    at_top = (
        sum(prompt.values()) * top_price.input + sum(completion.values()) * top_price.output
    ) / _PER_MILLION
    saved_tokens = total(samples, "tiergate_cache_saved_tokens_total", "kind")
    return {
        "cache": {
            "prompt_tokens": int(saved_tokens.get(("prompt",), 0)),
            "completion_tokens": int(saved_tokens.get(("completion",), 0)),
            "cost_usd": sum(total(samples, "tiergate_cache_saved_cost_usd_total").values()),
        },
        "router": {
            "baseline_tier": top_tier,
            "baseline_cost_usd": at_top,
            "cost_usd": max(0.0, at_top - spent),
        },
        "spent_usd": spent,
    }


def _engine_counters(samples: Samples) -> dict[str, Any]:
    queries = total(samples, "tiergate_engine_prefix_cache_queries_total", "model_name")
    hits = total(samples, "tiergate_engine_prefix_cache_hits_total", "model_name")
    preemptions = total(samples, "tiergate_engine_num_preemptions_total", "model_name")
    # Restarts are counted by the policy's engine name, the rest by the engine's model name:
    # the two are the same unless `engines.<name>.model` renames it.
    restarts = total(samples, "tiergate_engine_restarts_total", "engine")
    out = {}
    for key in {*queries, *preemptions, *restarts}:
        out[key[0]] = {
            "prefix_cache_queries": int(queries.get(key, 0)),
            "prefix_cache_hits": int(hits.get(key, 0)),
            "prefix_cache_hit_rate": _ratio(hits.get(key, 0), queries.get(key, 0)),
            "preemptions": int(preemptions.get(key, 0)),
            "restarts": int(restarts.get(key, 0)),
        }
    return out


def _spend(samples: Samples) -> dict[str, Any]:
    """What tenants spent (`tiergate_spend_usd`): per tenant, per key and per route."""
    name = "tiergate_spend_usd_total"
    keys = total(samples, name, "tenant", "key")
    return {
        "usd": sum(total(samples, name).values()),
        "tenants": {t: usd for (t,), usd in sorted(total(samples, name, "tenant").items())},
        "keys": [{"tenant": t, "key": k, "usd": usd} for (t, k), usd in sorted(keys.items())],
        "routes": {r: usd for (r,), usd in sorted(total(samples, name, "route").items())},
    }


def window(samples: Samples, seconds: float, top: tuple[str, Price]) -> dict[str, Any]:
    pairs = _cache_rows(samples, ("route", "tenant"))
    everything = _cache_rows(samples, ()).get((), {})
    wrong = sum(total(samples, "tiergate_cache_wrong_hits_reported_total").values())
    return {
        "seconds": seconds,
        "requests": everything.get("requests", 0),
        "hit_rate": everything.get("hit_rate"),
        "latency_s": latency(samples, "tiergate_request_duration_seconds", None),
        "routes": {k[0]: v for k, v in _cache_rows(samples, ("route",)).items()},
        "tenants": {k[0]: v for k, v in _cache_rows(samples, ("tenant",)).items()},
        "route_tenants": [
            {"route": r, "tenant": t, **row} for (r, t), row in sorted(pairs.items())
        ],
        "tiers": _tiers(samples),
        "savings": _savings(samples, top),
        "spend": _spend(samples),
        "cache": {"wrong_hits_reported": int(wrong)},
        "engines": _engine_counters(samples),
    }


def _point(old: Snapshot, new: Snapshot, top: tuple[str, Price]) -> dict[str, Any]:
    """One interval of the charts."""
    step = difference(new.samples, old.samples)
    seconds = max(new.at - old.at, 1e-9)
    lat = latency(step, "tiergate_request_duration_seconds", None)
    saved = _savings(new.samples, top)  # cumulative since start
    per_tier = total(step, "tiergate_requests_total", "tier")
    return {
        "t": round(new.at, 3),
        "hit_rate": _cache_rows(step, ()).get((), {}).get("hit_rate"),
        "latency_p50_s": lat["p50"],
        "latency_p95_s": lat["p95"],
        "cost_saved_usd": saved["cache"]["cost_usd"] + saved["router"]["cost_usd"],
        "requests_per_s": {tier: n / seconds for (tier,), n in per_tier.items()},
    }


def series(
    points: list[Snapshot], top: tuple[str, Price], memo: dict[tuple, Any]
) -> dict[str, Any]:
    """Per interval between snapshots: what the dashboard's charts plot. Intervals between
    stored snapshots are computed once (`memo`); only the live one is new per call."""
    names = ("t", "hit_rate", "latency_p50_s", "latency_p95_s", "cost_saved_usd")
    out: dict[str, Any] = {name: [] for name in names} | {"requests_per_s": {}}
    top_key = (top[0], top[1].input, top[1].output)
    for i, (old, new) in enumerate(itertools.pairwise(points)):
        live = new is points[-1]
        key = (old.at, new.at, top_key)
        point = _point(old, new, top) if live else memo.get(key)
        if point is None:
            point = memo[key] = _point(old, new, top)
        for name in names:
            out[name].append(point[name])
        for tier in point["requests_per_s"]:
            out["requests_per_s"].setdefault(tier, [0.0] * i)
        for tier, values in out["requests_per_s"].items():
            values.append(point["requests_per_s"].get(tier, 0.0))
    return out


def engines_now(engines: dict[str, Any]) -> dict[str, Any]:
    """Each local engine's gauges, read now from its metrics."""
    out = {}
    for name, engine in engines.items():
        metrics = getattr(engine, "metrics", None)
        if metrics is None:
            continue
        snap = metrics.snapshot()
        inner = getattr(engine, "engine", engine)  # AsyncEngine wraps the LLMEngine
        out[name] = {
            "model_name": getattr(inner, "model_name", name),  # the windows' engine key
            "running": snap.running,
            "waiting": snap.waiting,
            "kv_cache_usage_perc": snap.kv_cache_usage_perc,
        }
    return out


def window_samples(history: StatsHistory, now: Live) -> Windows:
    """Each window's counters: the live ones minus the snapshot the window starts from."""
    out: Windows = {}
    for name, seconds in WINDOWS.items():
        base = history.baseline(seconds, now.at)
        out[name] = (round(now.at - base.at, 3), difference(now.samples, base.samples))
    return out


def replica_report(history: StatsHistory, replica: str) -> ReplicaReport:
    """This replica's windows, as the other replicas read them (see gateway/replicas)."""
    now = history.now()
    return ReplicaReport(replica, now.at, history.started_at, window_samples(history, now))


def replica_row(samples: Samples) -> dict[str, Any]:
    """One replica's headline figures in a window (the fleet's sum has every detail)."""
    everything = _cache_rows(samples, ()).get((), {})
    statuses = total(samples, "tiergate_requests_total", "status")
    return {
        "requests": everything.get("requests", 0),
        "hit_rate": everything.get("hit_rate"),
        "errors": int(sum(n for (status,), n in statuses.items() if status not in _OK_STATUSES)),
        "cost_usd": sum(total(samples, "tiergate_cost_usd_total").values()),
        "latency_s": latency(samples, "tiergate_request_duration_seconds", None),
    }


def stats_view(
    history: StatsHistory,
    prices: Prices,
    top: tuple[str, Price],
    engines: dict[str, Any],
    fleet: FleetStats | None = None,
) -> dict[str, Any]:
    """`windows` sum this replica's and the other live replicas' (`fleet`) counters;
    `replicas` has each one's headline figures; the rest (engines, series) is this
    replica's."""
    fleet = fleet or FleetStats("-", False, None, [])
    now = history.now()
    own = ReplicaReport(fleet.replica, now.at, history.started_at, window_samples(history, now))
    reports = [own, *fleet.others]
    windows = {name: window(s, seconds, top) for name, (seconds, s) in summed(reports).items()}
    replicas = {
        r.replica: {
            "reported_at": r.at,
            "started_at": r.started_at,
            "windows": {name: replica_row(s) for name, (_, s) in r.windows.items()},
        }
        for r in reports
    }
    return {
        "generated_at": now.at,
        "started_at": history.started_at,
        "interval_s": history.interval_s,
        "replica": fleet.replica,
        "fleet": {"shared": fleet.shared, "error": fleet.error, "replicas": len(reports)},
        "prices": [
            {"tier": t, "model": m, "input": p.input, "output": p.output}
            for (t, m), p in sorted(prices.items())
        ],
        "windows": windows,
        "replicas": replicas,
        "engines": engines_now(engines),
        "series": series(history.points(SERIES_S, now), top, history.derived),
    }
