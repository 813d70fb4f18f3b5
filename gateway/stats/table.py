"""The /admin/stats JSON as plain-text tables for a terminal (`tiergate stats`)."""

from typing import Any

WINDOW_NAMES = {"1m": "last minute", "1h": "last hour", "all": "since start"}


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "%":
        return f"{100 * value:.1f}%"
    if kind == "$":
        return f"${value:.2f}" if value >= 1 or value == 0 else f"${value:.6f}"
    if kind == "s":
        return f"{value:.2f}s" if value >= 1 else f"{1000 * value:.0f}ms"
    return str(value)


def table(headers: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first `left` columns are names (left-aligned)."""
    if not rows:
        rows = [["(none)"] + [""] * (len(headers) - 1)]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _summary(w: dict[str, Any], name: str) -> str:
    s = w["savings"]
    return (
        f"{WINDOW_NAMES.get(name, name)} ({w['seconds']:.0f}s): {w['requests']} requests, "
        f"cache hit rate {_fmt(w['hit_rate'], '%')}, latency p50 {_fmt(w['latency_s']['p50'], 's')}"
        f" p95 {_fmt(w['latency_s']['p95'], 's')}\n"
        f"spent {_fmt(s['spent_usd'], '$')}; saved by the cache {_fmt(s['cache']['cost_usd'], '$')}"
        f" ({s['cache']['prompt_tokens'] + s['cache']['completion_tokens']} tokens), by the router "
        f"{_fmt(s['router']['cost_usd'], '$')} (against all on {s['router']['baseline_tier']})"
    )


def _route_rows(w: dict[str, Any]) -> list[list[str]]:
    keys = ("requests", "exact_hits", "semantic_hits", "misses", "bypasses", "verifier_refusals")
    return [
        [r["route"], r["tenant"], *(_fmt(r[k]) for k in keys), _fmt(r["hit_rate"], "%")]
        for r in w["route_tenants"]
    ]


def _tier_rows(w: dict[str, Any]) -> list[list[str]]:
    rows = []
    for tier, t in w["tiers"].items():
        lat, ttft = t["latency_s"], t["ttft_s"]
        for model, m in t["models"].items():
            cells = [
                (m["requests"], ""),
                (m["prompt_tokens"], ""),
                (m["completion_tokens"], ""),
                (lat["p50"], "s"),
                (lat["p95"], "s"),
                (lat["p99"], "s"),
                (ttft["p50"], "s"),
                (m["errors"], ""),
                (m["failed_attempts"], ""),
                (t["fallbacks_out"], ""),
                (m["cooldowns"], ""),
                (m["cost_usd"], "$"),
            ]
            rows.append([tier, model, *(_fmt(v, kind) for v, kind in cells)])
    return rows


def _spend_rows(w: dict[str, Any]) -> list[list[str]]:
    spend = w.get("spend") or {"keys": []}  # an older replica's view has none
    return [[r["tenant"], r["key"], _fmt(r["usd"], "$")] for r in spend["keys"]]


def _engine_rows(stats: dict[str, Any], w: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, e in stats["engines"].items():
        c = w["engines"].get(e["model_name"], {})
        cells = [
            (e["running"], ""),
            (e["waiting"], ""),
            (e["kv_cache_usage_perc"], "%"),
            (c.get("prefix_cache_hit_rate"), "%"),
            (c.get("preemptions"), ""),
        ]
        rows.append([name, *(_fmt(v, kind) for v, kind in cells)])
    return rows


def _replica_rows(stats: dict[str, Any], window: str) -> list[list[str]]:
    rows = []
    for replica, entry in sorted(stats.get("replicas", {}).items()):
        w = entry["windows"][window]
        latency = [_fmt(w["latency_s"][q], "s") for q in ("p50", "p95")]
        rate = _fmt(w["hit_rate"], "%")
        rows.append([replica, str(w["requests"]), rate, *latency, str(w["errors"])])
    return rows


def render(stats: dict[str, Any], window: str) -> str:
    w = stats["windows"][window]
    route_headers = ["route", "tenant", "requests", "exact", "semantic", "miss", "bypass"]
    tier_headers = ["tier", "model", "requests", "tok in", "tok out", "p50", "p95", "p99"]
    tier_headers += ["ttft p50", "errors", "failed", "fallbacks", "cooldowns", "cost"]
    engine_headers = ["engine", "running", "waiting", "kv used", "prefix hits", "preempted"]
    return "\n\n".join(
        [
            _summary(w, window),
            table([*route_headers, "refused", "hit rate"], _route_rows(w), left=2),
            table(["tenant", "key", "spent"], _spend_rows(w), left=2),
            table(tier_headers, _tier_rows(w), left=2),
            table(engine_headers, _engine_rows(stats, w)),
            *_fleet_part(stats, window),
        ]
    )


def _fleet_part(stats: dict[str, Any], window: str) -> list[str]:
    """With several gateway replicas: the figures above are their sum; each one's here."""
    fleet = stats.get("fleet") or {}
    if fleet.get("error"):
        return [f"replicas: {fleet['error']}"]
    if fleet.get("replicas", 1) < 2:
        return []
    headers = ["replica", "requests", "hit rate", "p50", "p95", "errors"]
    return [table(headers, _replica_rows(stats, window))]
