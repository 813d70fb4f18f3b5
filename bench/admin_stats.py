"""What the admin view costs the gateway: memory of an hour of snapshots, time per poll.

A synthetic registry (60 route x tenant pairs with cache outcomes, 3 tiers with statuses,
tokens, cost and latency histograms) gets one snapshot every 5 s for an hour. Measured in
one run, each against its baseline:
- memory of the ring: snapshots packed as float arrays (ours) vs one dict of label
  tuples per snapshot (the plain way);
- one GET /admin/stats computation (3 windows + 10 minutes of chart intervals): warm
  (intervals between stored snapshots memoized, what every poll after the first costs)
  vs cold (every interval computed, what each poll would cost without the memo).
The view runs on the event loop, so its time is time no request is served.

    python -m bench.admin_stats [--quick]
"""

import argparse
import sys
import time
from collections import deque

from bench import common
from engine.entrypoints.openai.protocol import Usage
from gateway.policy import Price
from gateway.stats.counters import Stats, read_samples
from gateway.stats.history import StatsHistory
from gateway.stats.view import stats_view

PRICE = Price(input=1.0, output=2.0)
OUTCOMES = ("exact", "semantic", "miss", "bypass")


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of an object and all it holds, each object once; strings are left out (label
    values are the registry's own strings in both layouts)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, str):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | deque):
        size += sum(deep_size(item, seen) for item in obj)
    elif hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def traffic(stats: Stats, step: int, tenants: int) -> None:
    for t in range(tenants):
        for route in ("auto", "code", "-"):
            stats.tenant_request(route, f"tenant-{t}")
            stats.cache_lookup(route, f"tenant-{t}", OUTCOMES[step % 4], step % 2)
    for tier in ("small", "large", "premium"):
        for status in (200, 429, 502):
            stats.request_done("auto", tier, f"{tier}-model", status)
        stats.usage(tier, f"{tier}-model", Usage.of(100, 20), PRICE)
        stats.latency(tier, 0.05 * (1 + step % 7))
        stats.first_token(tier, 0.02 * (1 + step % 5))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 tenants instead of 60")
    args = p.parse_args()
    tenants = 20 if args.quick else 60
    snapshots = 721  # an hour at the default 5 s, plus the start

    stats, clock = Stats(), [1_000_000.0]
    for step in range(4):  # every label set exists before measuring
        traffic(stats, step, tenants)
    history = StatsHistory(lambda: read_samples(stats.registry), clock=lambda: clock[0])
    plain = []
    for step in range(snapshots):
        clock[0] += 5.0
        traffic(stats, step, tenants)
        history.take()
        plain.append(read_samples(stats.registry))
    packed_bytes = deep_size(history._ring) + deep_size(history._keys.__dict__)
    plain_bytes = deep_size(plain)
    samples = sum(map(len, plain[-1].values()))
    del plain

    clock[0] += 2.0
    prices = {("premium", "premium-model"): PRICE}
    top = ("premium", PRICE)
    cold, warm = [], []
    for _ in range(5):
        history.derived.clear()
        start = time.perf_counter()
        stats_view(history, prices, top, {})
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        stats_view(history, prices, top, {})
        warm.append(time.perf_counter() - start)

    result = {
        "cpu_model": common.cpu_model(),
        "samples_per_snapshot": samples,
        "snapshots": snapshots,
        "ring_memory_mb": {
            "packed": round(packed_bytes / 1e6, 2),
            "baseline_dicts": round(plain_bytes / 1e6, 2),
            "ratio": common.ratio(packed_bytes, plain_bytes),
        },
        "view_seconds": {
            "warm_median": round(common.median(warm), 4),
            "baseline_cold_median": round(common.median(cold), 4),
            "ratio": common.ratio(common.median(warm), common.median(cold)),
        },
    }
    print(result)
    common.write_result("admin_stats", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
