"""Capacity model: how many replicas of each component a load needs, from measured figures.

Reads the benchmarks' JSON (bench/results/ or --results DIR):
  gateway_overhead.json  gateway CPU per request with the cache off (stub backend)
  redis_usage.json       gateway CPU, Redis commands, bytes, CPU and memory per cache miss
                         and per cache hit (cache in Redis; a hit is costed as a semantic one)
  throughput.json        engine output tokens per CPU-second (our engine, the small model)
  cache_lookup.json      gateway memory per cached entry (FAISS index and entry, RSS)
and, for a load (requests/s, hit rate, tokens per answer), prints and writes
bench/results/capacity.json: per component what one replica serves, how many replicas and
cores the load needs (each planned to `--utilisation` of its measured capacity), and which
component saturates first (the one whose single replica serves the fewest requests/s).

Assumptions: CPU cost scales linearly with cores within a replica (the measurements ran on
few cores of a shared machine: treat results as an order of magnitude, and re-measure on
your hardware); a Redis instance runs commands on one core; every gateway replica holds
the whole semantic index (replicas keep their FAISS indexes in step from Redis).

    python -m bench.capacity [--rps 1000] [--hit-rate 0.4] [--output-tokens 200]
                             [--gateway-cores 2] [--engine-cores 16] [--markdown]
"""

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import common


@dataclass(frozen=True)
class Figures:
    """Per-request costs, as measured; `sources` names the file and CPU of each."""

    gateway_cpu_ms_cache_off: float
    gateway_cpu_ms_miss: float  # cache on (Redis): lookup, backend call, store
    gateway_cpu_ms_hit: float
    redis_cpu_ms: dict[str, float]  # "miss" / "hit"
    redis_commands: dict[str, float]
    redis_net_bytes: dict[str, float]  # in + out
    redis_bytes_per_entry: float
    engine_tokens_per_s_per_core: dict[str, float]  # by model
    index_bytes_per_entry: float
    sources: dict[str, str]


@dataclass(frozen=True)
class Load:
    requests_per_s: float = 1000.0
    hit_rate: float = 0.4
    output_tokens: int = 200  # per answer the engine generates (a miss)
    model: str = common.MODEL
    gateway_cores: int = 2  # per gateway replica
    engine_cores: int = 16  # per engine replica
    utilisation: float = 0.7  # share of a replica's measured capacity to plan for
    cache_entries: int = 100_000  # live entries (the policy's cache.max_entries)


@dataclass(frozen=True)
class Row:
    component: str
    per_request: str  # the measured cost at this hit rate, in words
    replica_rps: float  # requests/s one replica serves at full use
    replicas: int  # for the load, at `utilisation`
    cores: int
    memory_bytes: float | None = None  # per replica, where it grows with the cache


# ---------------------------------------------------------------- reading the results


def _read(results: Path, name: str) -> dict[str, Any]:
    path = results / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"capacity: {path} missing: run `python -m bench.{name}` first")
    return json.loads(path.read_text())


def _source(name: str, data: dict[str, Any]) -> str:
    machine = data.get("machine", {})
    cpu = data.get("cpu_model") or machine.get("cpu_model") or "CPU not recorded"
    return f"{name}.json ({cpu}, {machine.get('time', 'time not recorded')})"


def load_figures(results: Path) -> Figures:
    overhead = _read(results, "gateway_overhead")
    redis_use = _read(results, "redis_usage")
    tput = _read(results, "throughput")
    lookup = _read(results, "cache_lookup")
    # A hit costs what a semantic hit costs (embedding, search, verifier): an exact repeat
    # is cheaper, so this errs on the safe side. Older results have exact hits only.
    phases = {"miss": redis_use["miss"], "hit": redis_use.get("semantic_hit", redis_use["hit"])}
    largest = lookup["sizes"][str(max(int(n) for n in lookup["sizes"]))]
    model = tput.get("workload", {}).get("model", common.MODEL)
    ours = tput["ours"]
    # Tokens per CPU-second where recorded: the wall clock of a shared machine understates
    # what a core does (others' load stretches it); else tokens/s over the threads used.
    per_core = ours.get("tokens_per_cpu_s") or ours["tokens_per_s"] / tput["workload"]["threads"]
    return Figures(
        gateway_cpu_ms_cache_off=overhead["throughput_c16"]["tiergate"]["cpu_ms_per_request"],
        gateway_cpu_ms_miss=phases["miss"]["gateway_cpu_ms_per_request"],
        gateway_cpu_ms_hit=phases["hit"]["gateway_cpu_ms_per_request"],
        redis_cpu_ms={p: v["redis_cpu_ms_per_request"] for p, v in phases.items()},
        redis_commands={p: v["redis_commands_per_request"] for p, v in phases.items()},
        redis_net_bytes={
            p: v["redis_net_in_bytes_per_request"] + v["redis_net_out_bytes_per_request"]
            for p, v in phases.items()
        },
        # Redis's MEMORY USAGE of the entries and their LRU set, per entry.
        redis_bytes_per_entry=redis_use["cache_memory"]["bytes_per_entry"],
        engine_tokens_per_s_per_core={model: per_core},
        index_bytes_per_entry=largest["rss_bytes_per_entry"],
        sources={
            n: _source(n, d)
            for n, d in [
                ("gateway_overhead", overhead),
                ("redis_usage", redis_use),
                ("throughput", tput),
                ("cache_lookup", lookup),
            ]
        },
    )


# ---------------------------------------------------------------- the arithmetic


def mix(load: Load, hit: float, miss: float) -> float:
    """A per-request cost at the load's hit rate."""
    return load.hit_rate * hit + (1 - load.hit_rate) * miss


def replicas_for(load: Load, replica_rps: float) -> int:
    return max(1, math.ceil(load.requests_per_s / (replica_rps * load.utilisation)))


def plan(fig: Figures, load: Load) -> list[Row]:
    if load.model not in fig.engine_tokens_per_s_per_core:
        known = ", ".join(fig.engine_tokens_per_s_per_core)
        raise SystemExit(f"capacity: no engine throughput measured for {load.model} ({known})")
    return [
        _gateway(fig, load),
        _gateway_cache_off(fig, load),
        _engine(fig, load),
        _redis(fig, load),
    ]


def _gateway(fig: Figures, load: Load) -> Row:
    cpu_ms = mix(load, fig.gateway_cpu_ms_hit, fig.gateway_cpu_ms_miss)
    rps = load.gateway_cores * 1000 / cpu_ms
    n = replicas_for(load, rps)
    memory = load.cache_entries * fig.index_bytes_per_entry
    words = f"{cpu_ms:.2f} CPU ms (hit {fig.gateway_cpu_ms_hit}, miss {fig.gateway_cpu_ms_miss})"
    return Row("gateway, cache on", words, rps, n, n * load.gateway_cores, memory)


def _gateway_cache_off(fig: Figures, load: Load) -> Row:
    """For comparison: no cache, so also no hits (every request reaches an engine)."""
    rps = load.gateway_cores * 1000 / fig.gateway_cpu_ms_cache_off
    n = replicas_for(load, rps)
    words = f"{fig.gateway_cpu_ms_cache_off} CPU ms"
    return Row("gateway, cache off", words, rps, n, n * load.gateway_cores)


def _engine(fig: Figures, load: Load) -> Row:
    tokens_per_request = (1 - load.hit_rate) * load.output_tokens  # hits generate nothing
    per_core = fig.engine_tokens_per_s_per_core[load.model]
    rps = per_core * load.engine_cores / tokens_per_request if tokens_per_request else math.inf
    n = replicas_for(load, rps)
    words = f"{tokens_per_request:.0f} tokens at {per_core:.0f} tokens/s per core"
    return Row(f"engine ({load.model})", words, rps, n, n * load.engine_cores)


def _redis(fig: Figures, load: Load) -> Row:
    cpu_ms = mix(load, fig.redis_cpu_ms["hit"], fig.redis_cpu_ms["miss"])
    commands = mix(load, fig.redis_commands["hit"], fig.redis_commands["miss"])
    net = mix(load, fig.redis_net_bytes["hit"], fig.redis_net_bytes["miss"])
    rps = 1000 / cpu_ms  # one instance: commands run on one core
    n = replicas_for(load, rps)
    memory = load.cache_entries * fig.redis_bytes_per_entry / n  # entries spread over shards
    words = f"{commands:.1f} commands, {net:.0f} bytes, {cpu_ms:.3f} CPU ms"
    return Row("redis (instances/shards)", words, rps, n, n, memory)


def per_core_rps(row: Row) -> float:
    return row.replica_rps * row.replicas / row.cores


def saturates_first(rows: list[Row]) -> str:
    """The component (cache on) that serves the fewest requests/s per core it is given."""
    serving = [r for r in rows if r.component != "gateway, cache off"]
    return min(serving, key=per_core_rps).component


# ---------------------------------------------------------------- output


def markdown(rows: list[Row], load: Load) -> str:
    head = (
        f"Load: {load.requests_per_s:g} requests/s, {load.hit_rate:.0%} cache hits, "
        f"{load.output_tokens} tokens per answer; gateway replicas of {load.gateway_cores} "
        f"cores, engine replicas of {load.engine_cores} cores, planned at "
        f"{load.utilisation:.0%} of capacity, {load.cache_entries:,} cached entries.\n\n"
        "| component | per request | one replica serves | per core | replicas | cores "
        "| memory per replica |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = [
        f"| {r.component} | {r.per_request} | {r.replica_rps:,.1f} req/s "
        f"| {per_core_rps(r):,.1f} req/s | {r.replicas} "
        f"| {r.cores} | {_mib(r.memory_bytes)} |"
        for r in rows
    ]
    redis = next(r for r in rows if r.component.startswith("redis"))
    tail = (
        f"\n\nSaturates first: {saturates_first(rows)}. One Redis serves "
        f"{redis.replica_rps:,.0f} requests/s at this mix (cache and limits together; "
        "`limits.redis_url` can put the limits on a second one): the ceiling of one "
        "deployment, since neither is sharded.\n"
    )
    return head + "\n".join(lines) + tail


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value / 2**20:,.0f} MiB"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Load]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    d = Load()
    p.add_argument("--results", type=Path, default=common.RESULTS_DIR)
    p.add_argument("--rps", type=float, default=d.requests_per_s)
    p.add_argument("--hit-rate", type=float, default=d.hit_rate)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--model", default=d.model)
    p.add_argument("--gateway-cores", type=int, default=d.gateway_cores)
    p.add_argument("--engine-cores", type=int, default=d.engine_cores)
    p.add_argument("--utilisation", type=float, default=d.utilisation)
    p.add_argument("--cache-entries", type=int, default=d.cache_entries)
    p.add_argument("--markdown", action="store_true", help="print only the markdown table")
    args = p.parse_args(argv)
    load = Load(
        args.rps,
        args.hit_rate,
        args.output_tokens,
        args.model,
        args.gateway_cores,
        args.engine_cores,
        args.utilisation,
        args.cache_entries,
    )
    return args, load


def main(argv: list[str] | None = None) -> int:
    args, load = parse_args(argv)
    figures = load_figures(args.results)
    rows = plan(figures, load)
    table = markdown(rows, load)
    if args.markdown:
        print(table, end="")
        return 0
    print(table)
    print("measured in: " + "; ".join(figures.sources.values()))
    faiss_per_million = figures.index_bytes_per_entry * 1e6 / 2**30
    print(f"gateway memory per million cached entries: {faiss_per_million:.2f} GiB")
    out = args.results / "capacity.json"  # beside the figures it was derived from
    body = {
        "benchmark": "capacity",
        "machine": common.machine_info(),
        "load": asdict(load),
        "figures": asdict(figures),
        "rows": [asdict(r) for r in rows],
        "saturates_first": saturates_first(rows),
        "index_gib_per_million_entries": round(faiss_per_million, 3),
    }
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
